"""Measurements a plan is built from: each convolution alone in both formats, the ops after
each convolution, each conversion, and whole candidate layouts end to end."""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn

from .._fix._convert import CHANNELS_LAST_OF_RANK, convert_param
from .._measure._decide import Decision, decide, median_interval, ratios
from .._measure._harness import Rounds, median_times
from .._recording._torch import drop_forward_hooks
from .._step import Step, copy_model
from ._assign import CL_NAME, FORMAT_OF, apply_formats, converted_inputs, rank_names
from ._check import record
from ._graph import Call, Edge, owned_time_us

#: a standalone measurement's sample lasts at least this long (µs), so that preemption by
#: other processes averages out over both formats instead of hitting one sample in two
SAMPLE_US = 20_000.0


#: the same for a whole-model sample
MODEL_SAMPLE_US = 100_000.0


def conv_signature(mod: nn.Module, c: Call) -> tuple:
    """What a convolution's speed depends on: identical convolutions are measured once."""
    return (type(mod).__name__, c.input_shape, c.dtype, tuple(mod.weight.shape), mod.stride, mod.padding,
            mod.dilation, mod.groups, getattr(mod, "output_padding", None), mod.bias is not None,
            mod.padding_mode, str(mod.weight.device), c.from_model_input)


def conv_rounds(model: nn.Module, calls: list[Call], train: bool, device) -> tuple[list[tuple], dict[tuple, Rounds]]:
    """The signature of each call, and for each distinct signature a :class:`Rounds` of the
    convolution alone in both formats (warmed up and calibrated, no rounds taken yet): one
    measurement per signature, shared by every convolution that has it."""
    sigs, out = [], {}
    for c in calls:
        mod = model.get_submodule(c.module)
        key = conv_signature(mod, c)
        sigs.append(key)
        if key in out:
            continue
        rank = len(c.input_shape)
        fns = {}
        for fmt_name in ("contiguous", CL_NAME[rank]):
            fmt = FORMAT_OF[fmt_name]
            m = copy_model(mod)
            drop_forward_hooks(m)
            convert_param(m.weight, fmt)
            x = torch.randn(c.input_shape, dtype=c.dtype, device=m.weight.device).contiguous(memory_format=fmt)
            fns["contiguous" if fmt_name == "contiguous" else "channels_last"] = conv_step(
                m, x, train, needs_input_grad=not c.from_model_input)
        out[key] = Rounds(fns, min_sample_us=SAMPLE_US, device=device)
    return sigs, out


@dataclass
class ConvGroup:
    """Convolution modules whose calls have the same signatures: one measurement, one verdict,
    one format. ``counts``: calls per signature, over all members; ``fixed``: per format, the
    time of the ops after the members and of converting their inputs from fixed sources (the
    part of the decision not measured in the rounds)."""

    members: list[str]
    counts: dict[tuple, int]
    fixed: dict[str, float]
    decision: Decision | None = None
    shown: tuple[float, float, float] = (float("nan"), float("nan"), float("nan"))  # cl / contiguous

    def totals(self, rounds: dict[tuple, Rounds], clock: str) -> dict[str, list[float]]:
        """Per format, the group's time in each round: its convolutions' samples plus ``fixed``."""
        n = min(len(rounds[s]) for s in self.counts)
        out = {}
        for f in ("contiguous", "channels_last"):
            out[f] = [self.fixed[f] + sum(k * rounds[s].times(clock)[f][j] for s, k in self.counts.items())
                      for j in range(n)]
        return out

    def decide(self, rounds: dict[tuple, Rounds], clock: str, default: str, margin: float) -> Decision:
        t = self.totals(rounds, clock)
        alt = other_format(default)
        self.decision = decide(ratios(t[alt], t[default]), margin)
        shown = ratios(t["channels_last"], t["contiguous"])
        self.shown = (statistics.median(shown), *median_interval(shown)) if shown else self.shown
        return self.decision


def other_format(fmt: str) -> str:
    return "contiguous" if fmt == "channels_last" else "channels_last"


def conv_groups(names: list[str], calls: list[Call], sigs: list[tuple], fixed: dict[str, dict[str, float]]) -> list[ConvGroup]:
    """The modules grouped by the signatures of their calls, in order of first call."""
    per_module: dict[str, Counter] = {n: Counter() for n in names}
    for c, s in zip(calls, sigs):
        per_module[c.module][s] += 1
    groups: dict[tuple, ConvGroup] = {}
    for n in names:
        key = tuple(sorted(per_module[n].items(), key=repr))
        g = groups.setdefault(key, ConvGroup([], Counter(), {"contiguous": 0.0, "channels_last": 0.0}))
        g.members.append(n)
        g.counts.update(per_module[n])
        for f in g.fixed:
            g.fixed[f] += fixed[n][f]
    return list(groups.values())


def decide_groups(groups: list[ConvGroup], rounds: dict[tuple, Rounds], *, clock: str, default: str,
                  margin: float, repeats: int, max_repeats: int, tick: Callable[[int], None] = lambda n: None) -> None:
    """Take ``repeats`` rounds of every signature, then more, ``repeats`` at a time, for the
    signatures of every group whose decision is still within noise, until each is clear or has
    ``max_repeats`` rounds. Sets each group's ``decision``."""
    step = max(1, repeats)
    want = {s: repeats for s in rounds}
    while True:
        for s, r in rounds.items():
            if len(r) < want[s]:
                n = want[s] - len(r)
                r.run(n)
                tick(n)
        pending = [g for g in groups if g.decide(rounds, clock, default, margin).within_noise
                   and min(len(rounds[s]) for s in g.counts) < max_repeats]
        if not pending:
            return
        for g in pending:
            for s in g.counts:
                want[s] = max(want[s], min(max_repeats, len(rounds[s]) + step))


def conv_medians(rounds: dict[tuple, Rounds], clock: str) -> dict[tuple, dict[str, float]]:
    """Median time of each signature in both formats, over every round taken."""
    return {s: {f: statistics.median(v) for f, v in r.times(clock).items()} for s, r in rounds.items()}


def conv_step(m: nn.Module, x: torch.Tensor, train: bool, needs_input_grad: bool) -> Callable[[], object]:
    """One convolution alone, timed: its forward, and in training its backward from a random
    upstream gradient (its input's gradient only when it needs one)."""
    if not train:
        return Step(m, (x,), backward=False).timed()
    x = x.detach().requires_grad_(needs_input_grad)
    with torch.no_grad():
        grad = torch.randn_like(m(x))
    return Step(m, (x,), loss_fn=_itself, gradient=grad).timed()


def _itself(output):
    return output


def conversion_times(edges: list[Edge], repeats: int, device, clock,
                     tick: Callable[[int], None] = lambda n: None) -> dict[tuple, dict[str, float]]:
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
                         min_sample_us=SAMPLE_US, device=device, clock=clock)
        out[key] = t
        tick(1)
    return out


def ops_between_convs(structure, cl_step: Step, c_step: Step, names, planned, given, recordings,
                      tick: Callable[[int], None] = lambda n: None):
    """Median time of the ops each convolution's output goes through, in both uniform formats,
    over ``recordings`` timed audits each of the all channels_last and all contiguous steps
    (the structure audit is the first channels_last one)."""
    owned = {"channels_last": [owned_time_us(structure, planned, given)], "contiguous": []}
    for i in range(recordings):
        if i:
            owned["channels_last"].append(owned_time_us(record(cl_step, True), planned, given))
            tick(1)
        owned["contiguous"].append(owned_time_us(record(c_step, True), planned, given))
        tick(1)
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


def candidate_rounds(step: Step, options, ranks, calls, device) -> tuple[Rounds, dict[str, str]]:
    """Each candidate labelling applied to a copy of ``step``'s model, ready to be timed end to
    end in interleaved rounds; identical labellings are timed once. Returns the rounds and, per
    candidate, the name it is timed under."""
    fns, seen, timed_as = {}, {}, {}
    for name, labels in options.items():
        key = tuple(sorted(labels.items()))
        if key not in seen:
            seen[key] = name
            m = copy_model(step.model)
            formats = rank_names(labels, ranks)
            apply_formats(m, formats, converted_inputs(formats, calls))
            fns[name] = step.replace(model=m).timed()
        timed_as[name] = seen[key]
    return Rounds(fns, min_sample_us=MODEL_SAMPLE_US, device=device), timed_as
