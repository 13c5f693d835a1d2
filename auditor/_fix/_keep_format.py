"""Modules that keep the format where torch's own lose it on CPU, and how to swap them in.

Each computes the same values as the module it replaces: ``SoftmaxKeepFormat`` for
``Softmax``/``LogSoftmax``, ``LayerNormKeepFormat`` for a ``LayerNorm`` over (C, H, W), a
``GroupNorm`` with one group per channel for ``InstanceNorm``, ``GlobalAvgPool`` for an
``AdaptiveAvgPool2d(1)``, ``BroadcastUpsample`` for an ``Upsample`` of an N×C×1×1 map, and
``TemporalConv`` or ``FrameConv`` for a ``Conv3d`` that spans time only or space only.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .._measure._harness import torch_threads
from .._recording._formats import channels_last_order, logical_order
from ._convert import CHANNELS_LAST_OF_RANK
from ._matmul import matmul
from ._restride import restride
from ._roi_align import roi_align
from ._split import chunk, split


def softmax_keep_format(x: torch.Tensor, dim: int, log: bool = False) -> torch.Tensor:
    """``softmax(x, dim)`` that returns channels_last for a channels_last ``x``.

    CPU softmax has no channels_last kernel: it copies to contiguous in forward and backward.
    On the NHWC view (contiguous) it computes directly and the inverse permutation is
    channels_last again. Same values as ``torch.softmax``.
    """
    fn = torch.log_softmax if log else torch.softmax
    rank = x.dim()
    if rank in CHANNELS_LAST_OF_RANK and x.is_contiguous(memory_format=CHANNELS_LAST_OF_RANK[rank]) and not x.is_contiguous():
        order = channels_last_order(rank)
        return fn(x.permute(order), order.index(dim % rank)).permute(logical_order(rank))
    return fn(x, dim)


class SoftmaxKeepFormat(nn.Module):
    """Drop-in for ``nn.Softmax`` / ``nn.LogSoftmax`` that keeps channels_last (no state)."""

    def __init__(self, dim: int, log: bool = False):
        super().__init__()
        self.dim = dim
        self.log = log

    @classmethod
    def from_module(cls, module: nn.Module) -> SoftmaxKeepFormat:
        if module.dim is None:
            raise ValueError(f"{type(module).__name__} without dim has no format-keeping version")
        return cls(module.dim, log=isinstance(module, nn.LogSoftmax))

    def forward(self, x):
        return softmax_keep_format(x, self.dim, self.log)

    def extra_repr(self) -> str:
        return f"dim={self.dim}" + (", log=True" if self.log else "")


class LayerNormKeepFormat(nn.Module):
    """Drop-in for an ``nn.LayerNorm`` over (C, H, W) of a 4-D input (or (C, D, H, W)).

    ``LayerNorm`` over the channels copies channels_last to contiguous on CPU;
    ``group_norm`` with one group normalises over the same elements and keeps the format. The
    elementwise affine follows as a broadcast multiply-add. Keeps the original ``weight`` and
    ``bias`` Parameters.
    """

    def __init__(self, layer_norm: nn.LayerNorm):
        super().__init__()
        self.normalized_shape = tuple(layer_norm.normalized_shape)
        self.eps = layer_norm.eps
        self.weight = layer_norm.weight
        self.bias = layer_norm.bias

    @classmethod
    def from_module(cls, module: nn.LayerNorm) -> LayerNormKeepFormat:
        if len(module.normalized_shape) not in (3, 4):
            raise ValueError("only a LayerNorm over (C, H, W) or (C, D, H, W) has a format-keeping version")
        return cls(module)

    def forward(self, x):
        if x.dim() != len(self.normalized_shape) + 1:
            return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        y = F.group_norm(x, 1, eps=self.eps)
        if self.weight is not None:
            y = y * self.weight
        if self.bias is not None:
            y = y + self.bias
        return y

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}"


class GlobalAvgPool(nn.Module):
    """Drop-in for ``nn.AdaptiveAvgPool2d(1)`` (and ``AdaptiveAvgPool3d(1)``): the mean over the
    spatial dimensions as their sum divided by their size, which is how torch computes that mean
    on CPU (the same values), but whose backward broadcasts the gradient as a view; the mean's
    backward writes it contiguous."""

    def __init__(self, dims: int = 2):
        super().__init__()
        self.dims = dims

    @classmethod
    def from_module(cls, module: nn.Module) -> GlobalAvgPool:
        size = module.output_size
        sizes = size if isinstance(size, (tuple, list)) else (size,)
        if any(s != 1 for s in sizes):
            raise ValueError(f"{type(module).__name__}({size}) pools to more than one value per channel: it has no "
                             "sum-and-divide version")
        return cls(3 if isinstance(module, nn.AdaptiveAvgPool3d) else 2)

    def forward(self, x):
        spatial = tuple(range(-self.dims, 0))
        n = 1
        for d in spatial:
            n *= x.shape[d]
        return x.sum(spatial, keepdim=True) / n

    def extra_repr(self) -> str:
        return f"dims={self.dims}"


class _Conv3dAsConv2d(nn.Module):
    """A plain ``Conv3d`` whose sums a ``Conv2d`` computes (each subclass's ``takes`` says for
    which settings), with the Conv3d's ``weight`` and ``bias`` Parameters."""

    def __init__(self, conv: nn.Conv3d):
        super().__init__()
        self.conv = conv


class TemporalConv(_Conv3dAsConv2d):
    """Drop-in for a ``Conv3d`` whose kernel, stride and padding span time only, (k, 1, 1): the
    same sums computed as a ``Conv2d`` over (T, H·W), on a view of its channels_last_3d input.
    Where a Conv3d has no channels_last_3d kernel for such a shape (a small batch on CPU runs
    ``slow_conv3d``, which writes contiguous), the Conv2d has a channels_last one."""

    @staticmethod
    def takes(conv: nn.Conv3d) -> bool:
        return _spans_only(conv, (1, 2))

    def forward(self, x):
        c = self.conv
        h, w = x.shape[-2:]
        y = F.conv2d(x.flatten(3), c.weight.flatten(3), c.bias, (c.stride[0], 1), (c.padding[0], 0),
                     (c.dilation[0], 1), c.groups)
        return y.unflatten(3, (h, w))


class FrameConv(_Conv3dAsConv2d):
    """Drop-in for a ``Conv3d`` whose kernel spans space only, (1, kh, kw), without padding in
    time: the same sums computed as a ``Conv2d`` over each frame (every ``stride[0]``-th one),
    on the (N·T, C, H, W) view of a channels_last_3d input (a view in that format only: any
    other input goes to the Conv3d itself, so a model run contiguous is as before; frames taken
    with a stride that does not divide T are copied in that format first)."""

    @staticmethod
    def takes(conv: nn.Conv3d) -> bool:
        return _spans_only(conv, ()) and conv.kernel_size[0] == 1 and conv.padding[0] == 0

    def forward(self, x):
        if x.dim() != 5 or not x.is_contiguous(memory_format=torch.channels_last_3d):
            return self.conv(x)
        c = self.conv
        step = c.stride[0]
        if step > 1:
            whole = x.shape[2] % step == 0 or x.shape[0] == 1  # then the frames are one (N·T) dimension
            x = x[:, :, ::step] if whole else x[:, :, ::step].contiguous(memory_format=torch.channels_last_3d)
        n, t = x.shape[0], x.shape[2]
        y = F.conv2d(x.transpose(1, 2).flatten(0, 1), c.weight.squeeze(2), c.bias, c.stride[1:], c.padding[1:],
                     c.dilation[1:], c.groups)
        return y.unflatten(0, (n, t)).transpose(1, 2)


def _spans_only(conv: nn.Conv3d, flat: tuple[int, ...]) -> bool:
    """Whether ``conv`` leaves the dimensions ``flat`` (0 time, 1 height, 2 width) alone: kernel,
    stride and dilation 1 there, no padding; and its padding is given as sizes (not "same")."""
    return (isinstance(conv.padding, tuple) and conv.padding_mode == "zeros"
            and all(conv.kernel_size[d] == 1 and conv.stride[d] == 1 and conv.padding[d] == 0
                    and conv.dilation[d] == 1 for d in flat))


def conv3d_keep_format(module: nn.Module) -> nn.Module:
    """A ``Conv3d`` that spans time only as a :class:`TemporalConv`, one that spans space only
    as a :class:`FrameConv`; ValueError for one that spans both, or a Conv3d with a ``forward``
    of its own."""
    if not isinstance(module, nn.Conv3d) or type(module).forward is not nn.Conv3d.forward:
        raise ValueError(f"{type(module).__name__} is no plain Conv3d")
    swap = next((s for s in (TemporalConv, FrameConv) if s.takes(module)), None)
    if swap is None:
        raise ValueError(f"Conv3d(kernel {module.kernel_size}, stride {module.stride}, padding {module.padding}) "
                         "spans both time and space: it is no Conv2d over (T, H·W) nor over each frame")
    return swap(module)


class PositionsConv(nn.Module):
    """Drop-in for a ``Conv1d`` over the positions of a flattened map: a (N, C, L) input whose
    channels lie innermost (the view ``flatten(2)`` makes of a channels_last map) is computed as
    a ``Conv2d`` over its (N, C, 1, L) view, which is channels_last, so the output keeps its
    channels innermost and the input's gradient is channels_last; ``conv1d`` writes both
    contiguous. Any other input goes to the Conv1d itself, so a model run contiguous is as
    before. It computes with the Conv1d's own ``weight`` and ``bias`` Parameters."""

    def __init__(self, conv: nn.Conv1d):
        super().__init__()
        self.conv = conv

    def forward(self, x):
        c = self.conv
        if x.dim() != 3 or x.shape[1] == 1 or x.stride(1) != 1:
            return c(x)
        return F.conv2d(x.unsqueeze(2), c.weight.unsqueeze(2), c.bias, (1, c.stride[0]), (0, c.padding[0]),
                        (1, c.dilation[0]), c.groups).squeeze(2)


def conv1d_keep_format(module: nn.Module) -> nn.Module:
    """A plain ``Conv1d`` as a :class:`PositionsConv`; ValueError for one with a ``forward`` of
    its own, padding given as a word ("same") or padding other than zeros."""
    if not isinstance(module, nn.Conv1d) or type(module).forward is not nn.Conv1d.forward:
        raise ValueError(f"{type(module).__name__} is no plain Conv1d")
    if not isinstance(module.padding, tuple) or module.padding_mode != "zeros":
        raise ValueError(f"Conv1d(padding {module.padding!r}, padding_mode {module.padding_mode!r}) pads otherwise "
                         "than with zeros of a given size: no Conv2d computes it as it is")
    return PositionsConv(module)


class BroadcastUpsample(nn.Module):
    """Drop-in for an ``nn.Upsample``: an N×C×1×1 map (one pixel per channel) is broadcast to
    the output size as a view (``expand``), where an interpolation writes it full size, and
    contiguous (its input is both formats at once). Every mode gives each output pixel that one
    pixel, so the values are the same; what reads the view reads it in its own format, so it
    names none (a model run contiguous is as before). Any other input goes to the ``Upsample``
    itself. The view cannot be written in place."""

    def __init__(self, upsample: nn.Upsample):
        super().__init__()
        self.upsample = upsample

    @classmethod
    def from_module(cls, module: nn.Module) -> BroadcastUpsample:
        if not isinstance(module, nn.Upsample):
            raise ValueError(f"{type(module).__name__} is no Upsample")
        return cls(module)

    def _size(self, rank: int) -> tuple[int, ...]:
        u, n = self.upsample, rank - 2
        if u.size is not None:
            return tuple(u.size) if isinstance(u.size, (tuple, list)) else (u.size,) * n
        scale = u.scale_factor if isinstance(u.scale_factor, (tuple, list)) else (u.scale_factor,) * n
        return tuple(int(float(s) // 1) for s in scale)  # F.interpolate: floor(1 * scale)

    def forward(self, x):
        if x.dim() >= 3 and all(s == 1 for s in x.shape[2:]):
            return x.expand(-1, -1, *self._size(x.dim()))
        return self.upsample(x)


def swap_instance_norm(module: nn.modules.instancenorm._InstanceNorm) -> nn.GroupNorm:
    """A GroupNorm with one group per channel: InstanceNorm's values, channels_last kept."""
    if module.track_running_stats:
        raise ValueError("InstanceNorm with running stats has no GroupNorm equivalent in eval mode")
    gn = nn.GroupNorm(module.num_features, module.num_features, eps=module.eps, affine=module.affine)
    if module.affine:
        gn.weight, gn.bias = module.weight, module.bias  # the same Parameters
    return gn


#: the public factory every swap suggestion names (one name for every replacement)
KEEP_FORMAT = "auditor.keep_format"

#: module type -> the factory of its format-keeping replacement
SWAPS = {
    nn.Softmax: SoftmaxKeepFormat.from_module,
    nn.LogSoftmax: SoftmaxKeepFormat.from_module,
    nn.LayerNorm: LayerNormKeepFormat.from_module,
    nn.InstanceNorm2d: swap_instance_norm,
    nn.InstanceNorm3d: swap_instance_norm,
    nn.AdaptiveAvgPool2d: GlobalAvgPool.from_module,
    nn.AdaptiveAvgPool3d: GlobalAvgPool.from_module,
}

#: module type -> a replacement that broadcasts an N×C×1×1 map instead of interpolating it
BROADCAST_SWAPS = {nn.Upsample: BroadcastUpsample.from_module}

#: convolution type -> a replacement with a channels_last kernel where it has none
CONV_SWAPS = {nn.Conv3d: conv3d_keep_format, nn.Conv1d: conv1d_keep_format}

_EVERY_SWAP = {**SWAPS, **BROADCAST_SWAPS, **CONV_SWAPS}


def loses_format(module: nn.Module, shape: tuple[int, ...], threads: int | None = None) -> bool:
    """Whether ``module`` writes another format when fed a channels_last input of ``shape``, in
    its parameters' dtype and on their device, at ``threads`` intra-op threads (None: as they
    are): the kernel a convolution runs, and so the format it writes, depends on all of them."""
    weight = next(module.parameters())
    fmt = CHANNELS_LAST_OF_RANK[len(shape)]
    x = torch.zeros(shape, dtype=weight.dtype, device=weight.device).to(memory_format=fmt)
    with torch.no_grad(), torch_threads(threads):
        return not module(x).is_contiguous(memory_format=fmt)


def keep_format(module: nn.Module) -> nn.Module:
    """The drop-in replacement of ``module`` that keeps channels_last where torch's own module
    loses it on CPU; the fixes' module swaps name this. It computes the same values and shares
    ``module``'s Parameters:

    - ``Softmax``, ``LogSoftmax``: computed on the NHWC view;
    - ``LayerNorm`` over (C, H, W): a one-group ``group_norm`` and a broadcast affine;
    - ``InstanceNorm2d/3d`` without running stats: a ``GroupNorm`` with a group per channel;
    - ``AdaptiveAvgPool2d/3d(1)``: a sum divided by H·W, whose backward is a view;
    - ``Upsample``: an N×C×1×1 map broadcast as a view (any other input is interpolated);
    - ``Conv3d`` whose kernel, stride and padding span time only: a ``Conv2d`` over (T, H·W);
      one that spans space only: a ``Conv2d`` over each frame of a channels_last_3d input;
    - ``Conv1d``: a ``Conv2d`` over the (N, C, 1, L) view of a flattened channels_last map
      (its channels innermost), which keeps them innermost.

    Raises ValueError for any other module, and for one of these types whose settings have no
    same-valued replacement (a pool to more than one value, a Conv3d spanning time and space, a
    Conv1d padded otherwise than with zeros).

    Its attributes are the format-keeping replacements of ops that have no channels_last kernel,
    functions with the op's arguments and values (float64 forward and backward), whose output
    and input gradients keep a channels_last input's format:

    - ``keep_format.roi_align``: ``torchvision.ops.roi_align`` as one ``embedding_bag`` over
      the NHWC view of the map;
    - ``keep_format.matmul``: ``torch.matmul`` whose backward writes each gradient in its
      input's memory order (a correlation ``fmap1.mT @ fmap2`` of two maps' (B, C, H·W) views
      gets both maps' gradients channels_last), with the same products;
    - ``keep_format.restride(x, weight)``: a map in both formats at once (its channels, or its
      height and width, are 1) as a view in the format of a convolution ``weight``, so that
      what PyTorch computes from it follows that format;
    - ``keep_format.split`` and ``keep_format.chunk``: ``torch.split`` and ``torch.chunk``, the
      same views, whose backward writes the gradient in the split tensor's format, where
      torch's writes it contiguous once the parts' gradients differ in order or a part is not
      used."""
    base = next((t for t in type(module).__mro__ if t in _EVERY_SWAP), None)
    if base is None:
        raise ValueError(f"no format-keeping replacement for {type(module).__name__}: one exists for "
                         + ", ".join(sorted({t.__name__ for t in _EVERY_SWAP})))
    return _EVERY_SWAP[base](module)


keep_format.roi_align = roi_align
keep_format.matmul = matmul
keep_format.restride = restride
keep_format.split = split
keep_format.chunk = chunk


def swap_module(model: nn.Module, name: str, table: dict | None = None) -> nn.Module:
    """Replace the submodule ``name`` by its format-keeping version (see :data:`SWAPS`, or
    ``table``); returns the new module. Parameters are shared, not copied.

    A subclass of a type in :data:`SWAPS` is swapped only if it computes what that type does
    (it keeps its ``forward``); one with a ``forward`` of its own is refused."""
    try:
        old = model.get_submodule(name)
    except AttributeError:
        raise ValueError(f"the model has no module named {name!r}") from None
    table = SWAPS if table is None else table
    base = next((t for t in type(old).__mro__ if t in table), None)
    if base is None:
        raise ValueError(f"no format-keeping replacement for {type(old).__name__} ({name!r})")
    if type(old).forward is not base.forward:
        raise ValueError(f"{type(old).__name__} ({name!r}) has a forward of its own, not {base.__name__}'s: "
                         "its format-keeping replacement could compute other values")
    new = table[base](old)
    parent, _, attr = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, attr, new)
    return new
