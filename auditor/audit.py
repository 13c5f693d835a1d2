"""``Audit``: the result of a recording. Plain DataFrames plus a facade over the analyzers."""

from __future__ import annotations

import pandas as pd

from . import analysis, log
from .recorder import RawLog


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


class Audit:
    """The event log of one recording and the analyses over it.

    Attributes:
        events: one row per aten op call (schema in the README).
        tensors: one row per tensor argument or result, linked to ``events`` by ``seq``.
        complete: False when the recorded code raised; the log then ends at the failure.
        error: the exception that ended an incomplete recording, as text.
    """

    def __init__(self, events: pd.DataFrame, tensors: pd.DataFrame, *, complete: bool = True, error: str = ""):
        self.events = events
        self.tensors = tensors
        self.complete = complete
        self.error = error
        self._ops: pd.DataFrame | None = None

    @classmethod
    def from_raw(cls, raw: RawLog) -> Audit:
        events, tensors = log.build_frames(raw)
        return cls(events, tensors, complete=raw.complete, error=raw.error)

    # -- persistence -----------------------------------------------------------------------
    def to_csv(self, path_or_buf=None):
        """Write the audit as one CSV (one row per tensor). With no path, return the text."""
        return log.to_csv(self.events, self.tensors, self.complete, path_or_buf)

    @classmethod
    def read_csv(cls, path_or_buf) -> Audit:
        """Read a CSV written by :meth:`to_csv`; raises ``ValueError`` naming a missing column."""
        events, tensors, complete = log.read_csv(path_or_buf)
        return cls(events, tensors, complete=complete, error="" if complete else "recorded as incomplete")

    # -- analyses ----------------------------------------------------------------------------
    def ops(self) -> pd.DataFrame:
        """``events`` with the classification and data-flow columns (cached)."""
        if self._ops is None:
            self._ops = analysis.ops_table(self.events, self.tensors)
        return self._ops

    def hotspots(self) -> pd.DataFrame:
        """Losses and conversions on conv -> ... -> conv paths, grouped, largest bytes first."""
        return analysis.hotspots(self.ops())

    def summary(self, depth: int = 1) -> pd.DataFrame:
        """Per-module totals at ``depth`` (1 = children of the root), in execution order."""
        return analysis.summary(self.ops(), depth)

    def coverage(self) -> pd.DataFrame:
        """Per aten op: how often it preserved or lost channels_last on this device and dtype."""
        return analysis.coverage(self.ops(), self.tensors)

    def report(self, top: int = 10, depth: int = 1) -> str:
        """A one-screen text report: totals, top hotspots and the modules that cost most."""
        ops = self.ops()
        hot = self.hotspots()
        phases = ops["phase"].value_counts()
        lines = [
            f"Format audit: {len(ops)} aten ops "
            f"({phases.get('forward', 0)} forward, {phases.get('backward', 0)} backward, "
            f"{phases.get('other', 0)} other)" + ("" if self.complete else f"  [INCOMPLETE: {self.error}]"),
        ]
        kinds = ops["kind"].value_counts()
        lines.append(
            "  ops by kind: " + ", ".join(f"{k} {int(kinds.get(k, 0))}" for k in kinds.index if kinds.get(k, 0))
        )
        hot_ops = ops[ops["hotspot"]]
        by_phase = hot_ops.groupby("phase", observed=False)["bytes"].sum()
        lines.append(
            f"Hotspots: {len(hot)} groups, {len(hot_ops)} ops, {_fmt_bytes(hot_ops['bytes'].sum())} moved "
            f"(forward {_fmt_bytes(by_phase.get('forward', 0))}, backward {_fmt_bytes(by_phase.get('backward', 0))})"
        )
        off_path = ops[ops["kind"].isin(["loses", "converts", "restores"]) & ~ops["hotspot"]]
        if len(off_path):
            lines.append(
                f"  not between two convolutions (not hotspots): {len(off_path)} ops, "
                f"{_fmt_bytes(off_path['bytes'].sum())}"
            )
        if len(hot):
            lines.append("")
            shown = hot.head(top)
            w_mod = min(32, max(6, shown["module"].str.len().max()))
            w_op = min(40, max(2, shown["op"].str.len().max()))
            lines.append(f"  {'phase':8} {'module':{w_mod}} {'op':{w_op}} {'kind':8} {'from -> to':30} {'n':>4} {'bytes':>9}")
            for r in shown.itertuples():
                mod = r.module if len(r.module) <= w_mod else "…" + r.module[-(w_mod - 1):]
                lines.append(
                    f"  {r.phase:8} {mod:{w_mod}} {r.op[:w_op]:{w_op}} {r.kind:8} "
                    f"{(r.from_format + ' -> ' + r.to_format)[:30]:30} {r.count:>4} {_fmt_bytes(r.bytes):>9}"
                )
                if r.source:
                    lines.append(f"           at {r.source}")
            if len(hot) > top:
                lines.append(f"  ... and {len(hot) - top} more groups (Audit.hotspots())")
            summ = self.summary(depth)
            summ = summ[summ["bytes"] > 0].sort_values("bytes", ascending=False).head(5)
            lines.append("")
            lines.append(f"Modules with most hotspot bytes (depth {depth}):")
            for r in summ.itertuples():
                lines.append(f"  {r.module:30} {r.hotspots:>4} hotspots {_fmt_bytes(r.bytes):>9} {r.share:6.1%}")
        else:
            lines.append("  No losses or conversions between convolutions: channels_last propagates.")
        return "\n".join(lines)

    def __repr__(self) -> str:
        state = "complete" if self.complete else "incomplete"
        return f"<Audit {len(self.events)} ops, {len(self.tensors)} tensors, {state}>"

    def _repr_html_(self) -> str:
        return "<pre>" + self.report().replace("&", "&amp;").replace("<", "&lt;") + "</pre>"


def diff(before: Audit, after: Audit, include_unchanged: bool = False) -> pd.DataFrame:
    """Hotspot groups that appeared, vanished or changed between two audits."""
    return analysis.diff(before.hotspots(), after.hotspots(), include_unchanged)
