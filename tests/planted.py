"""Small models with one planted format break each, shared by the tests (and the notebook).

Every model is built and fed in channels_last by :func:`make`. ``EXPECTED`` states, per model,
the forward hotspots (module, op, kind) that the analyzer must report, exactly.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from kernels import convs_that_lose

CL, CL3 = torch.channels_last, torch.channels_last_3d


class TwoConvs(nn.Module):
    """conv1 -> (something) -> conv2; subclasses plant the something."""

    def __init__(self, c_in: int = 3, c: int = 8, c2_in: int | None = None, dims: int = 2):
        super().__init__()
        Conv = nn.Conv2d if dims == 2 else nn.Conv3d
        self.conv1 = Conv(c_in, c, 3, padding=1)
        self.conv2 = Conv(c2_in or c, c, 3, padding=1)

    def between(self, y):
        return y

    def forward(self, x):
        return self.conv2(self.between(self.conv1(x)))


class Clean(TwoConvs):
    def between(self, y):
        return F.relu(y)


class ExplicitContiguous(TwoConvs):
    def between(self, y):
        return y.contiguous()  # planted: an explicit .contiguous() between two convolutions


class ReshapeCopy(TwoConvs):
    def between(self, y):
        n, c, h, w = y.shape
        # planted: merging C and H of a channels_last tensor cannot be a view, so this copies
        return y.reshape(n, c * h, w).reshape(n, c, h, w)


class ReshapeView(TwoConvs):
    def between(self, y):
        n, c, h, w = y.shape
        # merging H and W of a channels_last tensor is a view: no copy, nothing to report
        return y.reshape(n, c, h * w).reshape(n, c, h, w)


class MixedCat(TwoConvs):
    def __init__(self):
        super().__init__(c2_in=16)

    def between(self, y):
        # planted: cat of a channels_last and a contiguous tensor
        return torch.cat([y, y.contiguous()], dim=1)


class Softmax(TwoConvs):
    """An op with no channels_last kernel on CPU (softmax over C, forward and backward)."""

    def __init__(self):
        super().__init__()
        self.mid = nn.Softmax(dim=1)

    def between(self, y):
        return self.mid(y)


class Bicubic(TwoConvs):
    """Keeps channels_last in forward; its backward (upsample_bicubic2d_backward) loses it."""

    def __init__(self):
        super().__init__()
        self.up = nn.Upsample(scale_factor=2, mode="bicubic")

    def between(self, y):
        return self.up(y)


class Gate(TwoConvs):
    """A 1-channel gate (N1HW sigmoid times features): ambiguous, never a loss."""

    def __init__(self):
        super().__init__()
        self.gate = nn.Conv2d(8, 1, 1)

    def between(self, y):
        return y * torch.sigmoid(self.gate(y))


class ChannelsLast3d(TwoConvs):
    def __init__(self):
        super().__init__(dims=3)

    def between(self, y):
        return y.contiguous()  # planted: 5-D channels_last_3d lost to an explicit .contiguous()


class UserRestore(TwoConvs):
    def between(self, y):
        # a contiguous detour the user undoes explicitly: a conversion and a restore
        return y.contiguous().contiguous(memory_format=CL)


MODELS = {
    "clean": (Clean, (2, 3, 8, 8)),
    "explicit_contiguous": (ExplicitContiguous, (2, 3, 8, 8)),
    "reshape_copy": (ReshapeCopy, (2, 3, 8, 8)),
    "reshape_view": (ReshapeView, (2, 3, 8, 8)),
    "mixed_cat": (MixedCat, (2, 3, 8, 8)),
    "gate": (Gate, (2, 3, 8, 8)),
    "softmax": (Softmax, (2, 3, 8, 8)),
    "bicubic": (Bicubic, (2, 3, 8, 8)),
    "channels_last_3d": (ChannelsLast3d, (2, 3, 4, 6, 6)),
    "user_restore": (UserRestore, (2, 3, 8, 8)),
}

CONV = "aten.convolution.default"
CLONE = "aten.clone.default"
#: model -> the exact set of forward hotspots (module, op, kind)
#: (backward expectations are in tests/test_analysis.py)
EXPECTED = {
    "clean": set(),
    "reshape_view": set(),
    "gate": set(),
    "explicit_contiguous": {("<root>", CLONE, "converts"), ("conv2", CONV, "converts")},
    "reshape_copy": {("<root>", CLONE, "converts"), ("conv2", CONV, "converts")},
    # cat follows its contiguous input and reorders the channels_last one: a conversion
    "mixed_cat": {
        ("<root>", CLONE, "converts"),
        ("<root>", "aten.cat.default", "converts"),
        ("conv2", CONV, "converts"),
    },
    "softmax": {("mid", "aten._softmax.default", "loses"), ("conv2", CONV, "converts")},
    "bicubic": set(),
    "channels_last_3d": {("<root>", CLONE, "converts"), ("conv2", CONV, "converts")},
    # the restore reads the copy the user made contiguous and writes the channels_last it asks
    # for: the very copy the model makes when it runs contiguous, so layout-independent
    "user_restore": {("<root>", CLONE, "converts")},
}


def make(name: str, seed: int = 0):
    """The model, converted, and one channels_last input for it."""
    cls, shape = MODELS[name]
    torch.manual_seed(seed)
    fmt = CL if len(shape) == 4 else CL3
    model = cls().to(memory_format=fmt)
    x = torch.randn(*shape).to(memory_format=fmt)
    return model, x


# -- causes: one planted cause per pattern, and the model with the suggested fix applied -----------


class StackReduce(nn.Module):
    """Two branches stacked on a new dimension and summed over it: the sum writes contiguous."""

    def __init__(self, fixed: bool = False):
        super().__init__()
        self.fixed = fixed
        self.a = nn.Conv2d(3, 8, 3, padding=1)
        self.b = nn.Conv2d(3, 8, 3, padding=1)
        self.c = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x):
        if self.fixed:
            return self.c(self.a(x) + self.b(x))
        return self.c(torch.stack([self.a(x), self.b(x)], 1).sum(1))  # planted: stack then reduce


class PoolBranch(nn.Module):
    """An ASPP-style image-pooling branch: its N×C×1×1 map, upsampled, is written contiguous."""

    def __init__(self, fixed: bool = False):
        super().__init__()
        self.fixed = fixed
        self.a = nn.Conv2d(3, 8, 3, padding=1)
        self.p = nn.Conv2d(8, 8, 1)
        self.bn = nn.BatchNorm2d(8)
        self.c = nn.Conv2d(16, 8, 3, padding=1)

    def forward(self, x):
        a = self.a(x)
        p = torch.relu(self.bn(self.p(F.avg_pool2d(a, a.shape[-2:]))))
        if self.fixed:
            p = p.expand(-1, -1, *a.shape[-2:]).contiguous(memory_format=CL)
        else:
            p = F.interpolate(p, size=a.shape[-2:], mode="bilinear")  # planted: N×C×1×1 upsampled
        return self.c(torch.cat([a, p], 1))


class SqueezeExciteMean(nn.Module):
    """A squeeze-excite gate pooled with a mean over H, W: its backward writes contiguous."""

    def __init__(self, fixed: bool = False):
        super().__init__()
        self.fixed = fixed
        self.a = nn.Conv2d(3, 8, 3, padding=1)
        self.fc = nn.Conv2d(8, 8, 1)
        self.c = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x):
        a = self.a(x)
        s = F.avg_pool2d(a, a.shape[-2:]) if self.fixed else a.mean((2, 3), keepdim=True)  # planted
        return self.c(a * torch.sigmoid(self.fc(s)))


class InplaceOnView(nn.Module):
    """An in-place add on a view: autograd copies its gradient into contiguous order."""

    def __init__(self, fixed: bool = False):
        super().__init__()
        self.fixed = fixed
        self.a = nn.Conv2d(3, 8, 3, padding=1)
        self.c = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x):
        y = self.a(x).transpose(2, 3)
        if self.fixed:
            y = y + 1
        else:
            y += 1  # planted: in place on a view
        return self.c(y.transpose(2, 3))


class ChannelSlice(nn.Module):
    """Channels sliced for two branches: the backward of a slice writes contiguous zeros."""

    def __init__(self, fixed: bool = False):
        super().__init__()
        self.fixed = fixed
        self.a = nn.Conv2d(3, 16, 3, padding=1)
        self.c = nn.Conv2d(8, 8, 3, padding=1)
        self.d = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x):
        a = self.a(x)
        left, right = a.split(8, dim=1) if self.fixed else (a[:, :8], a[:, 8:])  # planted: slicing
        return self.c(left) + self.d(right)


class Conv3dBatch1(nn.Module):
    """Conv3d at batch 1 in float32 has no channels_last_3d kernel on this CPU: it writes
    contiguous, and the next convolution permutes its channels_last_3d weight. The fix runs the
    model contiguous."""

    fixed_format = torch.contiguous_format

    def __init__(self, fixed: bool = False):
        super().__init__()
        self.fixed = fixed
        self.a = nn.Conv3d(3, 8, 3, padding=1)
        self.c = nn.Conv3d(8, 8, 3, padding=1)

    def forward(self, x):
        return self.c(torch.relu(self.a(x)))  # planted: convolutions without a channels_last_3d kernel


class StandardizedConv(nn.Conv2d):
    """Weight standardisation through a reshape and batch_norm, as timm's StdConv2d writes it:
    the channels_last weight is rebuilt contiguous every step."""

    fixed = False

    def forward(self, x):
        w = self.weight
        if self.fixed:  # flattened in the channels_last parameter's memory order: the reshape is a view
            m = w.permute(0, 2, 3, 1)
            flat = m.reshape(1, self.out_channels, -1)
            w = F.batch_norm(flat, None, None, training=True, momentum=0.0, eps=1e-5).reshape(m.shape).permute(0, 3, 1, 2)
        else:
            flat = w.reshape(1, self.out_channels, -1)  # planted: copies the channels_last weight contiguous
            w = F.batch_norm(flat, None, None, training=True, momentum=0.0, eps=1e-5).reshape_as(w)
        return F.conv2d(x, w, self.bias, self.stride, self.padding)


class WeightRebuilt(nn.Module):
    def __init__(self, fixed: bool = False):
        super().__init__()
        self.a = nn.Conv2d(3, 8, 3, padding=1)
        self.c = StandardizedConv(8, 8, 3, padding=1)
        self.c.fixed = fixed

    def forward(self, x):
        return self.c(torch.relu(self.a(x)))


class TokenAttention(nn.Module):
    """Self-attention over the pixels between two convolutions, written on tokens: its head
    transposes copy in any layout, and its result goes back to the image as a channels_last view."""

    def __init__(self, fixed: bool = False):
        super().__init__()
        self.a = nn.Conv2d(3, 8, 3, padding=1)
        self.qkv = nn.Linear(8, 24)
        self.c = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x):
        a = self.a(x)
        b, c, h, w = a.shape
        tokens = a.flatten(2).transpose(1, 2)  # (B, N, C)
        q, k, v = self.qkv(tokens).reshape(b, h * w, 3, 2, c // 2).permute(2, 0, 3, 1, 4).unbind(0)
        att = (q @ k.transpose(-2, -1)).softmax(-1)
        out = (att @ v).transpose(1, 2).reshape(b, h * w, c)
        return self.c(out.transpose(1, 2).reshape(b, c, h, w) + a)


class AdaptivePoolHead(nn.Module):
    """A global adaptive average pool before a 1x1 convolution: on a channels_last input torch
    restrides the pooled mean with ``as_strided_``, whose backward (zeros, a strided copy) hides
    the expanded gradient the mean's backward writes contiguous."""

    def __init__(self, fixed: bool = False):
        super().__init__()
        self.fixed = fixed
        self.a = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.act = nn.Hardswish()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.c = nn.Conv2d(8, 8, 1)

    def forward(self, x):
        y = self.act(self.bn(self.a(x)))
        y = F.avg_pool2d(y, y.shape[-2:]) if self.fixed else self.pool(y)  # planted: adaptive mean
        return self.c(y)


class StackThenUpsample(nn.Module):
    """Two branches stacked and summed, then a convolution and a bilinear upsample: the
    upsample's backward hands the convolution a contiguous gradient, a consequence of the same
    stack-sum that wrote its saved input contiguous."""

    def __init__(self, fixed: bool = False):
        super().__init__()
        self.fixed = fixed
        self.a = nn.Conv2d(3, 8, 3, padding=1)
        self.b = nn.Conv2d(3, 8, 3, padding=1)
        self.head = nn.Conv2d(8, 4, 3, padding=1)
        self.up = nn.UpsamplingBilinear2d(scale_factor=2)

    def forward(self, x):
        y = self.a(x) + self.b(x) if self.fixed else torch.stack([self.a(x), self.b(x)]).sum(0)  # planted
        return self.up(self.head(y))


class TokenGroupNorm(nn.Module):
    """A group norm over the pixels as a (B, C, HW) token tensor, added back to the image: its
    backward writes the 3-D gradient contiguous, which joins the image path through views."""

    def __init__(self, fixed: bool = False):
        super().__init__()
        self.fixed = fixed
        self.a = nn.Conv2d(3, 8, 3, padding=1)
        self.gn = nn.GroupNorm(2, 8)
        self.c = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x):
        a = self.a(x)
        b, c, h, w = a.shape
        t = a.view(b, c, h * w).transpose(1, 2)
        if self.fixed:
            t = self.gn(t.transpose(1, 2).unsqueeze(2)).squeeze(2).transpose(1, 2)
        else:
            t = self.gn(t.transpose(1, 2)).transpose(1, 2)  # planted: group norm on tokens
        return self.c(a + t.transpose(1, 2).reshape(b, c, h, w))


class MixedJoin(nn.Module):
    """A map concatenated with a 2-channel tensor made off the path, contiguous (RAFT's flow):
    the cat of channels_last and contiguous inputs writes contiguous. Converting the small one
    removes the cause; the cat keeps the format of maps that all are in it."""

    def __init__(self, fixed: bool = False):
        super().__init__()
        self.fixed = fixed
        self.a = nn.Conv2d(3, 8, 3, padding=1)
        self.scale = nn.Parameter(torch.rand(2, 1, 1) + 0.5)
        self.c = nn.Conv2d(10, 8, 3, padding=1)

    def forward(self, x):
        a = self.a(x)
        n, _, h, w = a.shape
        flow = torch.linspace(-1, 1, w, dtype=a.dtype, device=a.device).expand(n, 2, h, w) * self.scale
        if self.fixed:
            flow = flow.contiguous(memory_format=CL if a.is_contiguous(memory_format=CL) else torch.contiguous_format)
        return self.c(torch.cat([a, flow], dim=1))  # planted: a join of mixed formats


#: model -> (class, input shape, the causes its audit must report: (phase, op, kind, pattern))
CAUSE_MODELS = {
    "stack_reduce": (StackReduce, (2, 3, 8, 8), {("forward", "aten.sum.dim_IntList", "loses", "stack_reduce")}),
    "pool_branch": (PoolBranch, (2, 3, 8, 8),
                    {("forward", "aten.upsample_bilinear2d.default", "loses", "nc11_broadcast")}),
    "se_mean": (SqueezeExciteMean, (2, 3, 8, 8), {("backward", "aten.div.Scalar", "loses", "mean_backward")}),
    "inplace_view": (InplaceOnView, (2, 3, 8, 8), {("backward", "aten.clone.default", "converts", "inplace_view")}),
    "channel_slice": (ChannelSlice, (2, 3, 8, 8),
                      {("backward", "aten.slice_backward.default", "loses", "channel_slice")}),
    "conv3d_batch1": (Conv3dBatch1, (1, 3, 4, 8, 8), {("forward", "aten.convolution.default", "loses", "conv_no_kernel")}),
    "weight_rebuilt": (WeightRebuilt, (2, 3, 8, 8), {("forward", "aten.clone.default", "weight", "weight_rebuilt")}),
    "token_attention": (TokenAttention, (2, 3, 8, 8), set()),
    "adaptive_pool_head": (AdaptivePoolHead, (2, 3, 8, 8),
                           {("backward", "aten.div.Scalar", "joins", "mean_backward")}),
    "stack_then_upsample": (StackThenUpsample, (2, 3, 8, 8),
                            {("forward", "aten.sum.dim_IntList", "loses", "stack_reduce")}),
    "token_group_norm": (TokenGroupNorm, (2, 3, 8, 8),
                         {("forward", "aten.native_group_norm.default", "joins", "joins")}),
    "mixed_join": (MixedJoin, (2, 3, 8, 8), {("forward", "aten.cat.default", "converts", "mixed_join")}),
}


def make_cause(name: str, fixed: bool = False, seed: int = 0, shape: tuple[int, ...] | None = None):
    """The planted-cause model (``fixed``: with its cause rewritten away), converted, and one
    channels_last input for it (of ``shape``, else the model's test shape); the same seed gives
    the same weights either way."""
    cls, test_shape, _ = CAUSE_MODELS[name]
    shape = shape or test_shape
    torch.manual_seed(seed)
    fmt = CL if len(shape) == 4 else CL3
    if fixed:
        fmt = getattr(cls, "fixed_format", fmt)
    model = cls(fixed=fixed).to(memory_format=fmt)
    torch.manual_seed(seed + 1)
    x = torch.randn(*shape).to(memory_format=fmt)
    return model, x


def absent_here(name: str) -> str:
    """Why the cause ``name`` plants cannot happen on this machine, or ``""`` where it can: a
    cause that is a missing convolution kernel happens only where the machine lacks the kernel
    (a float32 Conv3d at batch 1 runs without a channels_last_3d kernel on the CPUs this was
    written on; another may have one)."""
    if not any(pattern == "conv_no_kernel" for *_, pattern in CAUSE_MODELS[name][2]):
        return ""
    model, x = make_cause(name)
    if convs_that_lose(model, (x,)):
        return ""
    return f"{name}: every convolution of it has a channels_last kernel on this machine, so its planted cause does not happen"


class StackThenCopy(nn.Module):
    """A stack reduced along the stack, then a .contiguous() that is a no-op on the contiguous
    sum: fixing the stack makes the sum channels_last, and the copy then converts (a cause the
    first fix exposes)."""

    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 8, 3, padding=1)
        self.b = nn.Conv2d(3, 8, 3, padding=1)
        self.c = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x):
        s = torch.stack([self.a(x), self.b(x)], 1).sum(1)  # planted: stack then reduce
        return self.c(s.contiguous())  # exposed: a copy that converts once the sum keeps the format


class SlicesOnTwoStatements(nn.Module):
    """Channels cut by two slices on consecutive statements, which together partition them (the
    split one statement alone cannot see)."""

    def __init__(self, channels: int = 16):
        super().__init__()
        self.k = 8
        self.a = nn.Conv2d(3, channels, 3, padding=1)
        self.c = nn.Conv2d(8, 8, 3, padding=1)
        self.d = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x):
        a = self.a(x)
        left = a[:, :self.k]  # planted: a slice of the channels
        right = a[:, self.k:]  # planted: the other slice, on the next statement
        return self.c(left) + self.d(right)


class SlicesLeaveAGap(SlicesOnTwoStatements):
    """Two slices that leave 4 channels out: no split of them all into used parts."""

    def __init__(self):
        super().__init__(channels=20)

    def forward(self, x):
        a = self.a(x)
        left = a[:, :self.k]  # planted: a slice of the channels
        right = a[:, self.k + 4:]  # planted: the other slice, 4 channels on
        return self.c(left) + self.d(right)


class UpsampleOnePixel(nn.Module):
    """An ``nn.Upsample`` of an N×C×1×1 map (a convolution's whole-image output, batch-normed),
    added to an image: the interpolation writes the map full size, contiguous."""

    def __init__(self, mode: str = "nearest"):
        super().__init__()
        self.a = nn.Conv2d(3, 8, 8)
        self.bn = nn.BatchNorm2d(8)
        self.up = nn.Upsample(scale_factor=8, mode=mode)
        self.b = nn.Conv2d(3, 8, 3, padding=1)
        self.c = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x):
        return self.c(self.b(x) + self.up(self.bn(self.a(x))))


class ChannelMeanNorm(nn.Module):
    """An RMS norm over the channels written with a mean over dimension 1: the mean's backward
    expands its N×1×H×W gradient and writes it full size, contiguous."""

    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 8, 3, padding=1)
        self.c = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x):
        x = self.a(x)
        v = torch.mean(x.pow(2), dim=1, keepdim=True)  # planted: a mean over the channels
        return self.c(x * torch.rsqrt(v + 1e-5))


class CatOfMaps(nn.Module):
    """Two N×1×H×W maps concatenated (a spatial attention's mean and max over the channels):
    both inputs are both formats at once, and the cat writes contiguous."""

    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 8, 3, padding=1)
        self.c = nn.Conv2d(2, 8, 3, padding=1)

    def forward(self, x):
        x = self.a(x)
        return self.c(torch.cat([x.mean(dim=1, keepdim=True), x.amax(dim=1, keepdim=True)], dim=1))  # planted


class CostlyRegion(nn.Module):
    """A reshape that merges C and H of a thin map between two wide ones: keeping its two
    convolutions contiguous removes the thin copy but converts the wide maps at the edges."""

    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 32, 3, padding=1)
        self.b = nn.Conv2d(32, 2, 1)
        self.c = nn.Conv2d(2, 32, 1)
        self.d = nn.Conv2d(32, 8, 3, padding=1)

    def forward(self, x):
        y = self.b(self.a(x))
        n, c, h, w = y.shape
        y = y.reshape(n, c * h, w).reshape(n, c, h, w)  # planted: a copy of the thin map
        return self.d(self.c(y))


# -- what moves no bytes, and what the audited size made ---------------------------------------------


class ContiguousGate(nn.Module):
    """A map gated by a 1-channel map made from a contiguous copy: the gate is N×1×H×W, one
    physical order in both formats, so the multiply that broadcasts it over the channels_last map
    reorders nothing (only the copy is a cause)."""

    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 8, 3, padding=1)
        self.gate = nn.Conv2d(8, 1, 1)
        self.c = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x):
        y = self.a(x)
        g = torch.sigmoid(self.gate(y.contiguous()))  # planted: a copy, whose 1-channel gate is both formats
        return self.c(y * g)


class EmptyUpdate(nn.Module):
    """Samples picked by a mask that picks none, written into a canvas: the update and its
    gradient have no elements, and the backward's index_put into a contiguous canvas of zeros
    moves none of the canvas."""

    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 8, 3, padding=1)
        self.c = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x):
        y = self.a(x)
        canvas = torch.zeros_like(y)
        picked = torch.nonzero(y.detach().amax((1, 2, 3)) > 1e9).flatten()  # no sample
        canvas[picked] = y[picked] * 2  # planted: an update with no elements
        return self.c(canvas + y)


class EmptyLevel(nn.Module):
    """RoIAlign over a level no region fell in (an FPN level at a small input): its backward
    writes a map of zeros, contiguous, from an empty gradient, and that map meets the
    channels_last gradient of the level."""

    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 8, 3, padding=1)
        self.c = nn.Conv2d(8, 8, 3, padding=1)
        self.head = nn.Conv2d(8, 8, 1)

    def forward(self, x, boxes):
        from torchvision.ops import roi_align

        f = self.a(x)
        r = roi_align(f, boxes, 2)  # planted: a level no region fell in
        return self.c(f).sum() + self.head(r).sum()


class OnePixelPad(nn.Module):
    """A stride-2 convolution that makes a 1x1 map at a 4x4 input (and a 4x4 one at 16x16), a
    batch norm, then a padding: the 1x1 map is in both formats at once, the norm writes it with
    contiguous strides, and the padding writes contiguous; at a larger input it keeps the format."""

    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.b = nn.Conv2d(8, 8, 3, stride=2, padding=1)
        self.norm = nn.BatchNorm2d(8)
        self.c = nn.Conv2d(8, 8, 3)

    def forward(self, x):
        return self.c(F.pad(self.norm(self.b(self.a(x))), (1, 1, 1, 1)))  # planted: 1x1 at a small input
