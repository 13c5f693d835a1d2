"""Running parts of a model in another format: input-format hooks and convolution formats.

A convolution on CPU computes in channels_last when its input *or* its weight is channels_last,
so choosing one convolution's format means converting its weight and, with a forward pre-hook
(:class:`InputFormat`), its input.
"""

from __future__ import annotations

from collections.abc import Iterable

import pandas as pd
import torch
import torch.nn as nn

from ._convert import (
    CHANNELS_LAST_OF_RANK,
    CONV2D,
    CONV3D,
    check_format,
    conversion_frame,
    convert_conv_weights,
)


class InputFormat:
    """A forward pre-hook that hands a module its first argument in one memory format.

    A convolution on CPU computes in channels_last when its input *or* its weight is
    channels_last, so running one contiguous inside a channels_last model needs its input
    converted too. A plain callable object, so that ``copy.deepcopy`` and ``pickle`` keep it.
    """

    def __init__(self, memory_format: torch.memory_format):
        self.memory_format = memory_format
        self.rank = 5 if memory_format is torch.channels_last_3d else 4

    def __call__(self, module, args):
        if args and isinstance(args[0], torch.Tensor) and args[0].dim() in (4, 5):
            x = args[0]
            fmt = self.memory_format if self.memory_format is torch.contiguous_format or x.dim() == self.rank else None
            if fmt is not None and not x.is_contiguous(memory_format=fmt):
                return (x.contiguous(memory_format=fmt), *args[1:])
        return None

    def __repr__(self) -> str:
        return f"InputFormat({self.memory_format})"


def remove_input_formats(module: nn.Module) -> int:
    """Remove every :class:`InputFormat` hook in ``module`` and below; returns how many."""
    removed = 0
    for mod in module.modules():
        for key, hook in list(mod._forward_pre_hooks.items()):
            if isinstance(hook, InputFormat):
                del mod._forward_pre_hooks[key]
                mod._forward_pre_hooks_with_kwargs.pop(key, None)
                removed += 1
    return removed


def set_input_format(module: nn.Module, memory_format: torch.memory_format) -> None:
    """Make ``module`` receive its first argument in ``memory_format`` (replacing an earlier
    :class:`InputFormat` on that module only)."""
    for key, hook in list(module._forward_pre_hooks.items()):
        if isinstance(hook, InputFormat):
            del module._forward_pre_hooks[key]
            module._forward_pre_hooks_with_kwargs.pop(key, None)
    module.register_forward_pre_hook(InputFormat(memory_format))


def is_conv_module(model: nn.Module, name: str) -> bool:
    """``name`` is a convolution module of ``model`` (of a torch convolution type or a subclass)."""
    try:
        return isinstance(model.get_submodule(name), CONV2D + CONV3D)
    except AttributeError:
        return False


def conv_module(model: nn.Module, name: str) -> nn.Module:
    """The convolution module ``name`` of ``model``; ``ValueError`` when it is none."""
    try:
        mod = model if name in ("", "<root>") else model.get_submodule(name)
    except AttributeError:
        raise ValueError(f"the model has no module named {name!r}") from None
    if not isinstance(mod, CONV2D + CONV3D):
        raise ValueError(f"{name!r} is a {type(mod).__name__}, not a Conv2d/Conv3d/ConvTranspose module")
    return mod


def set_conv_format(model: nn.Module, name: str, memory_format: torch.memory_format, *, convert_input: bool = True) -> pd.DataFrame:
    """Run one convolution in ``memory_format``: convert its weight and (``convert_input``)
    its input with an :class:`InputFormat` hook. ``memory_format`` is ``torch.contiguous_format``
    or the channels-last format of the weight's rank. Returns the weight conversion report."""
    mod = conv_module(model, name)
    rank = mod.weight.dim()
    check_format(memory_format, (torch.contiguous_format, CHANNELS_LAST_OF_RANK[rank]), "set_conv_format")
    out = convert_conv_weights(mod, memory_format, CONV2D + CONV3D)
    out["module"] = name
    if convert_input:
        set_input_format(mod, memory_format)
    return out


def keep_contiguous(model: nn.Module, names: Iterable[str]) -> pd.DataFrame:
    """Keep a region contiguous inside a channels_last model: the named convolutions get
    contiguous weights and contiguous inputs. Everything between them then runs contiguous;
    the convolutions after the region convert back on their own. Returns the weight report."""
    frames = [set_conv_format(model, name, torch.contiguous_format) for name in names]
    return pd.concat(frames, ignore_index=True) if frames else conversion_frame([])
