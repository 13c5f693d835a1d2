"""Proving a fix: the values it must keep, and the time it saves, measured.

A fix is verified when, applied, the re-audit shows its cause's hotspots gone, the step's forward
outputs and the gradients it leaves equal the original's within the dtype's tolerance
(:data:`TOLERANCE`), and the step was timed against the original's in interleaved rounds
(:mod:`auditor._measure`). The saving is the median of the paired ratios within rounds, with
its distribution-free interval; rounds go on until the interval lies on one side of 1 or the
budget is spent, and then the saving is "within noise": a cause can be real, removed for good,
and still cost less than this machine's noise.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .._measure._decide import MIN_ROUNDS, median_interval, ratios
from .._measure._harness import Rounds, default_clock, torch_threads
from .._recording._torch import pytree
from .._step import Step, copy_model

#: Largest difference allowed between a fixed step's values and the original's, relative to the
#: largest magnitude among the original's values of the same kind (its outputs, or its
#: gradients), by the dtype the comparison runs in. A verification compares in float64 when the
#: model runs there (copies of the model and inputs): what is left is the rounding of another
#: order of summation (a fix that keeps the format changes the order in which later reductions
#: read memory), which a batch norm over a handful of values can amplify a millionfold; in
#: float32 that amplified rounding can reach the values themselves.
TOLERANCE = {torch.float64: 1e-6, torch.float32: 1e-3, torch.float16: 5e-2, torch.bfloat16: 5e-2}
#: A model can amplify rounding past :data:`TOLERANCE`: its values then move by more than that
#: when its inputs move by a few units in the last place (:func:`rounding_sensitivity`). A fix may
#: move them up to this many times as much, since it reorders sums at many places, not one...
ROUNDING_FACTOR = 10
#: ...but never by more than this, relative: past it, a changed computation could hide in the noise.
ROUNDING_CAP = 1e-3

#: The verdicts of a verified fix.
HELPS, WITHIN_NOISE, HURTS, CHANGES_OUTPUTS, NOT_APPLIED = (
    "helps", "within noise", "hurts", "changes outputs", "not applied")
#: A fix that adds hotspot groups to the model run all-contiguous: it changes code (or modules)
#: that a contiguous run goes through too, so it is not made automatically.
HURTS_CONTIGUOUS = "hurts contiguous"
#: A cause left by hand whose hotspot groups the automatic fixes, made together, remove (its
#: data was a consequence of theirs), with the same values and no group moved elsewhere.
REMOVED_BY_OTHERS = "removed by the other fixes"


def contiguous_step(step: Step, model) -> Step:
    """``step`` run all-contiguous: ``model`` (a copy, changed in place) and the step's inputs in
    torch.contiguous_format, the inputs that require gradients still leaves that do."""
    if isinstance(model, torch.nn.Module):
        model.to(memory_format=torch.contiguous_format)

    def plain(t):
        if not isinstance(t, torch.Tensor) or t.is_contiguous():
            return t
        out = t.detach().contiguous()
        return out.requires_grad_() if t.requires_grad and t.is_leaf else out
    return step.replace(model=model, inputs=tuple(pytree.tree_map(plain, list(step.inputs))),
                        kwargs=pytree.tree_map(plain, dict(step.kwargs)))


def hurts_contiguous(before, after) -> bool:
    """Whether the contiguous run has more hotspot groups with the fix than without it."""
    try:
        return int(after) > int(before)
    except (TypeError, ValueError):
        return False


def parameter_names(model) -> dict[int, str]:
    """id(parameter) -> its name in ``model`` now: a fix that swaps a module keeps the module's
    Parameters under new names, and the gradients are compared by the names they had."""
    return {id(p): n for n, p in model.named_parameters()} if isinstance(model, torch.nn.Module) else {}


def step_values(step: Step, seed: int = 0, names: dict[int, str] | None = None) -> dict[str, torch.Tensor]:
    """What ``step`` computes, run once from ``seed``: its forward outputs and, with backward,
    the gradients it leaves on the model's parameters (by name, or by the name ``names`` gives
    each Parameter) and on the inputs that require them. The model's gradients are cleared
    first, so none from before is added in."""
    model = step.model
    params = dict(model.named_parameters()) if isinstance(model, torch.nn.Module) else {}
    if names:
        params = {names.get(id(p), n): p for n, p in params.items()}
    inputs = [t for t in step.inputs if isinstance(t, torch.Tensor) and t.requires_grad]
    for t in (*params.values(), *inputs):
        t.grad = None
    torch.manual_seed(seed)
    out = step.run()
    values = {f"output {i}": t for i, t in enumerate(pytree.tree_leaves(out)) if isinstance(t, torch.Tensor)}
    if step.backward:
        values.update({f"grad {n}": p.grad for n, p in params.items() if p.grad is not None})
        values.update({f"grad input {i}": t.grad for i, t in enumerate(inputs) if t.grad is not None})
    return {k: v.detach().clone() for k, v in values.items()}


@dataclass(frozen=True)
class Comparison:
    """Two runs' values side by side: whether they are the same within :data:`TOLERANCE`, the
    largest absolute and relative difference, and the value it was found in."""

    same: bool
    max_abs_diff: float
    max_rel_diff: float
    worst: str


def compare_values(before: dict[str, torch.Tensor], after: dict[str, torch.Tensor], floor: float = 0.0) -> Comparison:
    """The values of a fixed step against the original's (:func:`step_values`): the largest
    difference of each tensor, relative to the largest magnitude among the original's values of
    its kind (outputs, gradients), within :data:`TOLERANCE` of its dtype, or ``floor`` where that
    is larger (what rounding alone moves this model's values by)."""
    if before.keys() != after.keys():
        missing = sorted(set(before) ^ set(after))
        return Comparison(False, math.inf, math.inf, f"not in both: {', '.join(missing[:3])}")
    scale: dict[str, float] = {}
    for name, a in before.items():
        if a.is_floating_point() and a.numel():
            kind = name.split(" ")[0]
            scale[kind] = max(scale.get(kind, 0.0), float(a.double().abs().max()))
    same, worst_abs, worst_rel, worst = True, 0.0, 0.0, ""
    for name, a in before.items():
        b = after[name]
        if a.shape != b.shape:
            return Comparison(False, math.inf, math.inf, f"{name}: shape {tuple(a.shape)} -> {tuple(b.shape)}")
        if not a.is_floating_point():
            if not torch.equal(a, b):
                return Comparison(False, math.inf, math.inf, name)
            continue
        diff = float((a.double() - b.double()).abs().max()) if a.numel() else 0.0
        top = scale.get(name.split(" ")[0], 0.0)
        rel = diff / top if top > 0 else (0.0 if diff == 0 else math.inf)
        if rel > worst_rel or (rel == worst_rel and diff > worst_abs):
            worst_abs, worst_rel, worst = diff, rel, name
        same &= rel <= max(TOLERANCE.get(a.dtype, 1e-3), floor) and math.isfinite(diff)
    return Comparison(same, worst_abs, worst_rel, worst)


def rounding_sensitivity(step: Step, seed: int = 0, base: dict[str, torch.Tensor] | None = None) -> float:
    """How far rounding alone moves ``step``'s values: the largest relative change of its
    outputs and gradients (as :func:`compare_values` measures) when its floating inputs are
    scaled by 1 + 4 units in the last place of their dtype, or when the same step runs
    all-contiguous (:func:`contiguous_step`: the same sums, in the other kernels' orders, at
    every layer), times :data:`ROUNDING_FACTOR`, at most :data:`ROUNDING_CAP`. Batch norms over
    a handful of values amplify a change of the last place by up to a billionfold; a fix that
    reorders a sum is such a change, and a fix that keeps the format reorders sums at every
    layer after it, as the contiguous run does."""
    def nudged(t):
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            return t
        out = t.detach() * (1 + 4 * torch.finfo(t.dtype).eps)
        return out.requires_grad_() if t.requires_grad else out
    model = step.model
    if base is None:  # the step's own values, where the caller has not computed them already
        base = step_values(step.replace(model=copy_model(model)), seed)
    moved = step_values(step.replace(model=copy_model(model), inputs=tuple(nudged(t) for t in step.inputs),
                                     kwargs={k: nudged(v) for k, v in step.kwargs.items()}), seed)
    change = compare_values(base, moved).max_rel_diff
    try:
        plain = step_values(contiguous_step(step, copy_model(model)), seed)
    except Exception:  # a step that cannot run contiguous: the nudge alone
        plain = None
    if plain is not None:
        change = max(change, compare_values(base, plain).max_rel_diff)
    return min(ROUNDING_FACTOR * change, ROUNDING_CAP) if math.isfinite(change) else ROUNDING_CAP


def in_float64(step: Step) -> Step | None:
    """``step`` on float64 copies of its model and inputs (where its model is a module whose
    floating state is float32 or lower), or None where it is not such a module."""
    model = step.model
    if not isinstance(model, torch.nn.Module):
        return None
    floating = [t for t in (*model.parameters(), *model.buffers()) if t.is_floating_point()]
    if not floating or all(t.dtype == torch.float64 for t in floating):
        return None

    def up(t):
        return t.double() if isinstance(t, torch.Tensor) and t.is_floating_point() else t
    return step.replace(model=copy_model(model).double(), inputs=tuple(up(t) for t in step.inputs),
                        kwargs={k: up(v) for k, v in step.kwargs.items()})


def reference_values(step: Step, seed: int = 0) -> tuple[Step, dict[str, torch.Tensor]]:
    """The step the values are compared on, and the original's values there (:func:`step_values`,
    computed once per verification): its float64 copy (:func:`in_float64`) where the model runs
    there, else the step itself on a copy of its model. A model that makes float32 tensors of
    its own (a coordinate grid, ``.float()``) and mixes them with its activations raises in
    float64; its values are then compared in its own dtype, at that dtype's tolerance."""
    up = in_float64(step)
    if up is not None:
        try:
            return up, step_values(up.replace(model=copy_model(up.model)), seed)
        except RuntimeError:
            pass
    return step, step_values(step.replace(model=copy_model(step.model)), seed)


@dataclass(frozen=True)
class Saving:
    """A step timed before and after in interleaved rounds: medians per step (µs), the saving
    (before less after) from the median paired ratio, and its interval."""

    step_us_before: float
    step_us_after: float
    saving_us: float
    saving_low_us: float
    saving_high_us: float
    ratio: float  #: after / before, the median over rounds of the ratio within a round
    ratio_low: float
    ratio_high: float
    rounds: int
    resolved: bool  #: the interval lies on one side of 1
    clock: str


def measure_saving(before: Callable[[], object], after: Callable[[], object], *, rounds: int = MIN_ROUNDS,
                   max_rounds: int = 35, budget_s: float = 30.0, device: torch.device | str = "cpu") -> Saving:
    """Time ``before`` and ``after`` in interleaved rounds at one thread (process CPU time on a
    CPU): ``rounds`` first, then as many more at a time while the interval of the median ratio
    straddles 1, until ``max_rounds`` or ``budget_s`` seconds."""
    with torch_threads(1):
        clock = default_clock(device)
        start = time.perf_counter()
        taken = Rounds({"before": before, "after": after}, device=device).run(rounds)
        while True:
            times = taken.times(clock)
            paired = ratios(times["after"], times["before"])
            low, high = median_interval(paired)
            resolved = len(paired) >= MIN_ROUNDS and (high < 1 or low > 1)
            more = min(rounds, max_rounds - len(taken))
            if resolved or more <= 0 or time.perf_counter() - start > budget_s:
                break
            taken.run(more)
    med = statistics.median(paired)
    b, a = statistics.median(times["before"]), statistics.median(times["after"])
    return Saving(b, a, b * (1 - med), b * (1 - high), b * (1 - low), med, low, high, len(paired), resolved, clock)


#: A fix first timed ``hurts`` is timed again with this many times the rounds and the budget:
#: a step on a shared machine can seem slower for a few rounds, and a fix that stays slower is
#: not made automatically.
LONGER = 3


def longer(timing: dict) -> dict:
    """``timing`` (:func:`measure_saving`'s keywords) with :data:`LONGER` times the rounds and
    the budget."""
    rounds = timing.get("rounds", MIN_ROUNDS)
    return {**timing, "rounds": 2 * rounds, "max_rounds": LONGER * max(timing.get("max_rounds", 35), rounds),
            "budget_s": LONGER * timing.get("budget_s", 30.0)}


def slower(saving: Saving | None) -> bool:
    """Whether ``saving``'s whole interval says the step is slower with the fix."""
    return saving is not None and saving.resolved and saving.ratio_low > 1


def saving_words(saving: Saving) -> str:
    """``after/before 1.08 [1.03, 1.12], 21 rounds``."""
    return f"after/before {saving.ratio:.3g} [{saving.ratio_low:.3g}, {saving.ratio_high:.3g}], {saving.rounds} rounds"


def verdict(applied: bool, comparison: Comparison | None, saving: Saving | None,
            contiguous: tuple[object, object] | None = None) -> str:
    """``not applied``, ``changes outputs``, ``hurts contiguous`` (``contiguous``: the hotspot
    groups of the contiguous run before and after, more after), or from the time: ``helps``
    (the whole interval of after / before below 1), ``hurts`` (above 1), else ``within noise``."""
    if not applied:
        return NOT_APPLIED
    if comparison is not None and not comparison.same:
        return CHANGES_OUTPUTS
    if contiguous is not None and hurts_contiguous(*contiguous):
        return HURTS_CONTIGUOUS
    if saving is None or not saving.resolved:
        return WITHIN_NOISE
    return HELPS if saving.ratio_high < 1 else HURTS
