"""Fixes for lost channels_last: conversion helpers, format-keeping modules and suggested fixes.

The analyzer says where data is permuted; this module says what to change. Three kinds of tool:

* conversion helpers (:func:`convert_conv2d_weight_memory_format`,
  :func:`convert_conv3d_weight_memory_format`, :func:`to_channels_last`,
  :func:`keep_contiguous`) that convert in place, keep every ``Parameter`` object (an optimizer
  built before keeps working) and return what they changed as a DataFrame;
* drop-in modules that keep the format where torch's own lose it on CPU
  (:class:`SoftmaxKeepFormat`, :class:`LayerNormKeepFormat`, ``GroupNorm`` for ``InstanceNorm``);
* :func:`suggest_fixes`, one concrete fix per hotspot, traced back to the op that caused it.
"""

from __future__ import annotations

import ast
import functools
import io
import linecache
import os
import re
import sys
import tokenize
from collections.abc import Iterable

import numpy as np
import pandas as pd
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils import _pytree as pytree

from . import analysis, rules
from .audit import Audit, _fmt_bytes
from .formats import base_format, format_label

CONTIGUOUS = torch.contiguous_format
CHANNELS_LAST = torch.channels_last
CHANNELS_LAST_3D = torch.channels_last_3d

#: memory format -> the format label of ``auditor.formats``
FORMAT_NAMES = {
    CONTIGUOUS: "contiguous",
    CHANNELS_LAST: "channels_last",
    CHANNELS_LAST_3D: "channels_last_3d",
}
_CONV2D = (nn.Conv2d, nn.ConvTranspose2d)
_CONV3D = (nn.Conv3d, nn.ConvTranspose3d)
#: channels-last format of each rank
CHANNELS_LAST_OF_RANK = {4: CHANNELS_LAST, 5: CHANNELS_LAST_3D}

CONVERSION_COLUMNS = ["module", "module_type", "param", "shape", "from_format", "to_format", "bytes"]


# -- conversion helpers ------------------------------------------------------------------------


def layout_name(t: torch.Tensor) -> str:
    """The format whose canonical strides ``t`` has, else its format label.

    Stricter than ``is_contiguous(memory_format=...)``: a 1x1 kernel (O, I, 1, 1) is contiguous
    in both formats, but the convolution picks its layout from the exact strides
    (``suggest_memory_format``), so ``(I, 1, 1, 1)`` and ``(I, 1, I, I)`` are not the same.
    """
    if t.dim() in (4, 5):
        for fmt in (CONTIGUOUS, CHANNELS_LAST_OF_RANK[t.dim()]):
            if t.stride() == _canonical_strides(t.shape, fmt):
                return FORMAT_NAMES[fmt]
    return format_label(tuple(t.shape), tuple(t.stride()))


def _canonical_strides(shape, memory_format) -> tuple[int, ...]:
    return torch.empty(tuple(shape), device="meta", memory_format=memory_format).stride()


def _check_format(memory_format, allowed: tuple, helper: str) -> None:
    if not isinstance(memory_format, torch.memory_format):
        raise TypeError(f"{helper}: memory_format must be a torch.memory_format, got {memory_format!r}")
    if memory_format not in allowed:
        names = " or ".join(f"torch.{FORMAT_NAMES[f]}" if f is not CONTIGUOUS else "torch.contiguous_format"
                            for f in allowed)
        hint = ""
        if memory_format is CHANNELS_LAST_3D:
            hint = " (channels_last_3d is for 5-D weights: use convert_conv3d_weight_memory_format)"
        elif memory_format is CHANNELS_LAST:
            hint = " (channels_last is for 4-D weights: use convert_conv2d_weight_memory_format)"
        raise ValueError(f"{helper}: memory_format must be {names}, got {memory_format}{hint}")


def _check_module(module, helper: str) -> None:
    if not isinstance(module, nn.Module):
        raise TypeError(f"{helper}: expected an nn.Module, got {type(module).__name__}")


def _convert_param(param: nn.Parameter, memory_format) -> bool:
    """Re-lay ``param`` out in ``memory_format`` in place (same Parameter object); False if it
    already was. Its gradient follows, so a later accumulation keeps one layout."""
    target = _canonical_strides(param.shape, memory_format)
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


def _conversion_frame(rows: list[dict]) -> pd.DataFrame:
    if not rows:
        return pd.DataFrame({c: pd.Series(dtype="int64" if c == "bytes" else "object") for c in CONVERSION_COLUMNS})
    return pd.DataFrame(rows, columns=CONVERSION_COLUMNS)


def _convert_conv_weights(module: nn.Module, memory_format, types: tuple, names=None) -> pd.DataFrame:
    rows = []
    for name, mod in module.named_modules():
        if not isinstance(mod, types) or (names is not None and name not in names):
            continue
        weight = getattr(mod, "weight", None)
        if not isinstance(weight, nn.Parameter) or isinstance(weight, nn.parameter.UninitializedParameter):
            continue  # lazy modules before their first call, weight_norm's computed weight
        before = layout_name(weight)
        if _convert_param(weight, memory_format):
            rows.append({
                "module": name or "<root>",
                "module_type": type(mod).__name__,
                "param": "weight",
                "shape": tuple(weight.shape),
                "from_format": before,
                "to_format": layout_name(weight),
                "bytes": weight.numel() * weight.element_size(),
            })
    return _conversion_frame(rows)


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
    _check_module(module, helper)
    _check_format(memory_format, (CHANNELS_LAST, CONTIGUOUS), helper)
    return _convert_conv_weights(module, memory_format, _CONV2D)


def convert_conv3d_weight_memory_format(module: nn.Module, memory_format: torch.memory_format) -> pd.DataFrame:
    """:func:`convert_conv2d_weight_memory_format` for ``Conv3d`` and ``ConvTranspose3d``;
    ``memory_format`` is ``torch.channels_last_3d`` or ``torch.contiguous_format``."""
    helper = "convert_conv3d_weight_memory_format"
    _check_module(module, helper)
    _check_format(memory_format, (CHANNELS_LAST_3D, CONTIGUOUS), helper)
    return _convert_conv_weights(module, memory_format, _CONV3D)


def _channels_last_tensor(t):
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
    _check_module(model, "to_channels_last")
    convert_conv2d_weight_memory_format(model, CHANNELS_LAST)
    convert_conv3d_weight_memory_format(model, CHANNELS_LAST_3D)
    for p in model.parameters():
        if p.dim() in CHANNELS_LAST_OF_RANK:
            _convert_param(p, CHANNELS_LAST_OF_RANK[p.dim()])
    for mod in model.modules():
        for name, buf in mod._buffers.items():
            if buf is not None and buf.dim() in CHANNELS_LAST_OF_RANK:
                mod._buffers[name] = _channels_last_tensor(buf)
    if not inputs:
        return model
    return (model, *pytree.tree_map(_channels_last_tensor, list(inputs)))


# -- input conversions: forward pre-hooks --------------------------------------------------------


class InputFormat:
    """A forward pre-hook that hands a module its first argument in one memory format.

    A convolution on CPU computes in channels_last when its input *or* its weight is
    channels_last, so running one contiguous inside a channels_last model needs its input
    converted too. A plain callable object, so that ``copy.deepcopy`` and ``pickle`` keep it.
    """

    def __init__(self, memory_format: torch.memory_format):
        self.memory_format = memory_format
        self.rank = 5 if memory_format is CHANNELS_LAST_3D else 4

    def __call__(self, module, args):
        if args and isinstance(args[0], torch.Tensor) and args[0].dim() in (4, 5):
            x = args[0]
            fmt = self.memory_format if self.memory_format is CONTIGUOUS or x.dim() == self.rank else None
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


def _conv_module(model: nn.Module, name: str) -> nn.Module:
    try:
        mod = model if name in ("", "<root>") else model.get_submodule(name)
    except AttributeError:
        raise ValueError(f"the model has no module named {name!r}") from None
    if not isinstance(mod, _CONV2D + _CONV3D):
        raise ValueError(f"{name!r} is a {type(mod).__name__}, not a Conv2d/Conv3d/ConvTranspose module")
    return mod


def set_conv_format(model: nn.Module, name: str, memory_format: torch.memory_format, *, convert_input: bool = True) -> pd.DataFrame:
    """Run one convolution in ``memory_format``: convert its weight and (``convert_input``)
    its input with an :class:`InputFormat` hook. ``memory_format`` is ``torch.contiguous_format``
    or the channels-last format of the weight's rank. Returns the weight conversion report."""
    mod = _conv_module(model, name)
    rank = mod.weight.dim()
    _check_format(memory_format, (CONTIGUOUS, CHANNELS_LAST_OF_RANK[rank]), "set_conv_format")
    out = _convert_conv_weights(mod, memory_format, _CONV2D + _CONV3D)
    out["module"] = name
    if convert_input:
        set_input_format(mod, memory_format)
    return out


def keep_contiguous(model: nn.Module, names: Iterable[str]) -> pd.DataFrame:
    """Keep a region contiguous inside a channels_last model: the named convolutions get
    contiguous weights and contiguous inputs. Everything between them then runs contiguous;
    the convolutions after the region convert back on their own. Returns the weight report."""
    frames = [set_conv_format(model, name, CONTIGUOUS) for name in names]
    return pd.concat(frames, ignore_index=True) if frames else _conversion_frame([])


# -- modules that keep the format ------------------------------------------------------------------

#: physical order of a channels-last tensor, and its inverse
_TO_NHWC = {4: (0, 2, 3, 1), 5: (0, 2, 3, 4, 1)}
_FROM_NHWC = {4: (0, 3, 1, 2), 5: (0, 4, 1, 2, 3)}


def softmax_keep_format(x: torch.Tensor, dim: int, log: bool = False) -> torch.Tensor:
    """``softmax(x, dim)`` that returns channels_last for a channels_last ``x``.

    CPU softmax has no channels_last kernel: it copies to contiguous in forward and backward.
    On the NHWC view (contiguous) it computes directly and the inverse permutation is
    channels_last again. Same values as ``torch.softmax``.
    """
    fn = torch.log_softmax if log else torch.softmax
    rank = x.dim()
    if rank in _TO_NHWC and x.is_contiguous(memory_format=CHANNELS_LAST_OF_RANK[rank]) and not x.is_contiguous():
        order = _TO_NHWC[rank]
        return fn(x.permute(order), order.index(dim % rank)).permute(_FROM_NHWC[rank])
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


def swap_instance_norm(module: nn.modules.instancenorm._InstanceNorm) -> nn.GroupNorm:
    """A GroupNorm with one group per channel: InstanceNorm's values, channels_last kept."""
    if module.track_running_stats:
        raise ValueError("InstanceNorm with running stats has no GroupNorm equivalent in eval mode")
    gn = nn.GroupNorm(module.num_features, module.num_features, eps=module.eps, affine=module.affine)
    if module.affine:
        gn.weight, gn.bias = module.weight, module.bias  # the same Parameters
    return gn


#: module type -> (factory of a format-keeping replacement, its name in a suggestion)
SWAPS = {
    nn.Softmax: (SoftmaxKeepFormat.from_module, "auditor.fix.SoftmaxKeepFormat.from_module"),
    nn.LogSoftmax: (SoftmaxKeepFormat.from_module, "auditor.fix.SoftmaxKeepFormat.from_module"),
    nn.LayerNorm: (LayerNormKeepFormat.from_module, "auditor.fix.LayerNormKeepFormat.from_module"),
    nn.InstanceNorm2d: (swap_instance_norm, "auditor.fix.swap_instance_norm"),
    nn.InstanceNorm3d: (swap_instance_norm, "auditor.fix.swap_instance_norm"),
}


def swap_module(model: nn.Module, name: str) -> nn.Module:
    """Replace the submodule ``name`` by its format-keeping version (see :data:`SWAPS`);
    returns the new module. Parameters are shared, not copied."""
    try:
        old = model.get_submodule(name)
    except AttributeError:
        raise ValueError(f"the model has no module named {name!r}") from None
    entry = SWAPS.get(type(old))
    if entry is None:
        raise ValueError(f"no format-keeping replacement for {type(old).__name__} ({name!r})")
    new = entry[0](old)
    parent, _, attr = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, attr, new)
    return new


# -- data flow over one audit ------------------------------------------------------------------------


class Flow:
    """Who feeds whom in one audit: each event's activation inputs and their producers, and
    each event's consumers in its phase. Built once per audit, shared by fixes and plans."""

    def __init__(self, audit: Audit):
        self.audit = audit
        self.ops = audit.ops()
        t = audit.tensors
        self.tensors = t
        links = analysis.flow_links(audit.events, t)
        producer = np.full(len(t), -1, dtype=np.int64)
        producer[links["row"].to_numpy()] = links["producer"].to_numpy()
        same = np.zeros(len(t), dtype=bool)
        same[links["row"].to_numpy()] = links["same_phase"].to_numpy()
        dtypes = t["dtype"].cat.categories
        floating = np.array([analysis.is_floating_dtype(str(d)) for d in dtypes] + [False])[t["dtype"].cat.codes.to_numpy()]
        act = (
            (t["role"] == "input").to_numpy() & floating & ~t["is_param"].to_numpy()
            & ~t["arg"].isin(rules.WEIGHT_ARGS).to_numpy()
        )
        self.producer = producer
        self.same_phase = same
        rows = np.flatnonzero(act)
        seq = t["seq"].to_numpy()
        self.act_rows: dict[int, list[int]] = {}
        for r in rows:  # tensors are in recording order, inputs by position
            self.act_rows.setdefault(int(seq[r]), []).append(int(r))
        self.consumers: dict[int, list[int]] = {}
        same_links = links[links["same_phase"].to_numpy()]
        for p, c in zip(same_links["producer"].to_numpy(), same_links["consumer"].to_numpy()):
            lst = self.consumers.setdefault(int(p), [])
            if not lst or lst[-1] != int(c):
                lst.append(int(c))
        self.is_conv = self.ops["is_conv"].to_numpy()
        self.kind = self.ops["kind"].astype(str).to_numpy()
        self.op = self.ops["op"].astype(str).to_numpy()
        self.module = self.ops["module"].astype(str).to_numpy()
        self.phase = self.ops["phase"].astype(str).to_numpy()
        self.source = self.ops["source"].astype(str).to_numpy()
        self._walks: dict[tuple, set[int]] = {}

    def input_producers(self, e: int, same_phase: bool = True) -> list[int]:
        """Producers of ``e``'s activation inputs, in argument order (-1: none recorded)."""
        out = []
        for r in self.act_rows.get(e, []):
            p = int(self.producer[r])
            out.append(p if p >= 0 and (self.same_phase[r] or not same_phase) else -1)
        return out

    def upstream_convs(self, e: int) -> set[int]:
        """The nearest convolutions feeding ``e``, in its phase."""
        key = ("up", e)
        if key not in self._walks:
            self._walks[key] = self._walk(e, lambda x: [p for p in self.input_producers(x) if p >= 0])
        return self._walks[key]

    def downstream_convs(self, e: int) -> set[int]:
        """The nearest convolutions fed by ``e``, in its phase."""
        key = ("down", e)
        if key not in self._walks:
            self._walks[key] = self._walk(e, lambda x: self.consumers.get(x, []))
        return self._walks[key]

    def _walk(self, e: int, step) -> set[int]:
        found, seen, stack = set(), {e}, list(step(e))
        while stack:
            x = stack.pop()
            if x in seen:
                continue
            seen.add(x)
            if self.is_conv[x]:
                found.add(x)
            else:
                stack.extend(step(x))
        return found

    def blamed_producers(self, e: int) -> list[int]:
        """Producers (any phase) of the operands to blame for costly op ``e``: the ones stored
        in a definite format other than channels_last. A convolution or a restore permuted
        them; an op whose peers came in mixed formats (``cat``, ``mul``) converted them or
        followed them, whichever operand came first."""
        fmt = self.tensors["format"].to_numpy()
        out = []
        for r in self.act_rows.get(e, []):
            if base_format(str(fmt[r])) in ("contiguous", "other"):
                out.append(int(self.producer[r]))
        return out

    def cause(self, e: int) -> int:
        """The costly op at the root of hotspot ``e``: follow the operands it permuted back
        through views and format-preserving ops to the op that first wrote them in the wrong
        format. An op is its own cause when nothing upstream explains it."""
        seen = set()
        while e not in seen:
            seen.add(e)
            nxt = None
            peer = self.kind[e] == rules.CONVERTS and rules.op_packet(self.op[e]) not in rules.COPY_OPS
            if self.is_conv[e] or peer or self.kind[e] == rules.RESTORES:
                for p in self.blamed_producers(e):
                    c = self._costly_upstream(p)
                    if c is not None:
                        nxt = c
                        break
            if nxt is None:
                return e
            e = nxt
        return e

    def _costly_upstream(self, p: int) -> int | None:
        """Walk back from producer ``p`` along first activation inputs to a costly non-conv op."""
        steps = 0
        while p >= 0 and steps < 10_000:
            if self.is_conv[p]:
                return p if self.kind[p] in rules.COSTLY_KINDS else None
            if self.kind[p] in rules.COSTLY_KINDS:
                return p
            prods = self.input_producers(p, same_phase=False)
            p = prods[0] if prods else -1
            steps += 1
        return None


# -- suggested fixes --------------------------------------------------------------------------------

EDIT, SWAP, FUNCTION, WEIGHT, REGION = (
    "edit source", "swap module", "swap function", "convert weight", "keep region contiguous")
FIX_COLUMNS = [
    "fix", "action", "module", "module_type", "op", "source", "line", "suggestion", "detail",
    "hotspots", "count", "bytes", "hotspot_bytes", "added_bytes", "forward_bytes", "backward_bytes",
    "region",
]
_CONTIGUOUS_CALL = re.compile(r"\.contiguous\(\s*\)")
_CONTIGUOUS_FORMAT = re.compile(r"(?:torch\.)?contiguous_format")
_RESHAPES = ("aten.view", "aten._unsafe_view", "aten.reshape", "aten._reshape_alias", "aten.flatten")


def module_expr(name: str, root: str = "model") -> str:
    """``layer1.0.conv2`` -> ``model.layer1[0].conv2``: how to write a submodule in code."""
    if name in ("", "<root>"):
        return root
    out = root
    for part in name.split("."):
        out += f"[{part}]" if part.isdigit() else (f".{part}" if part.isidentifier() else f".get_submodule({part!r})")
    return out


def _source_line(source: str) -> str:
    path, _, line = source.rpartition(":")
    if not path or not line.isdigit():
        return ""
    return linecache.getline(path, int(line)).rstrip("\n")


class Fixes:
    """The result of :func:`suggest_fixes`.

    Attributes:
        frame: one row per fix (columns in :data:`FIX_COLUMNS`), most bytes saved first.
            ``bytes`` is the net saving: ``hotspot_bytes`` (the hotspots it removes, forward and
            backward) less ``added_bytes`` (conversions a region fix moves to its edges).
        hotspots: ``Audit.hotspots()`` with a ``fix`` column naming the fix that removes each.
    """

    def __init__(self, frame: pd.DataFrame, hotspots: pd.DataFrame):
        self.frame = frame
        self.hotspots = hotspots

    def __len__(self) -> int:
        return len(self.frame)

    def apply(self, model: nn.Module) -> pd.DataFrame:
        """Apply, in place, the fixes that need no source edit (module swaps, weight
        conversions, regions kept contiguous) and save bytes; a region whose edges would move
        more bytes than it saves is left out. Returns one row per fix: ``fix``, ``action``,
        ``applied`` and what was done or what is left to do by hand."""
        rows = []
        for r in self.frame.itertuples():
            done, what = False, ""
            if r.bytes <= 0:
                what = "skipped: its edges move more bytes than it saves (try auditor.plan_layout)"
            elif r.action == SWAP:
                new = swap_module(model, r.module)
                done, what = True, f"{r.module} is now {type(new).__name__}"
            elif r.action == WEIGHT:
                rank = _conv_module(model, r.module).weight.dim()
                set_conv_format(model, r.module, CHANNELS_LAST_OF_RANK[rank], convert_input=False)
                done, what = True, f"{r.module}.weight converted"
            elif r.action == REGION:
                keep_contiguous(model, r.region)
                done, what = True, f"{', '.join(r.region)} run contiguous"
            else:
                what = f"by hand, at {r.source or r.module}: {r.suggestion or r.detail}"
            rows.append({"fix": r.fix, "action": r.action, "applied": done, "detail": what})
        return pd.DataFrame(rows, columns=["fix", "action", "applied", "detail"])

    def __str__(self) -> str:
        f = self.frame
        if f.empty:
            return "Suggested fixes: none (no hotspots)."
        lines = [
            f"Suggested fixes: {len(f)} for {len(self.hotspots)} hotspot groups, "
            f"{_fmt_bytes(f['bytes'].clip(lower=0).sum())} to save "
            f"(forward {_fmt_bytes(f['forward_bytes'].sum())}, backward {_fmt_bytes(f['backward_bytes'].sum())} "
            "of hotspots)",
        ]
        for r in f.itertuples():
            where = r.source or r.module
            lines.append("")
            lines.append(
                f"{r.fix}. {r.action}: {where}  ({r.module}, {r.module_type or '-'})  "
                f"saves {_fmt_bytes(r.bytes)} ({r.hotspots} hotspot group{'s' if r.hotspots != 1 else ''})"
            )
            if r.line:
                lines.append(f"     now:   {r.line.strip()}")
            if r.suggestion:
                label = "write:" if r.action == EDIT else "do:   "
                lines.append(f"     {label} {r.suggestion.strip()}")
            lines.append(f"     why:   {r.detail}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        saved = int(self.frame["bytes"].clip(lower=0).sum()) if len(self) else 0
        return f"<Fixes {len(self)} fixes, {saved} bytes to save>"

    def _repr_html_(self) -> str:
        return "<pre>" + str(self).replace("&", "&amp;").replace("<", "&lt;") + "</pre>"


def suggest_fixes(audit: Audit) -> Fixes:
    """One concrete fix for every hotspot of ``audit``, with the bytes it would save.

    Each hotspot is traced back to the op that caused it (a conversion inside a convolution is
    caused by whatever wrote its operand in the wrong format), and one fix covers a cause and
    every hotspot it causes, forward and backward. The fix is, in order of preference:

    * ``edit source``: the line with a ``.contiguous()`` (or ``contiguous_format``) and what to
      write there instead (needs an audit with ``record_source=True``);
    * ``swap module``: the module to replace by one that keeps the format (:data:`SWAPS`);
    * ``swap function``: a library function to rebind to torch's format-keeping op (a channel
      shuffle written with ``transpose(...).contiguous()`` -> ``F.channel_shuffle``);
    * ``keep region contiguous``: the convolutions around an op that cannot keep the format
      (a reshape that merges C, an op without a channels_last kernel), to run contiguous with
      :func:`keep_contiguous`; its ``bytes`` are net of the conversions moved to the edges.
    """
    if not isinstance(audit, Audit):
        raise TypeError(f"suggest_fixes expects an auditor.Audit, got {type(audit).__name__}")
    hot = audit.hotspots()
    ops = audit.ops()
    if hot.empty:
        return Fixes(pd.DataFrame(columns=FIX_COLUMNS), hot.assign(fix=pd.Series(dtype="int64")))
    flow = Flow(audit)
    hot_events = np.flatnonzero(ops["hotspot"].to_numpy())
    forward_of = {}  # (module, source) of a forward cause -> that cause
    causes = {}
    for e in hot_events:
        causes[int(e)] = flow.cause(int(e))
    for c in sorted(set(causes.values())):
        if flow.phase[c] == "forward":
            forward_of.setdefault((flow.module[c], flow.source[c]), c)
            forward_of.setdefault((flow.module[c], _function_of(flow.source[c])), c)
    # a backward cause belongs to the forward op of its autograd node: same module and line, or
    # failing that the same module and function (the backward of a view next to the copy)
    root = {}
    for e, c in causes.items():
        if flow.phase[c] != "forward":
            c = forward_of.get((flow.module[c], flow.source[c]),
                               forward_of.get((flow.module[c], _function_of(flow.source[c])), c))
        root[e] = c
    fixes: dict[tuple, dict] = {}
    event_fix: dict[int, tuple] = {}
    for e, c in root.items():
        key, spec = _fix_for(flow, c)
        if key not in fixes:
            fixes[key] = spec
        event_fix[e] = key
    keys = analysis.HOTSPOT_KEYS
    group_of = ops.loc[hot_events, keys].astype(str).apply(tuple, axis=1)
    hot_keys = hot[keys].astype(str).apply(tuple, axis=1)
    group_fix = {}
    for e, g in zip(hot_events, group_of):
        group_fix.setdefault(g, event_fix[int(e)])
    rows = []
    for key, spec in fixes.items():
        mine = [g for g, k in group_fix.items() if k == key]
        sel = hot[hot_keys.isin(mine)]
        fwd = int(sel.loc[sel["phase"] == "forward", "bytes"].sum())
        bwd = int(sel.loc[sel["phase"] != "forward", "bytes"].sum())
        added = spec.pop("added_bytes", 0)
        if added and (ops["phase"] == "backward").any():
            added *= 2  # the region's edges convert gradients too
        rows.append({**spec, "hotspots": len(sel), "count": int(sel["count"].sum()),
                     "hotspot_bytes": fwd + bwd, "added_bytes": int(added), "bytes": fwd + bwd - int(added),
                     "forward_bytes": fwd, "backward_bytes": bwd, "_key": key})
    frame = pd.DataFrame(rows)
    frame = frame.sort_values(["bytes", "hotspot_bytes"], ascending=False, kind="stable", ignore_index=True)
    frame.insert(0, "fix", np.arange(1, len(frame) + 1))
    number = dict(zip(frame["_key"], frame["fix"]))
    out_hot = hot.copy()
    out_hot["fix"] = [number[group_fix[k]] for k in hot_keys]
    return Fixes(frame[FIX_COLUMNS], out_hot)


def _fix_for(flow: Flow, c: int) -> tuple[tuple, dict]:
    """The fix for cause event ``c``: a key that merges causes one fix removes, and its row."""
    op, module, source = flow.op[c], flow.module[c], flow.source[c]
    ops = flow.ops
    mtype = str(ops.at[c, "module_type"])
    frm, to = str(ops.at[c, "from_format"]), str(ops.at[c, "to_format"])
    line = _source_line(source) if source else ""
    rank = _rank_of(flow, c)
    cl_name = "channels_last_3d" if rank == 5 else "channels_last"
    base = {"module": module, "module_type": mtype, "op": op, "source": source, "line": line,
            "suggestion": "", "region": ()}
    packet = rules.op_packet(op)
    what = f"{op} ({flow.kind[c]} {frm} -> {to})"

    if packet in rules.COPY_OPS and _is_channel_shuffle(flow, c, line, rank):
        module_name, func = _enclosing_function(source)
        if module_name and func:
            action, suggestion = FUNCTION, f"{module_name}.{func} = torch.nn.functional.channel_shuffle"
            where = f"{module_name}.{func} is a channel shuffle"
        else:
            action, suggestion = EDIT, "x = torch.nn.functional.channel_shuffle(x, groups)"
            where = f"{func or 'this code'} is a channel shuffle"
        return ("edit", source), {
            **base, "action": action, "suggestion": suggestion,
            "detail": f"{where} written as view -> transpose -> .contiguous() -> view, which writes "
                      f"contiguous order ({what}); torch.nn.functional.channel_shuffle (nn.ChannelShuffle) "
                      f"computes the same values and keeps {cl_name}",
        }

    if packet in rules.COPY_OPS and not _feeds_reshape(flow, c) and base_format(to) == "contiguous":
        fixed = _keep_format_in_line(line, cl_name)
        if source:
            detail = (f"{what} copies the activation into contiguous order between two convolutions; "
                      f"keep it {cl_name}" + (" (or remove the call: its input is already dense "
                                               f"{cl_name})" if frm == cl_name else ""))
            if not fixed:
                detail += f": give this copy memory_format=torch.{cl_name}"
            return ("edit", source), {**base, "action": EDIT, "suggestion": fixed, "detail": detail}
        return ("edit", module, op), {
            **base, "action": EDIT,
            "detail": f"{what} in {module}: a .contiguous() or .to(memory_format=...) copies the activation "
                      f"to contiguous; give it memory_format=torch.{cl_name} (audit with record_source=True "
                      "for the line)",
        }

    swap = _swappable(flow, c)
    if swap is not None:
        name, factory = swap
        mod_type = str(ops.loc[ops["module"].astype(str) == name, "module_type"].iloc[0])
        return ("swap", name), {
            **base, "module": name, "module_type": mod_type, "action": SWAP,
            "suggestion": f"{module_expr(name)} = {factory}({module_expr(name)})",
            "detail": f"{mod_type} has no {cl_name} kernel on this device: {what}; "
                      "the replacement computes the same values in the same format",
        }

    if flow.is_conv[c]:
        return ("conv", module), {
            **base, "action": WEIGHT,
            "suggestion": f"auditor.fix.convert_conv{rank - 2}d_weight_memory_format({module_expr(module)}, "
                          f"torch.{cl_name})",
            "detail": f"{module} computes in {frm} and hands its result to a {cl_name} convolution; "
                      "run it in the model's format",
        }

    region, added = _region_around(flow, c)
    names = ", ".join(repr(n) for n in region)
    why = ("a reshape that merges C with another dimension must copy a channels_last tensor"
           if packet in rules.COPY_OPS else f"{mtype or 'this op'} has no {cl_name} kernel on this device")
    return ("region", region or (module, op)), {
        **base, "action": REGION, "region": region,
        "suggestion": f"auditor.fix.keep_contiguous(model, [{names}])" if region else "",
        "detail": f"{why}: {what}; run the convolutions around it contiguous so no copy is needed "
                  f"(or let auditor.plan_layout measure whether that pays)",
        "added_bytes": added,
    }


def _keep_format_in_line(line: str, cl_name: str) -> str:
    """``line`` with its ``.contiguous()`` (or ``contiguous_format``) asking for ``cl_name``
    instead; comments are left alone. Empty when the line has neither."""
    code, comment = _split_comment(line)
    for pattern, repl in ((_CONTIGUOUS_CALL, f".contiguous(memory_format=torch.{cl_name})"),
                          (_CONTIGUOUS_FORMAT, f"torch.{cl_name}")):
        if pattern.search(code):
            return pattern.sub(repl, code) + comment
    return ""


def _split_comment(line: str) -> tuple[str, str]:
    """(code, comment) of one source line, the comment with the spaces before it."""
    try:
        for tok in tokenize.generate_tokens(io.StringIO(line + "\n").readline):
            if tok.type == tokenize.COMMENT:
                cut = tok.start[1]
                while cut > 0 and line[cut - 1] == " ":
                    cut -= 1
                return line[:cut], line[cut:]
    except (tokenize.TokenError, SyntaxError):
        pass  # a line of a multi-line statement: no comment detection
    return line, ""


def _rank_of(flow: Flow, e: int) -> int:
    """The rank of the convolutions' activations around ``e`` (4 or 5): a channel shuffle
    copies a 5-D view of 4-D activations, so ``e``'s own tensors can mislead."""
    nd = flow.tensors["ndim"].to_numpy()
    near = sorted(flow.upstream_convs(e) | flow.downstream_convs(e)) if not flow.is_conv[e] else [e]
    for x in near + [e]:
        for r in flow.act_rows.get(x, []):
            if nd[r] in (4, 5):
                return int(nd[r])
    return 4


def _is_channel_shuffle(flow: Flow, c: int, line: str, rank: int) -> bool:
    """A copy of a (N, g, C/g, H, W) transposed view: the classic channel shuffle."""
    t = flow.tensors
    rows = flow.act_rows.get(c, [])
    return bool(rows) and int(t["ndim"].to_numpy()[rows[0]]) == rank + 1 and (
        "transpose" in line or "permute" in line)


def _function_of(source: str) -> tuple[str, str | None]:
    """(file, enclosing module-level function) of a ``path:line`` source, for grouping."""
    path = source.rpartition(":")[0]
    return (path, _enclosing_function(source)[1]) if path else ("", None)


@functools.lru_cache(maxsize=4096)
def _enclosing_function(source: str) -> tuple[str | None, str | None]:
    """(importable module, function name) of the module-level function holding ``source``;
    the module is None when the file is not an imported module (a script, a notebook)."""
    path, _, line = source.rpartition(":")
    if not path or not line.isdigit():
        return None, None
    try:
        tree = ast.parse(open(path).read())
    except (OSError, SyntaxError, ValueError):
        return None, None
    func = next((node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                 and node.lineno <= int(line) <= (node.end_lineno or node.lineno)), None)
    real = os.path.realpath(path)
    module_name = next((name for name, mod in list(sys.modules.items())
                        if getattr(mod, "__file__", None) and os.path.realpath(mod.__file__) == real
                        and name != "__main__"), None)
    return module_name, func


def _feeds_reshape(flow: Flow, c: int) -> bool:
    """A copy whose only purpose is a reshape that channels_last cannot view (merging C)."""
    return any(rules.op_packet(flow.op[x]) in _RESHAPES for x in flow.consumers.get(c, []))


def _swappable(flow: Flow, c: int) -> tuple[str, str] | None:
    """(module name, factory) when ``c`` runs inside a module with a format-keeping swap."""
    ops = flow.ops
    name = flow.module[c]
    mtype = str(ops.at[c, "module_type"])
    for typ, (_, factory) in SWAPS.items():
        if typ.__name__ == mtype:
            return name, factory
    return None


def _region_around(flow: Flow, c: int) -> tuple[tuple[str, ...], int]:
    """The convolutions on both sides of cause ``c`` (found in forward), and the bytes the
    region's edges would then convert, per phase."""
    e = c
    if flow.phase[c] != "forward":
        same = np.flatnonzero((flow.phase == "forward") & (flow.module == flow.module[c]) & (flow.source == flow.source[c]))
        if not len(same):
            return (), 0
        e = int(same[0])
    convs = flow.upstream_convs(e) | flow.downstream_convs(e)
    names = sorted({flow.module[x] for x in convs if str(flow.ops.at[x, "module_type"]).startswith(("Conv", "ConvTranspose"))},
                   key=lambda n: min(x for x in convs if flow.module[x] == n))
    if not names:
        return (), 0
    inside = set(names)
    nbytes = flow.tensors["bytes"].to_numpy()
    added = 0
    for x in np.flatnonzero((flow.phase == "forward") & flow.is_conv):
        x = int(x)
        if flow.module[x] not in inside:
            continue
        # its input comes from a convolution outside the region: converted at the edge
        if any(flow.module[u] not in inside for u in flow.upstream_convs(x)):
            added += int(nbytes[flow.act_rows[x][0]])
        # its output feeds one outside: converted back at the edge
        if any(flow.module[d] not in inside for d in flow.downstream_convs(x)):
            added += _output_bytes(flow, x)
    return tuple(names), added


def _output_bytes(flow: Flow, e: int) -> int:
    t = flow.tensors
    sel = t[(t["seq"] == e) & (t["role"] == "output") & (t["position"] == 0)]
    return int(sel["bytes"].iloc[0]) if len(sel) else 0
