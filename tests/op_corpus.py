"""The op corpus: conv -> op -> conv, one case per op, to compare fake audits with real ones.

Each case is a small module: a convolution writes a channels_last image (8 channels, 8x8), the op
under test reads it, and a second convolution reads the op's result (its input channels asked of
the op on a meta tensor). A fake audit and a real one of the same case, forward and backward,
must give every output the same format (``tests/test_fake_kernels.py``; ``benchmarks/gpu_truth.py``
does the same on a GPU).
"""

from __future__ import annotations

import ast
import collections
from collections.abc import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

C, HW = 8, 8


def _channel_shuffle(x, groups=2):
    n, c, h, w = x.shape
    return x.view(n, groups, c // groups, h, w).transpose(1, 2).reshape(n, c, h, w)


def _channel_shuffle_contiguous(x, groups=2):
    """torchvision's shufflenet: view, transpose, contiguous, view."""
    n, c, h, w = x.shape
    return x.view(n, groups, c // groups, h, w).transpose(1, 2).contiguous().view(n, c, h, w)


def _identity_grid(x):
    theta = torch.eye(2, 3, device=x.device, dtype=x.dtype).expand(x.shape[0], 2, 3)
    return F.affine_grid(theta, list(x.shape), align_corners=False)


class _Holder(nn.Module):
    """Modules an op needs (norms, a depthwise conv), so their parameters are the model's."""

    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm2d(C)
        self.gn = nn.GroupNorm(2, C)
        self.inorm = nn.InstanceNorm2d(C, affine=True)
        self.ln = nn.LayerNorm([C, HW, HW])
        self.dw = nn.Conv2d(C, C, 3, padding=1, groups=C)
        self.tconv = nn.ConvTranspose2d(C, C, 2, stride=2)
        self.prelu = nn.PReLU(C)


#: name -> (op on x, holder) -> tensor
OPS: dict[str, Callable] = {
    "relu": lambda x, m: F.relu(x),
    "gelu": lambda x, m: F.gelu(x),
    "silu": lambda x, m: F.silu(x),
    "sigmoid": lambda x, m: torch.sigmoid(x),
    "tanh": lambda x, m: torch.tanh(x),
    "hardswish": lambda x, m: F.hardswish(x),
    "leaky_relu": lambda x, m: F.leaky_relu(x, 0.1),
    "elu": lambda x, m: F.elu(x),
    "hardtanh": lambda x, m: F.hardtanh(x),
    "prelu": lambda x, m: m.prelu(x),
    "add_self": lambda x, m: x + x,
    "mul_scalar": lambda x, m: x * 2.0,
    "clamp": lambda x, m: x.clamp(-1, 1),
    "batch_norm": lambda x, m: m.bn(x),
    "group_norm": lambda x, m: m.gn(x),
    "instance_norm": lambda x, m: m.inorm(x),
    "layer_norm_chw": lambda x, m: m.ln(x),
    "local_response_norm": lambda x, m: F.local_response_norm(x, 3),
    "max_pool2d": lambda x, m: F.max_pool2d(x, 2),
    "avg_pool2d": lambda x, m: F.avg_pool2d(x, 2),
    "adaptive_avg_pool2d": lambda x, m: F.adaptive_avg_pool2d(x, 3),
    "adaptive_max_pool2d": lambda x, m: F.adaptive_max_pool2d(x, 3),
    "interpolate_nearest": lambda x, m: F.interpolate(x, scale_factor=2, mode="nearest"),
    "interpolate_bilinear": lambda x, m: F.interpolate(x, scale_factor=2, mode="bilinear"),
    "interpolate_bicubic": lambda x, m: F.interpolate(x, scale_factor=2, mode="bicubic"),
    "pad_constant": lambda x, m: F.pad(x, (1, 1, 1, 1)),
    "pad_reflect": lambda x, m: F.pad(x, (1, 1, 1, 1), mode="reflect"),
    "pad_replicate": lambda x, m: F.pad(x, (1, 1, 1, 1), mode="replicate"),
    "pad_circular": lambda x, m: F.pad(x, (1, 1, 1, 1), mode="circular"),
    "roll_h": lambda x, m: torch.roll(x, 1, 2),
    "roll_w": lambda x, m: torch.roll(x, 1, 3),
    "flip_h": lambda x, m: torch.flip(x, (2,)),
    "channel_shuffle": lambda x, m: _channel_shuffle(x),
    "channel_shuffle_contiguous": lambda x, m: _channel_shuffle_contiguous(x),
    "channel_shuffle_op": lambda x, m: F.channel_shuffle(x, 2),  # nn.ChannelShuffle: one aten op
    "pixel_shuffle": lambda x, m: F.pixel_shuffle(x, 2),
    "pixel_unshuffle": lambda x, m: F.pixel_unshuffle(x, 2),
    "cat_channels": lambda x, m: torch.cat([x, x * 2], 1),
    "split_cat": lambda x, m: torch.cat(list(x.chunk(2, 1))[::-1], 1),
    "slice_h": lambda x, m: x[:, :, 1:-1],
    "permute_round_trip": lambda x, m: x.permute(0, 2, 3, 1).permute(0, 3, 1, 2) * 1.0,
    "softmax_channels": lambda x, m: torch.softmax(x, 1),
    "grid_sample": lambda x, m: F.grid_sample(x, _identity_grid(x), align_corners=False),
    "depthwise_conv": lambda x, m: m.dw(x),
    "conv_transpose": lambda x, m: m.tconv(x),
    "squeeze_excite": lambda x, m: x * torch.sigmoid(F.adaptive_avg_pool2d(x, 1)),
    "transpose_hw": lambda x, m: x.transpose(2, 3) * 1.0,
    "roll_hw": lambda x, m: torch.roll(x, (1, 2), (2, 3)),
    "dropout": lambda x, m: F.dropout(x, 0.1),
}


class Case(nn.Module):
    """conv -> OPS[name] -> conv."""

    def __init__(self, name: str):
        super().__init__()
        self.name = name
        self.op = OPS[name]
        self.first = nn.Conv2d(C, C, 3, padding=1)
        self.held = _Holder()
        with torch.no_grad():
            probe = self.op(torch.empty(1, C, HW, HW, device="meta"), _MetaHolder())
        self.second = nn.Conv2d(probe.shape[1], 4, 3, padding=1)

    def forward(self, x):
        return self.second(self.op(self.first(x), self.held))


class _MetaHolder:
    """The holder on the meta device, for asking an op its output shape without weights."""

    def __getattr__(self, name):
        held = _META_HOLDER.setdefault("m", _Holder().to("meta"))
        return getattr(held, name)


_META_HOLDER: dict = {}


def case(name: str, device="cpu", dtype=torch.float32, batch: int = 2) -> tuple[nn.Module, torch.Tensor]:
    """The model and its channels_last input for one case."""
    torch.manual_seed(0)
    model = Case(name).to(device=device, dtype=dtype).to(memory_format=torch.channels_last)
    x = torch.randn(batch, C, HW, HW, device=device, dtype=dtype).to(memory_format=torch.channels_last)
    return model, x


def output_formats(audit) -> dict[str, collections.Counter]:
    """Per phase, how many times each (op, formats of its results) occurs, leaving out
    autograd's detaches and the events whose results are all views (they move no data, and a
    composite op may slice in another order in its fake decomposition, as circular pad does)."""
    t = audit.tensors
    out = t[t["role"] == "output"]
    formats: dict[int, list[str]] = collections.defaultdict(list)
    for seq, fmt in zip(out["seq"].to_numpy(), out["format"].astype(str)):
        formats[int(seq)].append(fmt)
    seen: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    ev = audit.events
    for seq, op, phase in zip(ev["seq"].to_numpy(), ev["op"].astype(str), ev["phase"].astype(str)):
        fmts = tuple(formats.get(int(seq), ()))
        if op == "aten.detach.default" or (fmts and all(f.endswith("_view") for f in fmts)):
            continue
        seen[phase][(op, fmts)] += 1
    return dict(seen)


def disagreement(real, fake) -> list[str]:
    """What differs between two audits' output formats (empty: they agree)."""
    a, b = output_formats(real), output_formats(fake)
    out = []
    for phase in sorted(set(a) | set(b)):
        ra, fb = a.get(phase, collections.Counter()), b.get(phase, collections.Counter())
        out += [f"{phase}: real only {k} x{n}" for k, n in (ra - fb).items()]
        out += [f"{phase}: fake only {k} x{n}" for k, n in (fb - ra).items()]
    return out


def kernel_formats(audit) -> dict[str, collections.Counter]:
    """Per phase, how many times each (op, strides of its results but on dimensions of size 1)
    occurs, over the ops whose results' strides a kernel chooses: ops that write new tensors (no
    view, no in-place or out= op: their strides follow their arguments'), with a result of 3 or
    more dimensions. Autograd
    replays an in-place write into a view differently for fake tensors (an ``alias`` and
    ``as_strided_`` where real tensors get ``as_strided`` and ``copy_``); those views and writes
    are left out, the kernels' results are all compared."""
    from auditor._recording._probe import returns_fresh

    t = audit.tensors
    out = t[t["role"] == "output"]
    results: dict[int, list] = collections.defaultdict(list)
    for seq, shape, strides in zip(out["seq"].to_numpy(), out["shape"].astype(str), out["strides"].astype(str)):
        results[int(seq)].append((shape, _addressing(shape, strides)))
    ops = {str(op): op for op in _overloads(audit)}
    seen: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    ev = audit.events
    for seq, op, phase in zip(ev["seq"].to_numpy(), ev["op"].astype(str), ev["phase"].astype(str)):
        res = tuple(results.get(int(seq), ()))
        if not returns_fresh(ops[op]) or not any(shape.count(",") >= 2 for shape, _ in res):
            continue
        seen[phase][(op, res)] += 1
    return dict(seen)


def _addressing(shape: str, strides: str) -> str:
    """The strides of the dimensions that address memory: a dimension of size 1 has none (its
    stride, which eager and meta kernels set differently, is shown as ``*``)."""
    try:
        sizes, steps = ast.literal_eval(shape), ast.literal_eval(strides)
    except (ValueError, SyntaxError):
        return strides
    if not isinstance(sizes, tuple) or not isinstance(steps, tuple):
        return strides
    return str(tuple("*" if n == 1 else s for n, s in zip(sizes, steps)))


def _overloads(audit):
    for name in set(audit.events["op"].astype(str)):
        packet, _, overload = name.rpartition(".")
        ns, _, op = packet.partition(".")
        yield getattr(getattr(getattr(torch.ops, ns), op), overload)


def kernel_disagreement(real, fake) -> list[str]:
    """What differs between two audits' kernel results (:func:`kernel_formats`; empty: they agree):
    the layouts each op wrote in a phase for results of the same sizes, over the (op, sizes) both
    ran there. How often an op ran at a size, or whether it ran at all, is the step's sequence,
    not a kernel's layout: autograd replays a write into a view with other ops for fake tensors
    on some releases (torch 2.8's fake ghostnet step runs ``slice_backward`` at sizes where the
    real one runs ``copy_``), so that is left to the causes."""
    def sized(k):
        return k[0], tuple(shape for shape, _ in k[1])

    a, b = kernel_formats(real), kernel_formats(fake)
    out = []
    for phase in sorted(set(a) | set(b)):
        ra, fb = a.get(phase, collections.Counter()), b.get(phase, collections.Counter())
        both = {sized(k) for k in ra} & {sized(k) for k in fb}
        ra = collections.Counter({k: 1 for k in ra if sized(k) in both})
        fb = collections.Counter({k: 1 for k in fb if sized(k) in both})
        out += [f"{phase}: real only {k} x{n}" for k, n in (ra - fb).items()]
        out += [f"{phase}: fake only {k} x{n}" for k, n in (fb - ra).items()]
    return out
