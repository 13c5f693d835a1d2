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

from ..recording import _rules as rules
from ..recording._formats import base_format
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
    inner = _inner_copy_us(hidden, n)
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
                  pass_bytes: list[float], cost: CopyCost | None) -> float:
    """What fixing a cause saves on its own ops ``own`` (events), by what its pattern's fix puts
    in their place (:attr:`.patterns.Pattern.replaces`): the format copies inside them; or, where the fix is
    one pass, their time less a pass over each of ``pass_bytes`` (at the ``cost`` of a copy);
    less a copy after the op (of ``pass_bytes``) where the fix adds one. NaN when the audit has
    no times."""
    if not timed(ops):
        return float("nan")
    if not own:
        return 0.0
    time = ops["time_us"].fillna(0.0).to_numpy()[own]
    inner = _inner_copy_us(hidden, len(ops))[own]
    rule = patterns.pattern(pattern).replaces
    replacement = cost.passes(pass_bytes) if cost is not None else 0.0
    if rule == patterns.WRITE:
        return float(max(inner.sum(), time.sum() - replacement))
    if rule == patterns.COPY_AFTER:
        return float(inner.sum() - replacement)
    return float(inner.sum())


def _inner_copy_us(hidden: pd.DataFrame, n: int) -> np.ndarray:
    """Per event, the time of the format copies its kernels made."""
    out = np.zeros(n)
    if hidden is None or hidden.empty:
        return out
    h = hidden[format_copies(hidden)]
    np.add.at(out, h["seq"].to_numpy(), h["time_us"].to_numpy())
    return out


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
