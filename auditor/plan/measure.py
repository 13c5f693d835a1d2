"""Measurements a plan is built from: each convolution alone in both formats, the ops after
each convolution, each conversion, and whole candidate layouts end to end."""

from __future__ import annotations

import copy
import statistics
from collections.abc import Callable

import torch
import torch.nn as nn

from ..fix.convert import CHANNELS_LAST_OF_RANK, convert_param
from . import timing
from .assign import CL_NAME, FORMAT_OF, apply_formats, converted_inputs, rank_names
from .check import record
from .graph import Call, Edge, owned_time_us
from .timing import median_times, step_fn, time_interleaved


def conv_signature(mod: nn.Module, c: Call) -> tuple:
    """What a convolution's speed depends on: identical convolutions are measured once."""
    return (type(mod).__name__, c.input_shape, c.dtype, tuple(mod.weight.shape), mod.stride, mod.padding,
            mod.dilation, mod.groups, getattr(mod, "output_padding", None), mod.bias is not None,
            mod.padding_mode, str(mod.weight.device), c.from_model_input)


def conv_times(model: nn.Module, calls: list[Call], train: bool, repeats: int, device, clock) -> dict[tuple, dict[str, float]]:
    """Standalone time of each distinct convolution signature in both formats."""
    out = {}
    for c in calls:
        mod = model.get_submodule(c.module)
        key = conv_signature(mod, c)
        if key in out:
            continue
        rank = len(c.input_shape)
        fns = {}
        for fmt_name in ("contiguous", CL_NAME[rank]):
            fmt = FORMAT_OF[fmt_name]
            m = copy.deepcopy(mod)
            m._forward_pre_hooks.clear()
            m._forward_hooks.clear()
            convert_param(m.weight, fmt)
            x = torch.randn(c.input_shape, dtype=c.dtype, device=m.weight.device).contiguous(memory_format=fmt)
            fns[fmt_name] = conv_step(m, x, train, needs_input_grad=not c.from_model_input)
        t = median_times(fns, repeats, min_sample_us=timing.SAMPLE_US, device=device, clock=clock)
        out[key] = {"contiguous": t["contiguous"], "channels_last": t[CL_NAME[rank]]}
    return out


def conv_step(m: nn.Module, x: torch.Tensor, train: bool, needs_input_grad: bool) -> Callable[[], object]:
    if not train:
        def infer():
            with torch.no_grad():
                return m(x)
        return infer
    x = x.detach().requires_grad_(needs_input_grad)
    with torch.no_grad():
        grad = torch.randn_like(m(x))

    def step():
        x.grad = None
        for p in m.parameters():
            p.grad = None
        m(x).backward(grad)
    return step


def conversion_times(edges: list[Edge], repeats: int, device, clock) -> dict[tuple, dict[str, float]]:
    """Time of converting each distinct (shape, dtype) to each format."""
    out = {}
    for e in edges:
        key = (e.shape, e.dtype)
        if key in out or len(e.shape) not in (4, 5):
            continue
        cl = CHANNELS_LAST_OF_RANK[len(e.shape)]
        c_src = torch.randn(e.shape, dtype=e.dtype, device=device)
        cl_src = c_src.contiguous(memory_format=cl)
        t = median_times({"channels_last": lambda s=c_src, f=cl: s.contiguous(memory_format=f),
                          "contiguous": lambda s=cl_src: s.contiguous()}, repeats,
                         min_sample_us=timing.SAMPLE_US, device=device, clock=clock)
        out[key] = t
    return out


def ops_between_convs(structure, cl_run, c_run, names, planned, given, train, loss_fn, recordings):
    """Median time of the ops each convolution's output goes through, in both uniform formats,
    over ``recordings`` timed audits each (the structure audit is the first channels_last one)."""
    owned = {"channels_last": [owned_time_us(structure, planned, given)], "contiguous": []}
    for i in range(recordings):
        if i:
            owned["channels_last"].append(owned_time_us(record(*cl_run, train, loss_fn, True), planned, given))
        owned["contiguous"].append(owned_time_us(record(*c_run, train, loss_fn, True), planned, given))
    return {f: {n: statistics.median(d.get(n, 0.0) for d in owned[f]) for n in names} for f in owned}


def border_costs(edges: list[Edge], times: dict, names: list[str], train: bool):
    """Conversion costs: per convolution, what its input costs to convert when it arrives from
    a fixed source in the other format (``fixed[name][format]``), and per pair of
    convolutions, what a border between them costs in each direction (``pair[(a, b)]``)."""
    scale = 2.0 if train else 1.0  # a conversion in forward has its mirror in backward
    fixed = {n: {"contiguous": 0.0, "channels_last": 0.0} for n in names}
    pair: dict[tuple, dict[str, float]] = {}
    for e in edges:
        t = times.get((e.shape, e.dtype))
        if t is None or e.a == e.b:
            continue
        if e.a is None:
            src = "channels_last" if e.fixed.startswith("channels_last") else e.fixed
            if src in ("contiguous", "channels_last"):
                other = "channels_last" if src == "contiguous" else "contiguous"
                fixed[e.b][other] += scale * t[other]
            continue
        cost = pair.setdefault((e.a, e.b), {"c_to_cl": 0.0, "cl_to_c": 0.0})
        cost["c_to_cl"] += scale * t["channels_last"]
        cost["cl_to_c"] += scale * t["contiguous"]
    return fixed, pair


def measure_candidates(model, inputs, options, ranks, calls, train, loss_fn, repeats, device, clock):
    """Each candidate labelling applied to a copy of ``model`` and timed end to end, interleaved:
    ``{name: (time, spread, faults)}``; identical labellings are timed once."""
    fns, seen = {}, {}
    for name, labels in options.items():
        key = tuple(sorted(labels.items()))
        if key in seen:
            continue
        seen[key] = name
        m = copy.deepcopy(model)
        formats = rank_names(labels, ranks)
        apply_formats(m, formats, converted_inputs(formats, calls))
        fns[name] = step_fn(m, inputs, train, loss_fn)
    t = time_interleaved(fns, repeats, min_sample_us=timing.MODEL_SAMPLE_US, device=device)
    return {name: (float(t.at[seen[key], f"{clock}_us"]), float(t.at[seen[key], f"{clock}_spread"]),
                   float(t.at[seen[key], "faults"]))
            for name, key in ((n, tuple(sorted(lab.items()))) for n, lab in options.items())}
