"""Conversion helpers: weights, whole models and inputs, in place, reporting what changed.

They keep every ``Parameter`` object (an optimizer built before keeps working), move a held
``.grad`` with its weight, copy nothing already in the format, and return a DataFrame.
"""

from __future__ import annotations

import pandas as pd
import torch
import torch.nn as nn

from .._recording._formats import format_label
from .._recording._torch import pytree

#: memory format -> the format label of :mod:`auditor._recording._formats`
FORMAT_NAMES = {
    torch.contiguous_format: "contiguous",
    torch.channels_last: "channels_last",
    torch.channels_last_3d: "channels_last_3d",
}
#: convolution module types by the rank of their weight
CONV2D = (nn.Conv2d, nn.ConvTranspose2d)
CONV3D = (nn.Conv3d, nn.ConvTranspose3d)
#: channels-last format of each rank
CHANNELS_LAST_OF_RANK = {4: torch.channels_last, 5: torch.channels_last_3d}

WEIGHT_CONVERSION_COLUMNS = ["module", "module_type", "param", "shape", "from_format", "to_format", "bytes"]


def layout_name(t: torch.Tensor) -> str:
    """The format whose canonical strides ``t`` has, else its format label.

    Stricter than ``is_contiguous(memory_format=...)``: a 1x1 kernel (O, I, 1, 1) is contiguous
    in both formats, but the convolution picks its layout from the exact strides
    (``suggest_memory_format``), so ``(I, 1, 1, 1)`` and ``(I, 1, I, I)`` are not the same.
    """
    if t.dim() in (4, 5):
        for fmt in (torch.contiguous_format, CHANNELS_LAST_OF_RANK[t.dim()]):
            if t.stride() == canonical_strides(t.shape, fmt):
                return FORMAT_NAMES[fmt]
    return format_label(tuple(t.shape), tuple(t.stride()))


def canonical_strides(shape, memory_format) -> tuple[int, ...]:
    """The strides torch gives a new tensor of ``shape`` in ``memory_format``."""
    return torch.empty(tuple(shape), device="meta", memory_format=memory_format).stride()


def check_format(memory_format, allowed: tuple, helper: str) -> None:
    """Raise a clear error when ``memory_format`` is not one ``helper`` takes."""
    if not isinstance(memory_format, torch.memory_format):
        raise TypeError(f"{helper}: memory_format must be a torch.memory_format, got {memory_format!r}")
    if memory_format not in allowed:
        names = " or ".join(f"torch.{FORMAT_NAMES[f]}" if f is not torch.contiguous_format else "torch.contiguous_format"
                            for f in allowed)
        hint = ""
        if memory_format is torch.channels_last_3d:
            hint = " (channels_last_3d is for 5-D weights: use convert_conv3d_weight_memory_format)"
        elif memory_format is torch.channels_last:
            hint = " (channels_last is for 4-D weights: use convert_conv2d_weight_memory_format)"
        raise ValueError(f"{helper}: memory_format must be {names}, got {memory_format}{hint}")


def check_module(module, helper: str) -> None:
    """Raise ``TypeError`` when ``helper`` was given something other than an ``nn.Module``."""
    if not isinstance(module, nn.Module):
        raise TypeError(f"{helper}: expected an nn.Module, got {type(module).__name__}")


def convert_param(param: nn.Parameter, memory_format) -> bool:
    """Re-lay ``param`` out in ``memory_format`` in place (same Parameter object); False if it
    already was. Its gradient follows, so a later accumulation keeps one layout."""
    target = canonical_strides(param.shape, memory_format)
    if param.stride() == target:
        return False
    # torch's own recipe: clone in the format, then resize_ to pin exact strides for the
    # ambiguous shapes (1x1 kernels) that `contiguous` would leave alone
    data = param.detach().clone(memory_format=memory_format)
    param.data = data.resize_(data.size(), memory_format=memory_format)
    if param.grad is not None and param.grad.stride() != target:
        grad = param.grad.detach().clone(memory_format=memory_format)
        param.grad.data = grad.resize_(grad.size(), memory_format=memory_format)
    return True


def conversion_frame(rows: list[dict]) -> pd.DataFrame:
    """The weight-conversion report (:data:`WEIGHT_CONVERSION_COLUMNS`), typed even when empty."""
    if not rows:
        return pd.DataFrame({c: pd.Series(dtype="int64" if c == "bytes" else "object") for c in WEIGHT_CONVERSION_COLUMNS})
    return pd.DataFrame(rows, columns=WEIGHT_CONVERSION_COLUMNS)


def convert_conv_weights(module: nn.Module, memory_format, types: tuple, names=None) -> pd.DataFrame:
    """Convert the weight of every module of ``types`` (named in ``names``, if given) in place."""
    rows = []
    for name, mod in module.named_modules():
        if not isinstance(mod, types) or (names is not None and name not in names):
            continue
        weight = getattr(mod, "weight", None)
        if not isinstance(weight, nn.Parameter) or isinstance(weight, nn.parameter.UninitializedParameter):
            continue  # lazy modules before their first call, weight_norm's computed weight
        before = layout_name(weight)
        if convert_param(weight, memory_format):
            rows.append({
                "module": name or "<root>",
                "module_type": type(mod).__name__,
                "param": "weight",
                "shape": tuple(weight.shape),
                "from_format": before,
                "to_format": layout_name(weight),
                "bytes": weight.numel() * weight.element_size(),
            })
    return conversion_frame(rows)


def convert_conv2d_weight_memory_format(module: nn.Module, memory_format: torch.memory_format) -> pd.DataFrame:
    """Convert the weights of every ``Conv2d`` and ``ConvTranspose2d`` in ``module`` (itself
    included) to ``memory_format``, in place.

    ``torch.nn.utils.convert_conv2d_weight_memory_format`` with three differences: it returns
    what it changed (one row per weight: ``module``, ``module_type``, ``param``, ``shape``,
    ``from_format``, ``to_format``, ``bytes``), it copies nothing that is already in the format
    (so a second call returns an empty frame), and an existing ``.grad`` follows its weight.
    The ``Parameter`` objects stay the same, so an optimizer created before keeps working.
    ``memory_format`` is ``torch.channels_last`` or ``torch.contiguous_format`` (to undo).
    """
    helper = "convert_conv2d_weight_memory_format"
    check_module(module, helper)
    check_format(memory_format, (torch.channels_last, torch.contiguous_format), helper)
    return convert_conv_weights(module, memory_format, CONV2D)


def convert_conv3d_weight_memory_format(module: nn.Module, memory_format: torch.memory_format) -> pd.DataFrame:
    """:func:`convert_conv2d_weight_memory_format` for ``Conv3d`` and ``ConvTranspose3d``;
    ``memory_format`` is ``torch.channels_last_3d`` or ``torch.contiguous_format``."""
    helper = "convert_conv3d_weight_memory_format"
    check_module(module, helper)
    check_format(memory_format, (torch.channels_last_3d, torch.contiguous_format), helper)
    return convert_conv_weights(module, memory_format, CONV3D)


def channels_last_tensor(t):
    """A 4-D or 5-D tensor in the channels-last format of its rank; anything else as it is."""
    if isinstance(t, torch.Tensor) and t.dim() in CHANNELS_LAST_OF_RANK:
        return t.contiguous(memory_format=CHANNELS_LAST_OF_RANK[t.dim()])
    return t


def to_channels_last(model: nn.Module, *inputs):
    """Convert ``model`` in place and its ``inputs`` to channels_last, by rank: 4-D tensors to
    ``channels_last``, 5-D ones to ``channels_last_3d`` (``model.to(memory_format=...)`` takes
    one format and fails on a model with both ranks).

    Every 4-D and 5-D parameter and buffer is converted, like ``model.to`` does, keeping the
    ``Parameter`` objects. Inputs may be nested lists, tuples or dicts; other values pass
    through. Returns ``model`` alone when no inputs are given, else ``(model, *inputs)``::

        model, x = auditor.to_channels_last(model, x)
    """
    check_module(model, "to_channels_last")
    convert_conv2d_weight_memory_format(model, torch.channels_last)
    convert_conv3d_weight_memory_format(model, torch.channels_last_3d)
    for p in model.parameters():
        if p.dim() in CHANNELS_LAST_OF_RANK:
            convert_param(p, CHANNELS_LAST_OF_RANK[p.dim()])
    for mod in model.modules():
        for name, buf in mod._buffers.items():
            if buf is not None and buf.dim() in CHANNELS_LAST_OF_RANK:
                mod._buffers[name] = channels_last_tensor(buf)
    if not inputs:
        return model
    return (model, *pytree.tree_map(channels_last_tensor, list(inputs)))


def to_contiguous(model: nn.Module) -> nn.Module:
    """Convert every 4-D and 5-D parameter and buffer of ``model`` to contiguous, in place
    (the ``Parameter`` objects are kept); returns ``model``."""
    for p in model.parameters():
        if p.dim() in (4, 5):
            convert_param(p, torch.contiguous_format)
    for mod in model.modules():
        for name, buf in mod._buffers.items():
            if buf is not None and buf.dim() in (4, 5):
                mod._buffers[name] = buf.contiguous()
    return model
