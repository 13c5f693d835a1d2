"""The audit's one-screen text report, from the analysis tables."""

from __future__ import annotations

import pandas as pd

from ..recording import rules
from .tables import shorten
from .units import format_bytes


def audit_report(ops: pd.DataFrame, hot: pd.DataFrame, summary: pd.DataFrame, *, complete: bool = True,
                 error: str = "", top: int = 10, depth: int = 1) -> str:
    """Totals, the top ``top`` hotspot groups, and the modules at ``depth`` that cost most.

    ``ops``, ``hot`` and ``summary`` are :func:`~auditor.analysis.ops_table`,
    :func:`~auditor.analysis.hotspots` and :func:`~auditor.analysis.summary` of one audit.
    """
    lines = _totals(ops, hot, complete, error)
    if len(hot):
        lines.append("")
        lines.extend(_hotspot_lines(hot, top))
        summ = summary[summary["bytes"] > 0].sort_values("bytes", ascending=False).head(5)
        lines.append("")
        lines.append(f"Modules with most hotspot bytes (depth {depth}):")
        for r in summ.itertuples():
            lines.append(f"  {r.module:30} {r.hotspots:>4} hotspots {format_bytes(r.bytes):>9} {r.share:6.1%}")
    else:
        lines.append("  No losses or conversions between convolutions: channels_last propagates.")
    return "\n".join(lines)


def _totals(ops: pd.DataFrame, hot: pd.DataFrame, complete: bool, error: str) -> list[str]:
    phases = ops["phase"].value_counts()
    lines = [
        f"Format audit: {len(ops)} aten ops "
        f"({phases.get('forward', 0)} forward, {phases.get('backward', 0)} backward, "
        f"{phases.get('other', 0)} other)" + ("" if complete else f"  [INCOMPLETE: {error}]"),
    ]
    kinds = ops["kind"].value_counts()
    lines.append(
        "  ops by kind: " + ", ".join(f"{k} {int(kinds.get(k, 0))}" for k in kinds.index if kinds.get(k, 0))
    )
    hot_ops = ops[ops["hotspot"]]
    by_phase = hot_ops.groupby("phase", observed=False)["bytes"].sum()
    lines.append(
        f"Hotspots: {len(hot)} groups, {len(hot_ops)} ops, {format_bytes(hot_ops['bytes'].sum())} moved "
        f"(forward {format_bytes(by_phase.get('forward', 0))}, backward {format_bytes(by_phase.get('backward', 0))})"
    )
    off_path = ops[ops["kind"].isin(rules.COSTLY_KINDS) & ~ops["hotspot"]]
    if len(off_path):
        lines.append(
            f"  not between two convolutions (not hotspots): {len(off_path)} ops, "
            f"{format_bytes(off_path['bytes'].sum())}"
        )
    return lines


def _hotspot_lines(hot: pd.DataFrame, top: int) -> list[str]:
    shown = hot.head(top)
    w_mod = min(32, max(6, shown["module"].str.len().max()))
    w_op = min(40, max(2, shown["op"].str.len().max()))
    lines = [f"  {'phase':8} {'module':{w_mod}} {'op':{w_op}} {'kind':8} {'from -> to':30} {'n':>4} {'bytes':>9}"]
    for r in shown.itertuples():
        lines.append(
            f"  {r.phase:8} {shorten(r.module, w_mod):{w_mod}} {r.op[:w_op]:{w_op}} {r.kind:8} "
            f"{(r.from_format + ' -> ' + r.to_format)[:30]:30} {r.count:>4} {format_bytes(r.bytes):>9}"
        )
        if r.source:
            lines.append(f"           at {r.source}")
    if len(hot) > top:
        lines.append(f"  ... and {len(hot) - top} more groups (Audit.hotspots())")
    return lines
