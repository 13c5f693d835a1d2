"""What the format costs in time: per hotspot op, the part of its kernel time spent on the format,
and per cause, the step time a fix is expected to save.

Times are the profiler's (``time_us``, the op's kernels without the recorder's Python), and the
copies inside an op (``Audit.hidden``). A fix removes a cause and its symptoms; what it saves
on each symptom depends on what the fixed op would still do (:func:`saving_us`):

* a copy into another format (a conversion or a restore) disappears: its whole time;
* a convolution that permutes an operand, or an op that converts its input inside its kernels,
  keeps its work and loses the copy: the time of its hidden format copies (where they were not
  profiled, a copy of its bytes at the cost this audit's own copies took, :func:`copy_cost`);
* an op whose operands came in mixed formats runs at the rate the same op ran at when they did
  not: its time less that.

On the cause's own ops (the op at the line, the ops its pattern removes with it, and the
backward of both) the fix puts what its pattern's fix text says (:func:`own_saving_us`,
:attr:`.patterns.Pattern.replaces`): one pass that writes the result in the format, a copy after the op, or
the same ops without the format copies inside them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from .._recording import _rules as rules
from .._recording._formats import base_format
from . import _patterns as patterns
from ._activations import op_flags

#: Hidden copies that move data for the format: a dense tensor copied into another format, or a
#: view in one definite format made dense in another (not a broadcast or a transpose made dense).
FORMAT_COPY_KINDS = ("format", "materialize")
_DEFINITE = ("contiguous", "channels_last", "channels_last_3d")


@dataclass(frozen=True)
class CopyCost:
    """What copying ``n`` bytes takes on this machine, fitted to the audit's own copies (its
    explicit copies and those inside its ops): a cost per call and a cost per byte."""

    call_us: float
    byte_us: float

    def __call__(self, nbytes) -> float:
        """µs for one copy of ``nbytes`` (0 for nothing)."""
        return self.call_us + self.byte_us * nbytes if nbytes > 0 else 0.0

    def passes(self, nbytes: list[float]) -> float:
        """µs for one pass over each of ``nbytes``."""
        return float(sum(self(b) for b in nbytes))


def copy_cost(ops: pd.DataFrame, hidden: pd.DataFrame | None, result_bytes: np.ndarray) -> CopyCost | None:
    """The least-squares line through (bytes, µs) of the audit's copies: every copy op and every
    copy inside an op that moved bytes. None when the audit has no times or no copies. A fit
    that is not increasing falls back to the mean µs per byte."""
    if not timed(ops):
        return None
    keep = op_flags(ops["op"], rules.is_copy) & (result_bytes > 0) & ops["time_us"].notna().to_numpy()
    nbytes = [result_bytes[keep].astype(np.float64)]
    times = [ops["time_us"].to_numpy()[keep]]
    if hidden is not None and len(hidden):
        h = hidden[(hidden["bytes"] > 0).to_numpy() & hidden["time_us"].notna().to_numpy()]
        nbytes.append(h["bytes"].to_numpy(np.float64))
        times.append(h["time_us"].to_numpy())
    x, y = np.concatenate(nbytes), np.concatenate(times)
    if not len(x):
        return None
    if len(np.unique(x)) >= 2:
        call, per_byte = np.linalg.lstsq(np.c_[np.ones_like(x), x], y, rcond=None)[0]
        if per_byte > 0 and call >= 0:
            return CopyCost(float(call), float(per_byte))
    return CopyCost(0.0, float(y.sum() / x.sum()))


@dataclass(frozen=True)
class PassCost:
    """What one pass over ``n`` bytes that keeps its format takes on this machine: the µs per
    byte of the audit's own format-keeping ops of about that size (the fix's add or pool runs
    like them), the median over those within :data:`NEAR` of ``n`` (else the nearest
    :data:`FEW`), so that no one slow call sets it."""

    nbytes: np.ndarray
    us: np.ndarray

    def __call__(self, nbytes: float) -> float:
        if nbytes <= 0:
            return 0.0
        distance = np.abs(np.log(self.nbytes) - np.log(nbytes))
        near = distance <= np.log(NEAR)
        if near.sum() < FEW:
            near = np.argsort(distance, kind="stable")[:FEW]
        return float(np.median(self.us[near] / self.nbytes[near]) * nbytes)

    def passes(self, nbytes: list[float]) -> float:
        """µs for one pass over each of ``nbytes``."""
        return float(sum(self(b) for b in nbytes))


#: a pass is priced by the format-keeping ops within this factor of its size ...
NEAR = 2.0
#: ... or by this many of the nearest, where fewer are that near
FEW = 5


def pass_cost(ops: pd.DataFrame, events: np.ndarray, moved: list[float]) -> PassCost | None:
    """The :class:`PassCost` of the audit's format-keeping ops ``events`` (neither convolutions
    nor copies: their work is not a pass) that move ``moved`` bytes each; None when none was
    timed. A copy is no measure of a pass: the audit's copies change the memory order, and a
    copy that permutes takes 10-30x a pass that keeps it (an add of two channels_last 128x16x16
    maps: 7 µs; converting one: 100 µs)."""
    if not timed(ops) or not len(events):
        return None
    us = ops["time_us"].to_numpy()[events]
    nbytes = np.asarray(moved, dtype=np.float64)
    keep = (nbytes > 0) & (us > 0)
    return PassCost(nbytes[keep], us[keep]) if keep.any() else None


def timed(ops: pd.DataFrame) -> bool:
    """Whether the audit has the profiler's kernel times."""
    return "time_us" in ops and bool(ops["time_us"].notna().any())


def saving_us(ops: pd.DataFrame, hidden: pd.DataFrame | None, result_bytes: np.ndarray,
              cost: CopyCost | None) -> np.ndarray:
    """Per event, the time a fix of its cause would save on it as a symptom (0 for ops that are
    no hotspots and for losses an op writes itself, which :func:`own_saving_us` prices; NaN
    where the audit has no times). ``result_bytes``: per event, the bytes of its result;
    ``cost``: :func:`copy_cost`."""
    n = len(ops)
    if not timed(ops):
        return np.full(n, np.nan)
    time = ops["time_us"].fillna(0.0).to_numpy()
    kind = ops["kind"].astype(str).to_numpy()
    op = ops["op"].astype(str).to_numpy()
    hot = ops["hotspot"].to_numpy()
    is_conv = ops["is_conv"].to_numpy()
    copy = op_flags(ops["op"], rules.is_copy)
    nbytes = ops["bytes"].to_numpy().astype(np.float64)
    inner = _inner_copy_us(hidden, ops)
    same_format = _same_format_calls(ops, result_bytes)
    out = np.zeros(n)
    for e in np.flatnonzero(hot):
        if copy[e]:
            out[e] = time[e]
        elif is_conv[e] or inner[e] > 0:
            out[e] = inner[e] if inner[e] > 0 or cost is None else min(time[e], cost(nbytes[e]))
        elif kind[e] in (rules.CONVERTS, rules.RESTORES):
            fixed = _same_format_us(same_format.get(op[e]), float(result_bytes[e]))
            out[e] = max(0.0, time[e] - fixed) if fixed == fixed else time[e] * 0.5
        else:  # a loss written by the op itself: the cause's own op
            out[e] = 0.0
    return out


def own_saving_us(ops: pd.DataFrame, hidden: pd.DataFrame | None, pattern: str, own: list[int],
                  pass_bytes: list[float], cost: CopyCost | None, one_pass: PassCost | None = None) -> float:
    """What fixing a cause saves on its own ops ``own`` (events), by what its pattern's fix puts
    in their place (:attr:`.patterns.Pattern.replaces`): the format copies inside them; or, where the fix is
    one pass, their time less a pass over each of ``pass_bytes`` (at ``one_pass``,
    :func:`pass_cost`, else the ``cost`` of a copy); less a copy after the op (of ``pass_bytes``,
    at the ``cost`` of a copy: it changes the format) where the fix adds one. NaN when the audit
    has no times."""
    if not timed(ops):
        return float("nan")
    if not own:
        return 0.0
    time = ops["time_us"].fillna(0.0).to_numpy()[own]
    inner = _inner_copy_us(hidden, ops)[own]
    rule = patterns.pattern(pattern).replaces
    if rule == patterns.WRITE:
        priced = one_pass or cost
        return float(max(inner.sum(), time.sum() - (priced.passes(pass_bytes) if priced is not None else 0.0)))
    if rule == patterns.COPY_AFTER:
        return float(inner.sum() - (cost.passes(pass_bytes) if cost is not None else 0.0))
    return float(inner.sum())


def _inner_copy_us(hidden: pd.DataFrame, ops: pd.DataFrame) -> np.ndarray:
    """Per event, the time of the format copies its kernels made that a fix removes
    (:func:`removable_copies`)."""
    out = np.zeros(len(ops))
    if hidden is None or hidden.empty:
        return out
    h = hidden[removable_copies(hidden, ops)]
    np.add.at(out, h["seq"].to_numpy(), h["time_us"].to_numpy())
    return out


def removable_copies(hidden: pd.DataFrame, ops: pd.DataFrame) -> np.ndarray:
    """Which hidden copies a fix removes: format copies (:func:`format_copies`), less those in a
    hotspot that the same op also makes, of the same argument between the same formats, in its calls that are no
    hotspot. Those stay when the operands come in the format: a convolution's backward that
    writes its weight gradient contiguous and converts it into the weight's format does so in
    every call (at batch 2 in a selective-kernel ResNet they took 4.5 ms of a 46 ms step, and
    counting them made the estimate 18x what the fix saved)."""
    copies = format_copies(hidden)
    seq = hidden["seq"].to_numpy()
    hot = ops["hotspot"].to_numpy().astype(bool)[seq]
    arg = hidden["arg"].astype(str).to_numpy() if "arg" in hidden else np.full(len(hidden), "")
    key = pd.MultiIndex.from_arrays([
        ops["op"].astype(str).to_numpy()[seq], arg,
        [base_format(f) for f in hidden["from_format"].astype(str)],
        [base_format(f) for f in hidden["to_format"].astype(str)]])
    everywhere = key.isin(key[copies & ~hot])
    return copies & ~(hot & everywhere)


def format_copies(hidden: pd.DataFrame) -> np.ndarray:
    """Which hidden copies moved data into another format (:data:`FORMAT_COPY_KINDS`)."""
    kind = hidden["kind"].astype(str).to_numpy()
    src = np.array([base_format(f) for f in hidden["from_format"].astype(str)], dtype=object)
    dst = np.array([base_format(f) for f in hidden["to_format"].astype(str)], dtype=object)
    definite = np.isin(src, _DEFINITE) & np.isin(dst, _DEFINITE)
    return (kind == "format") | ((kind == "materialize") & definite & (src != dst))


def _same_format_calls(ops: pd.DataFrame, result_bytes: np.ndarray) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per op, (result bytes, µs) of its calls whose operands came in one format."""
    keep = (ops["kind"].to_numpy() == rules.PRESERVES) & ops["time_us"].notna().to_numpy() & (result_bytes > 0)
    frame = pd.DataFrame({"op": ops["op"].astype(str).to_numpy()[keep], "bytes": result_bytes[keep],
                          "time": ops["time_us"].to_numpy()[keep]})
    return {o: (g["bytes"].to_numpy(np.float64), g["time"].to_numpy()) for o, g in frame.groupby("op")}


def _same_format_us(calls: tuple[np.ndarray, np.ndarray] | None, nbytes: float) -> float:
    """What an op takes for a result of ``nbytes`` when its operands come in one format: its
    call among ``calls`` with the nearest result size, scaled to ``nbytes`` (NaN: none)."""
    if calls is None or nbytes <= 0:
        return float("nan")
    sizes, times = calls
    k = int(np.argmin(np.abs(np.log(sizes) - np.log(nbytes))))
    return float(times[k] * nbytes / sizes[k])


#: a step whose kernels take less than this (µs) in all, or whose ops write less than
#: :data:`TINY_STEP_BYTES`: its times are per-call costs (the profiler's own, the dispatcher's,
#: a thread pool's wake-up), not the bytes a fix stops moving
TINY_STEP_US = 1000.0
TINY_STEP_BYTES = 1 << 20
#: a call is an outlier when it takes more than this many times the median of its like calls
OUTLIER = 4.0
#: ... and an estimate rests on it when it gives more than this share of it
RESTS_ON = 0.5


def _time(us: float) -> str:
    """µs in the unit the report writes it in (``975 µs``, ``1.0 ms``, ``2.5 s``)."""
    return f"{us:.0f} µs" if us < 1e3 else f"{us / 1e3:.1f} ms" if us < 1e6 else f"{us / 1e6:.1f} s"


def _size(nbytes: float) -> str:
    """Bytes in the unit the report writes them in (``141.3 kB``, ``1.0 MB``)."""
    return (f"{nbytes:.0f} B" if nbytes < 1e3 else f"{nbytes / 1e3:.1f} kB" if nbytes < 1e6
            else f"{nbytes / 1e6:.1f} MB" if nbytes < 1e9 else f"{nbytes / 1e9:.1f} GB")


def estimate_note(ops: pd.DataFrame, result_bytes: np.ndarray, parts: dict[int, float], saving: float,
                  hotspots: int) -> tuple[bool, str]:
    """(whether a cause's ``saving`` can be trusted, why not, or why it is 0 with ``hotspots``).

    ``parts``: per event, what it adds to the saving (a symptom's saving, an own op's time).
    Not trusted: no times; a tiny step (:data:`TINY_STEP_US`, :data:`TINY_STEP_BYTES`); a saving that rests on one call
    (:data:`RESTS_ON`) that took :data:`OUTLIER` times its like calls in the step (the same
    op and kind, a result within :data:`NEAR` of its size): a page fault or a first call that
    the steps a user runs do not pay."""
    if not timed(ops) or saving != saving:
        return False, "not timed"
    step, written = float(np.nansum(ops["time_us"].to_numpy())), float(result_bytes.sum())
    if step < TINY_STEP_US or written < TINY_STEP_BYTES:
        return False, (f"a tiny step: its kernels take {_time(step)} and write {_size(written)} in all (a step under "
                       f"{_time(TINY_STEP_US)} or {_size(TINY_STEP_BYTES)} is tiny): at this size per-call costs, not "
                       "the bytes a fix stops moving, set the times")
    outlier = _outlier(ops, result_bytes, parts)
    if outlier:
        return False, outlier
    if saving == 0 and hotspots:
        return True, ("0: what a fix replaces took no longer than its replacement, and its symptoms made no "
                      "format copy that the same ops do not also make where the format is kept")
    return True, ""


#: why a timed audit's estimates are not trusted when no step ran before the recorded one
FIRST_STEP = ("no step ran before the recorded one (warmup=0): if it is the first in the process, its times "
              "include setting up kernels and memory")


def after_warmup(causes: pd.DataFrame, warmup: int | None) -> pd.DataFrame:
    """``causes`` as far as their estimates can be believed after ``warmup`` unrecorded steps
    (None: not known): with none (0), a timed step may be the first in the process, whose times
    include setting kernels and memory up, so no estimate is trusted and each note says why."""
    if warmup != 0 or not len(causes) or not causes["saving_us"].notna().any():
        return causes
    return causes.assign(saving_trusted=False,
                         saving_note=[f"{FIRST_STEP}; {n}" if n else FIRST_STEP for n in causes["saving_note"]])


def _outlier(ops: pd.DataFrame, result_bytes: np.ndarray, parts: dict[int, float]) -> str:
    """Why the estimate rests on one slow call, or ''."""
    total = sum(v for v in parts.values() if v > 0)
    if total <= 0:
        return ""
    e, part = max(parts.items(), key=lambda kv: kv[1])
    if part <= RESTS_ON * total:
        return ""
    op = ops["op"].astype(str).to_numpy()
    time = ops["time_us"].to_numpy()
    size = result_bytes
    kind = ops["kind"].astype(str).to_numpy()
    # like calls: the same op doing the same to formats (a call slow because its operands came
    # in mixed formats is what the estimate prices, not an outlier), of about the same size
    like = (op == op[e]) & (kind == kind[e]) & (np.abs(np.log(np.maximum(size, 1)) - np.log(max(size[e], 1)))
                                                 <= np.log(NEAR))
    like[e] = False
    like &= ~np.isnan(time)
    if like.sum() < 2:
        return ""
    usual = float(np.median(time[like]))
    if time[e] <= OUTLIER * max(usual, 1e-3):
        return ""
    return (f"{part / total:.0%} of it is one call of {op[e].removeprefix('aten.')} that took {time[e]:.0f} µs, "
            f"{time[e] / max(usual, 1e-3):.0f}x its {int(like.sum())} like calls in this step: audit again")


#: op times may add up to this share over the step's span before they are called inconsistent
#: (the profiler's and the process clocks round differently)
SPAN_SLACK = 1.001


def step_us(ops: pd.DataFrame) -> float:
    """The recorded step's span: from its first op's start to its last op's end (NaN untimed)."""
    if not timed(ops) or "start_us" not in ops:
        return float("nan")
    start = ops["start_us"].to_numpy(dtype=np.float64)
    end = start + ops["time_us"].fillna(0.0).to_numpy(dtype=np.float64)
    return float(np.nanmax(end) - np.nanmin(start)) if np.isfinite(start).any() else float("nan")


def times_note(ops: pd.DataFrame) -> str:
    """Why the ops' times cannot be shown as parts of the step, or '': the first sanity rule
    (docs, "The time model"): no time shown for a set of ops may exceed the step it is part of, and
    every set shown (hotspots, a cause, a module) is part of all the ops."""
    if not timed(ops):
        return ""
    span = step_us(ops)
    total = float(np.nansum(ops["time_us"].to_numpy(dtype=np.float64)))
    if span == span and total > span * SPAN_SLACK:
        return (f"the ops' times add up to {total / 1e3:.1f} ms, more than the {span / 1e3:.1f} ms the step took "
                "from its first op to its last: they overlap (ops timed on several threads at once), so no "
                "time of theirs is shown as a part of the step")
    return ""


def within_step(causes: pd.DataFrame, ops: pd.DataFrame) -> pd.DataFrame:
    """``causes`` with both sanity rules enforced where their numbers are made: where the ops'
    times exceed the step (:func:`times_note`) no estimate is trusted; and no saving exceeds the
    time of the ops it removes (a cause's ``time_us``): a larger one is cut to it and not
    trusted, its note saying why. An untrusted estimate is shown as its note, not a number."""
    if not len(causes) or "saving_us" not in causes or not causes["saving_us"].notna().any():
        return causes
    saving = causes["saving_us"].to_numpy(dtype=np.float64).copy()
    removed = causes["time_us"].to_numpy(dtype=np.float64)
    trusted = causes["saving_trusted"].to_numpy(dtype=bool).copy()
    notes = [str(n) for n in causes["saving_note"]]
    over = np.flatnonzero(saving > removed * SPAN_SLACK)
    for i in over:
        why = (f"the estimate ({saving[i]:.0f} µs) came to more than the {removed[i]:.0f} µs its ops take: "
               "the times it rests on disagree, so it is not shown")
        notes[i] = f"{why}; {notes[i]}" if notes[i] else why
        saving[i], trusted[i] = removed[i], False
    whole = times_note(ops)
    if whole:
        for i in range(len(notes)):
            if whole not in notes[i]:
                notes[i] = f"{whole}; {notes[i]}" if notes[i] else whole
        trusted[:] = False
    return causes.assign(saving_us=saving, saving_trusted=trusted, saving_note=notes)
