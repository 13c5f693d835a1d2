"""The audit as a Chrome trace (Trace Event Format JSON), for Perfetto and chrome://tracing.

One slice per op on a track per phase, coloured by what it did to the format, with its module,
source line, formats, bytes and time in its args; the copies an op's kernels made nested inside
it; and an arrow (a flow event) from each cause to each of its symptoms. Timed audits use the
profiler's start and kernel time of each op; untimed ones lay the ops out one microsecond each,
in order.
"""

from __future__ import annotations

import json
import math

import pandas as pd

from .._recording import _rules as rules

#: Chrome's reserved colour names, per kind.
COLOURS = {
    rules.LOSES: "terrible", rules.CONVERTS: "bad", rules.RESTORES: "yellow", rules.PRESERVES: "good",
    rules.VIEW: "grey", rules.AMBIGUOUS_KIND: "olive", rules.NOT_APPLICABLE: "generic_work",
}
#: One track per phase, in this order.
TRACKS = ("forward", "backward", "other")
PID = 0


def chrome_trace(ops: pd.DataFrame, hidden: pd.DataFrame, causes: pd.DataFrame) -> dict:
    """The trace as a dict (``json.dump`` it): ``traceEvents`` and ``displayTimeUnit``."""
    start, dur = _layout(ops)
    events: list[dict] = [{"name": "process_name", "ph": "M", "pid": PID, "args": {"name": "format audit"}}]
    for tid, phase in enumerate(TRACKS):
        events.append({"name": "thread_name", "ph": "M", "pid": PID, "tid": tid, "args": {"name": phase}})
        events.append({"name": "thread_sort_index", "ph": "M", "pid": PID, "tid": tid, "args": {"sort_index": tid}})
    track = {p: i for i, p in enumerate(TRACKS)}
    tid_of = [track.get(str(p), len(TRACKS) - 1) for p in ops["phase"]]
    for r in ops.itertuples():
        e = int(r.seq)
        kind = str(r.kind)
        events.append({
            "name": str(r.op), "cat": kind, "ph": "X", "ts": start[e], "dur": dur[e], "pid": PID, "tid": tid_of[e],
            "cname": COLOURS.get(kind, "generic_work"),
            "args": {k: v for k, v in {
                "seq": e, "module": str(r.module), "module_type": str(r.module_type), "source": str(r.source),
                "kind": kind, "from_format": str(r.from_format), "to_format": str(r.to_format),
                "in_format": str(r.in_format), "out_format": str(r.out_format), "bytes": int(r.bytes),
                "time_us": _number(getattr(r, "time_us", math.nan)), "hotspot": bool(r.hotspot),
                "cause": int(getattr(r, "cause", 0)),
            }.items() if v not in ("", None)},
        })
    events.extend(_hidden_slices(hidden, ops, start, dur, tid_of))
    events.extend(_cause_flows(ops, causes, start, dur, tid_of))
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def write_chrome_trace(trace: dict, path) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(trace, f)


def _number(x) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)


def _layout(ops: pd.DataFrame) -> tuple[list[float], list[float]]:
    """Each op's start and duration in µs: measured where the audit is timed, else 1 µs each."""
    n = len(ops)
    if "start_us" in ops and ops["start_us"].notna().any():
        start = ops["start_us"].to_numpy(dtype=float).copy()
        dur = ops["time_us"].to_numpy(dtype=float).copy()
        for e in range(n):  # unmatched ops: right after the op before them, for a moment
            if math.isnan(start[e]):
                start[e] = (start[e - 1] + dur[e - 1]) if e else 0.0
            if math.isnan(dur[e]):
                dur[e] = 0.001
        return start.tolist(), dur.tolist()
    return [float(e) for e in range(n)], [1.0] * n


def _hidden_slices(hidden, ops, start, dur, tid_of) -> list[dict]:
    """Each copy an op's kernels made, nested inside the op's slice."""
    out = []
    if hidden is None or hidden.empty:
        return out
    timed = "start_us" in ops and ops["start_us"].notna().any()
    for h in hidden.itertuples():
        e = int(h.seq)
        if timed and not math.isnan(h.start_us):
            ts, d = float(h.start_us), float(h.time_us)
        else:  # inside the op, for a moment
            ts, d = start[e], dur[e] / 4
        ts = min(max(ts, start[e]), start[e] + dur[e])
        d = max(0.0, min(d, start[e] + dur[e] - ts))
        out.append({
            "name": f"hidden copy ({h.kind})", "cat": "hidden", "ph": "X", "ts": ts, "dur": d, "pid": PID,
            "tid": tid_of[e], "cname": "bad" if str(h.kind) == "format" else "grey",
            "args": {"seq": e, "via": str(h.via), "arg": str(h.arg), "kind": str(h.kind),
                     "from_format": str(h.from_format), "to_format": str(h.to_format), "shape": str(h.shape),
                     "bytes": int(h.bytes), "time_us": _number(h.time_us)},
        })
    return out


def _cause_flows(ops, causes, start, dur, tid_of) -> list[dict]:
    """An arrow from each cause's first op to each of its symptoms (flow events ``s`` and
    ``f``, bound to the enclosing slices)."""
    out = []
    if causes is None or causes.empty or "cause" not in ops:
        return out
    cause_of = ops["cause"].to_numpy()
    flow = 0
    for c in causes.itertuples():
        origin = int(c.first_seq)
        for e in (int(x) for x in ops.index[cause_of == c.cause]):
            if e == origin:
                continue
            flow += 1
            name = f"cause {c.cause}: {c.pattern}"
            out.append({"name": name, "cat": "cause", "ph": "s", "id": flow, "pid": PID, "tid": tid_of[origin],
                        "ts": start[origin] + dur[origin] / 2})
            out.append({"name": name, "cat": "cause", "ph": "f", "bp": "e", "id": flow, "pid": PID,
                        "tid": tid_of[e], "ts": start[e] + dur[e] / 2})
    return out
