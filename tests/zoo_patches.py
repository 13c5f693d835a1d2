"""Real third-party models, the causes their audits must report, and the library edits that
confirm each cause (shared by tests/test_zoo.py and benchmarks/zoo_causes.py).

A cause is named by the library line that a user would change: its file relative to
site-packages and its text, so a release that only shifts lines keeps matching. Each cause
comes with its fix, applied in memory: the line rewritten inside its function, compiled under
the library's own file name and line numbers (so an audit of the patched model still names the
library's lines), or a function or module swapped. A cause is confirmed when its fix makes it
vanish and the model computes the same values.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import inspect
import linecache
import re
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pandas as pd
import torch
import torch.nn as nn
import torch.nn.functional as F

CL, CL3 = torch.channels_last, torch.channels_last_3d


# -- where a cause is ------------------------------------------------------------------------------


def library_path(path: str) -> str:
    """``path`` relative to the site-packages (or dist-packages) folder that holds it."""
    return re.split(r"[\\/](?:site|dist)-packages[\\/]", path)[-1]


def source_key(source: str) -> tuple[str, str]:
    """(file relative to site-packages, the line's text) of an audit's ``path:line``."""
    path, _, line = source.rpartition(":")
    return library_path(path), linecache.getline(path, int(line)).strip()


def cause_keys(causes: pd.DataFrame) -> set[tuple[str, str, str, str]]:
    """(pattern, phase, file, line text) of every row of ``Audit.causes()``."""
    return {(r.pattern, r.phase, *source_key(r.source)) for r in causes.itertuples()}


# -- fixes -------------------------------------------------------------------------------------------


def _resolve(owner: str):
    module, _, attr = owner.partition(":")
    obj = importlib.import_module(module)
    for part in filter(None, attr.split(".")):
        obj = getattr(obj, part)
    return obj


@dataclass(frozen=True)
class Edit:
    """Replace the text ``old`` (found exactly once) by ``new`` in the function ``owner.attr``;
    ``new`` has at most as many lines as ``old`` and is padded with blank lines, so every line
    after it keeps its number."""

    owner: str  # "package.module:Class" or "package.module"
    attr: str
    old: str
    new: str

    def __post_init__(self):
        if self.new.count("\n") > self.old.count("\n"):
            raise ValueError(f"{self.attr}: an edit may not add lines")


@dataclass(frozen=True)
class Rebind:
    """Rebind the module-level function ``owner.attr`` to ``to``."""

    owner: str
    attr: str
    to: Callable


@dataclass(frozen=True)
class Swap:
    """Replace, inside the model, every submodule for which ``match`` holds by ``wrap(it)``."""

    match: Callable[[nn.Module], bool]
    wrap: Callable[[nn.Module], nn.Module]


Fix = Edit | Rebind | Swap


def _compiled(fn, edits: list[Edit]):
    """``fn`` with the edits applied, compiled under its own file name and line numbers."""
    lines, first = inspect.getsourcelines(fn)
    text = "".join(lines)
    for e in edits:
        if text.count(e.old) != 1:
            raise ValueError(f"{fn.__qualname__}: {e.old!r} found {text.count(e.old)} times (library changed?)")
        text = text.replace(e.old, e.new + "\n" * (e.old.count("\n") - e.new.count("\n")))
    tree = ast.parse(textwrap.dedent(text))
    ast.increment_lineno(tree, first - 1)
    scope: dict = {}
    exec(compile(tree, fn.__code__.co_filename, "exec"), fn.__globals__, scope)
    return scope[fn.__name__]


@contextlib.contextmanager
def _set(obj, attr: str, value) -> Iterator[None]:
    old = obj.__dict__[attr] if isinstance(obj, type) else getattr(obj, attr)
    setattr(obj, attr, value)
    try:
        yield
    finally:
        setattr(obj, attr, old)


@contextlib.contextmanager
def patched(fixes, *models: nn.Module) -> Iterator[None]:
    """Apply ``fixes`` (to ``models``, for swaps) for the duration; edits of one function are
    applied together, to its original text."""
    edits: dict[tuple[str, str], list[Edit]] = {}
    for f in fixes:
        if isinstance(f, Edit) and f not in edits.get((f.owner, f.attr), []):
            edits.setdefault((f.owner, f.attr), []).append(f)
    with contextlib.ExitStack() as stack:
        for (owner, attr), group in edits.items():
            obj = _resolve(owner)
            fn = obj.__dict__[attr] if isinstance(obj, type) else getattr(obj, attr)
            stack.enter_context(_set(obj, attr, _compiled(fn, group)))
        for f in dict.fromkeys(f for f in fixes if not isinstance(f, Edit)):
            if isinstance(f, Rebind):
                stack.enter_context(_set(_resolve(f.owner), f.attr, f.to))
            else:
                for model in models:
                    for name, m in list(model.named_modules()):
                        if name and f.match(m):
                            parent, _, child = name.rpartition(".")
                            stack.enter_context(_set(model.get_submodule(parent), child, f.wrap(m)))
        yield


# -- the fixes themselves ----------------------------------------------------------------------------

#: A global average pool whose backward keeps the format: avg_pool2d's backward writes the
#: gradient in its input's format; a mean's backward (expand, then div) writes it contiguous.
AVG_POOL = "nn.functional.avg_pool2d(x, x.shape[-2:])"


def _se_pool(owner: str) -> Edit:
    return Edit(owner, "forward", "x.mean((2, 3), keepdim=True)", AVG_POOL)


class TemporalConv(nn.Module):
    """A Conv3d with a (k, 1, 1) kernel and (s, 1, 1) stride computed as a Conv2d over (T, H·W):
    the same sums, on a view of the channels_last_3d input that has a channels_last kernel."""

    def __init__(self, conv: nn.Conv3d):
        super().__init__()
        self.conv = conv

    def forward(self, x):
        c = self.conv
        n, _, _, h, w = x.shape
        y = F.conv2d(x.flatten(3), c.weight.flatten(3), c.bias, (c.stride[0], 1), (c.padding[0], 0),
                     (c.dilation[0], 1), c.groups)
        return y.unflatten(3, (h, w))


def _temporal(m: nn.Module) -> bool:
    return (isinstance(m, nn.Conv3d) and m.kernel_size[1:] == (1, 1) and m.kernel_size[0] > 1
            and m.stride[1:] == (1, 1) and m.padding[1:] == (0, 0))


FIXES = {
    "effnet_se": _se_pool("timm.models._efficientnet_blocks:SqueezeExcite"),
    "timm_se": _se_pool("timm.layers.squeeze_excite:SEModule"),
    "timm_head_pool": Edit(
        "timm.layers.adaptive_avgmax_pool:SelectAdaptivePool2d", "forward", "x = self.pool(x)",
        f"x = {AVG_POOL} if isinstance(self.pool, nn.AdaptiveAvgPool2d) and self.pool.output_size in (1, (1, 1)) "
        "else self.pool(x)"),
    # split's backward is a cat, which keeps the format; a slice's backward writes contiguous zeros
    "rexnet_split": Edit(
        "timm.models.rexnet:LinearBottleneck", "forward",
        "x = torch.cat([x[:, 0:self.in_channels] + shortcut, x[:, self.in_channels:]], dim=1)",
        "xa, xb = x.split([self.in_channels, x.shape[1] - self.in_channels], dim=1); "
        "x = torch.cat([xa + shortcut, xb], dim=1)"),
    # a slice that keeps every channel is the tensor itself (where its backward writes contiguous)
    "ghost_slice": Edit("timm.models.ghostnet:GhostModule", "forward",
                        "return out[:, :self.out_chs, :, :]",
                        "return out if out.shape[1] == self.out_chs else out[:, :self.out_chs, :, :]"),
    # autograd copies the gradient of a view written in place into contiguous order
    "ghost_add": Edit("timm.models.ghostnet:GhostBottleneck", "forward",
                      "x += self.shortcut(shortcut)", "x = x + self.shortcut(shortcut)"),
    # a sum over the stacked paths writes contiguous; adding the paths keeps channels_last
    "sk_sum": Edit("timm.layers.selective_kernel:SelectiveKernel", "forward",
                   "x = x * x_attn\n        x = torch.sum(x, dim=1)",
                   "x_attn = x_attn.unbind(1)\n"
                   "        x = sum((p * a for p, a in zip(x_paths[1:], x_attn[1:])), x_paths[0] * x_attn[0])"),
    "sk_attn_sum": Edit("timm.layers.selective_kernel:SelectiveKernelAttn", "forward",
                        "x = x.sum(1)", "xs = x.unbind(1); x = sum(xs[1:], xs[0])"),
    "sk_attn_pool": Edit("timm.layers.selective_kernel:SelectiveKernelAttn", "forward",
                         ".mean((2, 3), keepdim=True)", f"; x = {AVG_POOL}"),
    "csp_contiguous": Edit("timm.models.cspnet:CrossStage", "forward",
                           "xb = self.conv_transition_b(xb).contiguous()", "xb = self.conv_transition_b(xb)"),
    # weight standardisation on the channels_last parameter flattened in its memory order (a view,
    # where reshaping it in logical order copies it contiguous), permuted back: the same batch_norm
    "scaled_std_conv": Edit(
        "timm.layers.std_conv:ScaledStdConv2d", "forward",
        """weight = F.batch_norm(
            self.weight.reshape(1, self.out_channels, -1),
            None,  # running_mean
            None,  # running_var
            weight=(self.gain * self.scale).view(-1),
            training=True,
            momentum=0.,
            eps=self.eps,
        ).reshape_as(self.weight)""",
        "w = self.weight.permute(0, 2, 3, 1)\n"
        "        weight = F.batch_norm(w.reshape(1, self.out_channels, -1), None, None, "
        "weight=(self.gain * self.scale).view(-1), training=True, momentum=0., eps=self.eps)"
        ".reshape(w.shape).permute(0, 3, 1, 2)"),
    "aspp_pool": Edit("segmentation_models_pytorch.decoders.deeplabv3.decoder:ASPPPooling", "forward",
                      "x = mod(x)", f"x = {AVG_POOL} if isinstance(mod, nn.AdaptiveAvgPool2d) else mod(x)"),
    # upsampling an N x C x 1 x 1 map writes contiguous; its expansion written once keeps the format
    "aspp_expand": Edit("segmentation_models_pytorch.decoders.deeplabv3.decoder:ASPPPooling", "forward",
                        'return F.interpolate(x, size=size, mode="bilinear", align_corners=False)',
                        "return x.expand(-1, -1, *size).contiguous(memory_format=torch.channels_last)"),
    "fpn_add": Edit("segmentation_models_pytorch.decoders.fpn.decoder:MergeBlock", "forward",
                    "output = torch.stack(x).sum(dim=0)", "output = sum(x[1:], x[0])"),
    "native_shuffle": Rebind("torchvision.models.shufflenetv2", "channel_shuffle", F.channel_shuffle),
    "diffusers_contiguous": Edit("diffusers.models.resnet:ResnetBlock2D", "forward",
                                 "if self.training:\n                input_tensor = input_tensor.contiguous()",
                                 "if self.training:\n"
                                 "                input_tensor = input_tensor.contiguous(memory_format=torch.channels_last)"),
    # group norm of the (B, C, 1, HW) map, which has a channels_last kernel, not of (B, C, HW)
    "diffusers_group_norm": Edit(
        "diffusers.models.attention_processor:AttnProcessor2_0", "__call__",
        "hidden_states = attn.group_norm(hidden_states.transpose(1, 2)).transpose(1, 2)",
        "hidden_states = attn.group_norm(hidden_states.transpose(1, 2).unsqueeze(2)).squeeze(2).transpose(1, 2)"),
    "temporal_conv2d": Swap(_temporal, TemporalConv),
    # the attention output (v @ attn^T, a row-major (B, d, N)) written as the transpose of
    # attn @ v^T: the (B, d, H, W) map it is viewed as is channels_last; the same sums
    "efficientvit_attn_out": Edit("timm.models.efficientvit_msra:CascadedGroupAttention", "forward",
                                  "feat = v @ attn.transpose(-2, -1)",
                                  "feat = (attn @ v.transpose(-2, -1)).transpose(-2, -1)"),
    # linear attention's output heads folded into the map from NHWC: the reshape copies tokens
    # (a copy made in any layout) and the map is a channels_last view of them
    "efficientvit_mla_out": Edit("timm.models.efficientvit_mit:LiteMLA", "forward",
                                 "out = out.transpose(-1, -2).reshape(B, -1, H, W)",
                                 "out = out.permute(0, 2, 1, 3).reshape(B, H, W, -1).permute(0, 3, 1, 2)"),
    # q, k, v split from the NHWC view of the map (a view of a channels_last map): the backward
    # of the reshape copies the tokens' gradient into NHWC order, a channels_last map
    "efficientvit_mla_qkv": Edit(
        "timm.models.efficientvit_mit:LiteMLA", "forward",
        "multi_scale_qkv = multi_scale_qkv.reshape(B, -1, 3 * self.dim, H * W).transpose(-1, -2)",
        "multi_scale_qkv = multi_scale_qkv.permute(0, 2, 3, 1).reshape(B, H * W, -1, 3 * self.dim).transpose(1, 2)"),
    # MobileViT's unfold from the NHWC view: (B, n_h, p_h, n_w, p_w, C) permuted to the patches'
    # order and copied once as tokens (in any layout), where the NCHW reshape merged C with H
    "mobilevit_unfold": Edit(
        "timm.models.mobilevit:MobileVitBlock", "forward",
        """        x = x.reshape(B * C * num_patch_h, patch_h, num_patch_w, patch_w).transpose(1, 2)
        # [B * C * n_h, n_w, p_h, p_w] --> [BP, N, C] where P = p_h * p_w and N = n_h * n_w
        x = x.reshape(B, C, num_patches, self.patch_area).transpose(1, 3).reshape(B * self.patch_area, num_patches, -1)""",
        """        x = x.permute(0, 2, 3, 1).reshape(B, num_patch_h, patch_h, num_patch_w, patch_w, C).permute(0, 2, 4, 1, 3, 5)
        x = x.reshape(B * self.patch_area, num_patches, -1)"""),
    # and its fold into NHWC order, the map a channels_last view of it
    "mobilevit_fold": Edit(
        "timm.models.mobilevit:MobileVitBlock", "forward",
        """        x = x.contiguous().view(B, self.patch_area, num_patches, -1)
        x = x.transpose(1, 3).reshape(B * C * num_patch_h, num_patch_w, patch_h, patch_w)
        # [B*C*n_h, n_w, p_h, p_w] --> [B*C*n_h, p_h, n_w, p_w] --> [B, C, H, W]
        x = x.transpose(1, 2).reshape(B, C, num_patch_h * patch_h, num_patch_w * patch_w)""",
        """        x = x.contiguous().view(B, patch_h, patch_w, num_patch_h, num_patch_w, -1).permute(0, 3, 1, 4, 2, 5)
        x = x.reshape(B, num_patch_h * patch_h, num_patch_w * patch_w, C).permute(0, 3, 1, 2)"""),
}


@dataclass(frozen=True)
class Cause:
    """A cause an audit must report, and the fix that removes it."""

    pattern: str
    phase: str
    file: str  # relative to site-packages
    line: str  # the line's text, stripped
    fix: str  # a key of FIXES
    #: fixes of other causes that hide this one's effect until they are applied
    after: tuple[str, ...] = ()

    @property
    def key(self) -> tuple[str, str, str, str]:
        return self.pattern, self.phase, self.file, self.line


EFFNET_SE = ("timm/models/_efficientnet_blocks.py", "x_se = x.mean((2, 3), keepdim=True)")
TIMM_SE = ("timm/layers/squeeze_excite.py", "x_se = x.mean((2, 3), keepdim=True)")
HEAD_POOL = ("timm/layers/adaptive_avgmax_pool.py", "x = self.pool(x)")


# -- the models --------------------------------------------------------------------------------------


def full_slice_backward_writes_contiguous() -> bool:
    """Whether this torch's backward of a slice that keeps the whole dimension writes its
    gradient contiguous (a slice_backward into zeros, as torch 2.8 runs it) instead of passing
    the channels_last gradient through (an alias)."""
    leaf = torch.randn(2, 4, 3, 3).to(memory_format=torch.channels_last).requires_grad_()
    x = leaf * 1  # not a leaf: its gradient is what the slice's backward wrote, not a copy into the leaf's strides
    seen = []
    x.register_hook(seen.append)
    y = x[:, :4, :, :]
    y.backward(torch.ones_like(y))
    return not seen[0].is_contiguous(memory_format=torch.channels_last)


def _timm(name: str):
    def build():
        import timm

        return timm.create_model(name, pretrained=False)

    return build


def _smp(arch: str):
    def build():
        import segmentation_models_pytorch as smp

        return getattr(smp, arch)("resnet18", encoder_weights=None, classes=2)

    return build


def _torchvision(path: str):
    def build():
        import torchvision

        obj = torchvision.models
        for part in path.split("."):
            obj = getattr(obj, part)
        return obj(weights=None)

    return build


def _unet2d():
    from diffusers import UNet2DModel

    return UNet2DModel(sample_size=32, in_channels=3, out_channels=3, layers_per_block=1,
                       block_out_channels=(32, 64), norm_num_groups=8,
                       down_block_types=("DownBlock2D", "AttnDownBlock2D"),
                       up_block_types=("AttnUpBlock2D", "UpBlock2D"))


@dataclass(frozen=True)
class ZooModel:
    """A model as its library builds it (random weights), its input, and its causes."""

    name: str
    library: str
    build: Callable[[], nn.Module]
    shape: tuple[int, ...]
    causes: tuple[Cause, ...] = ()
    slow: bool = False
    #: torch threads for its audits and steps, where its causes depend on the kernels the count picks
    threads: int | None = None
    #: inputs after the image (a timestep)
    extra: Callable[[], tuple] = field(default=tuple)

    def make(self, memory_format=None, seed: int = 0):
        """(model in train mode, inputs), both in ``memory_format`` (channels_last or
        channels_last_3d by rank when None); the same seed gives the same weights and input."""
        torch.manual_seed(seed)
        model = self.build().train().to(memory_format=self._format(memory_format))
        return model, self.inputs(memory_format, seed)

    def inputs(self, memory_format=None, seed: int = 0, batch: int | None = None) -> tuple:
        """The inputs of :meth:`make`, with ``batch`` samples if given."""
        torch.manual_seed(seed + 1)
        x = torch.randn(batch or self.shape[0], *self.shape[1:])
        return x.contiguous(memory_format=self._format(memory_format)), *self.extra()

    def _format(self, memory_format):
        return memory_format or (CL if len(self.shape) == 4 else CL3)

    @property
    def fixes(self) -> list[Fix]:
        """The fixes of all its causes."""
        return [FIXES[name] for name in dict.fromkeys(c.fix for c in self.causes)]

    @contextlib.contextmanager
    def threads_set(self) -> Iterator[None]:
        """Run with ``threads`` torch threads, if set."""
        if self.threads is None:
            yield
            return
        before = torch.get_num_threads()
        torch.set_num_threads(self.threads)
        try:
            yield
        finally:
            torch.set_num_threads(before)


ZOO = [
    ZooModel("efficientnet_b0", "timm", _timm("efficientnet_b0"), (2, 3, 64, 64),
             (Cause("mean_backward", "backward", *EFFNET_SE, "effnet_se"),)),
    ZooModel("mobilenetv3_small_100", "timm", _timm("mobilenetv3_small_100"), (2, 3, 64, 64),
             (Cause("mean_backward", "backward", *EFFNET_SE, "effnet_se"),
              Cause("mean_backward", "backward", *HEAD_POOL, "timm_head_pool"))),
    ZooModel("rexnet_100", "timm", _timm("rexnet_100"), (2, 3, 64, 64),
             (Cause("mean_backward", "backward", *TIMM_SE, "timm_se"),
              Cause("channel_slice", "backward", "timm/models/rexnet.py",
                    "x = torch.cat([x[:, 0:self.in_channels] + shortcut, x[:, self.in_channels:]], dim=1)",
                    "rexnet_split"))),
    ZooModel("ghostnet_100", "timm", _timm("ghostnet_100"), (2, 3, 64, 64),
             # where the slice's backward writes contiguous, writing x in place is safe only once the
             # slice is skipped (alone, x = x + ... moves the slice's conversions to the batch norms):
             # skipping the slice, so that x is no view, removes both causes
             (Cause("inplace_view", "backward", "timm/models/ghostnet.py", "x += self.shortcut(shortcut)",
                    "ghost_slice" if full_slice_backward_writes_contiguous() else "ghost_add"),
              Cause("mean_backward", "backward", *EFFNET_SE, "effnet_se"))
             + ((Cause("no_cl_kernel", "backward", "timm/models/ghostnet.py", "return out[:, :self.out_chs, :, :]",
                       "ghost_slice"),) if full_slice_backward_writes_contiguous() else ())),
    ZooModel("skresnet18", "timm", _timm("skresnet18"), (2, 3, 64, 64),
             (Cause("stack_reduce", "forward", "timm/layers/selective_kernel.py", "x = torch.sum(x, dim=1)",
                    "sk_sum", after=("sk_attn_sum", "sk_attn_pool")),
              Cause("stack_reduce", "forward", "timm/layers/selective_kernel.py",
                    "x = x.sum(1).mean((2, 3), keepdim=True)", "sk_attn_sum"),
              Cause("mean_backward", "backward", "timm/layers/selective_kernel.py",
                    "x = x.sum(1).mean((2, 3), keepdim=True)", "sk_attn_pool", after=("sk_attn_sum",))),
             slow=True),
    ZooModel("cspresnet50", "timm", _timm("cspresnet50"), (2, 3, 64, 64),
             (Cause("explicit_copy", "forward", "timm/models/cspnet.py",
                    "xb = self.conv_transition_b(xb).contiguous()", "csp_contiguous"),)),
    ZooModel("nf_regnet_b0", "timm", _timm("nf_regnet_b0"), (2, 3, 64, 64),
             (Cause("weight_rebuilt", "forward", "timm/layers/std_conv.py",
                    "self.weight.reshape(1, self.out_channels, -1),", "scaled_std_conv"),
              Cause("mean_backward", "backward", *TIMM_SE, "timm_se"))),
    # No causes for edgenext_xx_small and convnext_atto: their last block's output is the permute
    # back of an NHWC Linear or LayerNorm, channels_last in any layout, and the head's mean
    # backward writes its gradient contiguous in any layout: the conversions where the two meet
    # (the residual add's backward, the convolutions' backward) happen with the same strides
    # when the model runs all-contiguous. Layout-independent conversions, not hotspots (an
    # avg_pool2d head, timm_head_pool, still saves them, in both layouts).
    ZooModel("edgenext_xx_small", "timm", _timm("edgenext_xx_small"), (2, 3, 64, 64)),
    # its MLP runs on an NHWC permute of the image and permutes back: channels followed through both
    ZooModel("convnext_atto", "timm", _timm("convnext_atto"), (2, 3, 64, 64)),
    ZooModel("res2net50_26w_4s", "timm", _timm("res2net50_26w_4s"), (2, 3, 64, 64)),
    ZooModel("smp_deeplabv3_resnet18", "segmentation_models_pytorch", _smp("DeepLabV3"), (2, 3, 64, 64),
             (Cause("nc11_broadcast", "forward", "segmentation_models_pytorch/decoders/deeplabv3/decoder.py",
                    'return F.interpolate(x, size=size, mode="bilinear", align_corners=False)', "aspp_expand"),
              Cause("mean_backward", "backward", "segmentation_models_pytorch/decoders/deeplabv3/decoder.py",
                    "x = mod(x)", "aspp_pool"))),
    ZooModel("smp_fpn_resnet18", "segmentation_models_pytorch", _smp("FPN"), (2, 3, 64, 64),
             (Cause("stack_reduce", "forward", "segmentation_models_pytorch/decoders/fpn/decoder.py",
                    "output = torch.stack(x).sum(dim=0)", "fpn_add"),)),
    ZooModel("smp_unet_resnet18", "segmentation_models_pytorch", _smp("Unet"), (2, 3, 64, 64)),
    ZooModel("shufflenet_v2_x0_5", "torchvision", _torchvision("shufflenet_v2_x0_5"), (2, 3, 64, 64),
             (Cause("channel_shuffle", "forward", "torchvision/models/shufflenetv2.py",
                    "x = torch.transpose(x, 1, 2).contiguous()", "native_shuffle"),)),
    ZooModel("r2plus1d_18", "torchvision", _torchvision("video.r2plus1d_18"), (4, 3, 4, 16, 16),
             (Cause("conv_no_kernel", "forward", "torchvision/models/video/resnet.py", "out = self.conv1(x)",
                    "temporal_conv2d"),
              Cause("conv_no_kernel", "forward", "torchvision/models/video/resnet.py", "out = self.conv2(out)",
                    "temporal_conv2d"),
              Cause("conv_no_kernel", "forward", "torchvision/models/video/resnet.py", "x = self.stem(x)",
                    "temporal_conv2d")),
             # at one thread a (k, 1, 1) Conv3d with a batch below 16 runs slow_conv3d, which
             # writes contiguous; oneDNN, picked with more threads, keeps channels_last_3d
             slow=True, threads=1),
    ZooModel("unet2d", "diffusers", _unet2d, (2, 3, 32, 32),
             (Cause("explicit_copy", "forward", "diffusers/models/resnet.py",
                    "input_tensor = input_tensor.contiguous()", "diffusers_contiguous"),
              # the group norm's backward writes the (B, C, HW) token gradient contiguous; it joins
              # the image path through a transpose and a reshape
              Cause("joins", "backward", "diffusers/models/attention_processor.py",
                    "hidden_states = attn.group_norm(hidden_states.transpose(1, 2)).transpose(1, 2)",
                    "diffusers_group_norm")),
             extra=lambda: (torch.tensor([10]),)),
    # -- conv and token hybrids -------------------------------------------------------------------
    # a gated MLP on the NHWC permute of the map, its Linear decomposed as view, addmm, view:
    # channels_last end to end, no cause (a negative control)
    ZooModel("mambaout_femto", "timm", _timm("mambaout_femto"), (2, 3, 64, 64)),
]

#: Conv and token hybrids whose causes are tokens joining the map (``joins``): real format
#: problems (each happens in the channels_last run only), whose fixes are candidates that only
#: verification on the model can prove, or by hand with the reason. They run every zoo test; the
#: verification's share of automatic fixes is taken over :data:`ZOO` and reported for these apart.
HYBRIDS = [
    # window attention: the map padded to whole windows in NHWC (its layout the code's, from
    # the pad on, in any format), the attention output a row-major (B, d, N) viewed as the map.
    # The three attention causes are that one layout: the output joins the cascade's next head
    # (:300), the projection after the cat (:303), and in backward the cat of q, k and v's
    # gradients (:297) reads theirs; written channels_last, the block's layouts are the code's,
    # and the backward cat that still converts does so in any layout (layout-independent)
    ZooModel("efficientvit_m0", "timm", _timm("efficientvit_m0"), (2, 3, 64, 64),
             (Cause("joins", "forward", "timm/models/efficientvit_msra.py", "feat = v @ attn.transpose(-2, -1)",
                    "efficientvit_attn_out"),
              Cause("joins", "forward", "timm/models/efficientvit_msra.py",
                    "x = self.proj(torch.cat(feats_out, 1))", "efficientvit_attn_out"),
              Cause("joins", "backward", "timm/models/efficientvit_msra.py", "attn = q.transpose(-2, -1) @ k",
                    "efficientvit_attn_out"),
              Cause("mean_backward", "backward", *TIMM_SE, "timm_se"))),
    # MobileViT: unfold (a reshape merging C with H: a copy of the channels_last map) and fold
    # (reshapes writing the map contiguous); the last stage's map is one patch, whose tokens
    # have the map's strides
    ZooModel("mobilevit_xxs", "timm", _timm("mobilevit_xxs"), (2, 3, 64, 64),
             (Cause("reshape_merge", "forward", "timm/models/mobilevit.py",
                    "x = x.reshape(B * C * num_patch_h, patch_h, num_patch_w, patch_w).transpose(1, 2)",
                    "mobilevit_unfold"),
              Cause("joins", "forward", "timm/models/mobilevit.py",
                    "x = x.transpose(1, 3).reshape(B * C * num_patch_h, num_patch_w, patch_h, patch_w)",
                    "mobilevit_fold"),
              Cause("joins", "forward", "timm/models/mobilevit.py",
                    "x = x.transpose(1, 2).reshape(B, C, num_patch_h * patch_h, num_patch_w * patch_w)",
                    "mobilevit_fold"))),
    # ReLU linear attention: the heads' output reshaped into the map (row-major, contiguous), and
    # in backward the gradient of q, k, v reshaped back from tokens
    ZooModel("efficientvit_b0", "timm", _timm("efficientvit_b0"), (2, 3, 64, 64),
             (Cause("joins", "forward", "timm/models/efficientvit_mit.py",
                    "out = out.transpose(-1, -2).reshape(B, -1, H, W)", "efficientvit_mla_out"),
              Cause("joins", "backward", "timm/models/efficientvit_mit.py",
                    "multi_scale_qkv = multi_scale_qkv.reshape(B, -1, 3 * self.dim, H * W).transpose(-1, -2)",
                    "efficientvit_mla_qkv"))),
]
