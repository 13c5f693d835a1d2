"""Small models with one planted format break each, shared by the tests (and the notebook).

Every model is built and fed in channels_last by :func:`make`. ``EXPECTED`` states, per model,
the forward hotspots (module, op, kind) that the analyzer must report, exactly.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

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
    "user_restore": {("<root>", CLONE, "converts"), ("<root>", CLONE, "restores")},
}


def make(name: str, seed: int = 0):
    """The model, converted, and one channels_last input for it."""
    cls, shape = MODELS[name]
    torch.manual_seed(seed)
    fmt = CL if len(shape) == 4 else CL3
    model = cls().to(memory_format=fmt)
    x = torch.randn(*shape).to(memory_format=fmt)
    return model, x
