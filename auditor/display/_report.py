"""The audit's one-screen text report, from the analysis tables: causes first, their symptoms
folded under them."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

import pandas as pd

from ..recording import _rules as rules
from ._text import Column, saving_text, short_source, shorten, text_table
from ._units import format_bytes, format_us

#: Symptoms listed under one cause before "... and N more".
SYMPTOMS_SHOWN = 4

#: A hotspot table's columns after its lead ones: where and what (:func:`hotspot_lines`) ...
HOTSPOT_COLUMNS = [
    Column("phase", width=8), Column("module", width=6, most=32, clip=shorten), Column("op", width=2, most=40),
    Column("kind", width=8),
]
#: ... and by default what it did and how much.
HOTSPOT_TAIL = [
    Column("formats", "from -> to", width=30, most=30), Column("count", "n", width=4, align=">"),
    Column("bytes", width=9, align=">", text=format_bytes),
]
#: A symptom under its cause: one hotspot group.
SYMPTOM_COLUMNS = [
    Column("phase", width=8), Column("module", width=24, most=24, clip=shorten),
    Column("op", width=40, most=40, clip=shorten), Column("kind", width=8), Column("count", width=4, align=">", text="{}x".format),
    Column("bytes", width=9, align=">", text=format_bytes),
]
#: The modules that cost most (their time, when timed, follows).
MODULE_COLUMNS = [
    Column("module", width=30), Column("hotspots", text="{:>4} hotspots".format),
    Column("bytes", width=9, align=">", text=format_bytes), Column("share", width=6, align=">", text="{:.1%}".format),
]


def audit_report(ops: pd.DataFrame, hot: pd.DataFrame, summary: pd.DataFrame, causes: pd.DataFrame | None = None,
                 *, complete: bool = True, error: str = "", top: int = 10, depth: int = 1,
                 verified: pd.DataFrame | None = None) -> str:
    """Totals, the ``top`` causes with the hotspots they lead to, and the modules at ``depth``
    that cost most.

    ``ops``, ``hot``, ``summary`` and ``causes`` are :func:`~auditor.analysis.ops_table`,
    :func:`~auditor.analysis.hotspots`, :func:`~auditor.analysis.summary` and
    :func:`~auditor.analysis.cause_table` of one audit (without causes, the hotspot groups are
    listed on their own). ``verified``: ``Fixes.verify()``'s table, once the fixes were verified:
    each cause then shows its measured saving beside the estimate.
    """
    lines = total_lines(ops, hot, causes, complete, error)
    if len(hot):
        lines.append("")
        if causes is not None and len(causes):
            lines.extend(_cause_lines(causes, hot, top, verified))
        else:
            lines.extend(hotspot_lines(hot, top, more="groups (Audit.hotspots())"))
        timed = "time_us" in summary and summary["time_us"].notna().any()
        summ = summary[(summary["bytes"] > 0) & (summary["hotspots"] > 0)]
        summ = summ.sort_values("time_us" if timed else "bytes", ascending=False).head(5)
        lines.append("")
        lines.append(f"Modules with most hotspot {'time' if timed else 'bytes'} (depth {depth}):")
        time = [Column("time_us", width=9, align=">", text=format_us)] if timed else []
        lines.extend(text_table(summ, [*MODULE_COLUMNS, *time], header=False))
    else:
        lines.append("  No losses or conversions between convolutions: channels_last propagates.")
    return "\n".join(lines)


def total_lines(ops: pd.DataFrame, hot: pd.DataFrame, causes, complete: bool, error: str) -> list[str]:
    """The report's head: ops per phase and kind, hotspot totals, times; the HTML shows it too."""
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
    n_causes = f"{len(causes)} cause{'s' if len(causes) != 1 else ''} -> " if causes is not None else ""
    lines.append(
        f"Hotspots: {n_causes}{len(hot)} groups, {len(hot_ops)} ops, {format_bytes(hot_ops['bytes'].sum())} moved "
        f"(forward {format_bytes(by_phase.get('forward', 0))}, backward {format_bytes(by_phase.get('backward', 0))})"
    )
    if "time_us" in ops and ops["time_us"].notna().any():
        lines.extend(_time_lines(ops, causes))
    independent = ops[ops["layout_independent"]] if "layout_independent" in ops else ops.iloc[:0]
    if len(independent):
        lines.append(
            f"  layout-independent copies and conversions (they happen in any layout; not hotspots): "
            f"{len(independent)} ops, {format_bytes(independent['bytes'].sum())}"
        )
        lines.extend(_uncertain_lines(independent))
    costly = ops["kind"].isin(rules.COSTLY_KINDS) & ~ops["hotspot"]
    if "layout_independent" in ops:
        costly &= ~ops["layout_independent"]
    off_path = ops[costly]
    if len(off_path):
        lines.append(
            f"  not between two convolutions (not hotspots): {len(off_path)} ops, "
            f"{format_bytes(off_path['bytes'].sum())}"
        )
    return lines


def _uncertain_lines(independent: pd.DataFrame) -> list[str]:
    """How many layout-independent ops were judged so under an assumption the log cannot check,
    and which (``ops()["uncertain"]``)."""
    if "uncertain" not in independent:
        return []
    reasons = independent["uncertain"].astype(str)
    reasons = reasons[reasons != ""]
    if not len(reasons):
        return []
    lines = [f"    uncertain: {len(reasons)} of them, only if these assumptions hold (Audit.ops()['uncertain']):"]
    for reason, n in reasons.value_counts().items():
        lines.append(f"      {n} ops: {reason}")
    return lines


def _time_lines(ops: pd.DataFrame, causes) -> list[str]:
    """Where the step's time went: the ops, the hotspots among them, and the time between ops."""
    total = ops["time_us"].sum()
    hot = ops.loc[ops["hotspot"], "time_us"].sum()
    lines = [f"  time: ops {format_us(total)}, of which hotspots {format_us(hot)}"
             + (f" ({hot / total:.1%})" if total else "")
             + (f"; fixing every cause would save about {format_us(causes['saving_us'].sum())}"
                if causes is not None and len(causes) and causes["saving_us"].notna().any() else "")]
    if "gap_us" in ops and ops["gap_us"].notna().any():
        lines.append(f"  time outside ops (the step's Python, module calls, the autograd engine): "
                     f"{format_us(ops['gap_us'].sum())}")
    if "artifact" in ops and ops["artifact"].any():
        lines.append(f"  {int(ops['artifact'].sum())} gradient sums ran out of place only because a recorder "
                     "was active (events.artifact); they are never causes")
    return lines


def _cause_lines(causes: pd.DataFrame, hot: pd.DataFrame, top: int, verified: pd.DataFrame | None = None) -> list[str]:
    """Each cause: what and where, the fix (measured, once verified), and its symptoms, largest
    first."""
    measured = {} if verified is None else {int(r["cause"]): r for r in verified.to_dict("records") if r["kind"] == "fix"}
    timed = "saving_us" in causes and causes["saving_us"].notna().any()
    order = "most time saved" if timed else "most bytes"
    lines = [f"Causes, {order} first ({len(causes)}; Audit.causes(), symptoms in Audit.hotspots()):"]
    for c in causes.head(top).itertuples():
        where = f"{c.module} ({c.module_type})" if c.module_type else c.module
        lines.append(f"  {c.cause:>2}. [{c.pattern}] {c.phase} {c.op} {c.kind} in {shorten(where, 50)}")
        cost = f", {format_us(c.time_us)}; a fix saves about {format_us(c.saving_us)}" if timed else ""
        lines.append(f"      {c.hotspots} hotspot ops, {format_bytes(c.bytes)}{cost}")
        if c.cause in measured:
            lines.append(f"      verified: {saving_text(measured[c.cause])}")
        if c.source:
            lines.append(f"      at {short_source(c.source)}")
        for i, part in enumerate(textwrap.wrap(c.fix, 110)):
            lines.append(f"      {'fix:' if i == 0 else '    '} {part}")
        mine = hot[hot["cause"] == c.cause]
        shown = mine.head(SYMPTOMS_SHOWN)
        when = [f" {format_us(t):>9}" if t == t else "" for t in shown["time_us"]]
        lines.extend(text_table(shown, SYMPTOM_COLUMNS, indent="      - ", header=False, tails=when))
        if len(mine) > SYMPTOMS_SHOWN:
            lines.append(f"      ... and {len(mine) - SYMPTOMS_SHOWN} more hotspot groups")
    if len(causes) > top:
        lines.append(f"  ... and {len(causes) - top} more causes (Audit.causes())")
    return lines


def hotspot_lines(hot: pd.DataFrame, top: int, *, more: str, lead: Sequence[Column] = (),
                  tail: Sequence[Column] = HOTSPOT_TAIL) -> list[str]:
    """Hotspot groups as a text table, the audit report's and the rank report's: the ``lead``
    columns, phase, module, op and kind, then the ``tail`` columns (by default from -> to, count
    and bytes); each row's source line under it (:func:`~._text.short_source`), the first
    ``top`` rows, then how many more (``"... and 3 more {more}"``)."""
    shown = hot.head(top)
    shown = shown.assign(formats=shown["from_format"].astype(str) + " -> " + shown["to_format"].astype(str))
    notes = [f"at {short_source(s)}" if s else "" for s in shown["source"]]
    lines = text_table(shown, [*lead, *HOTSPOT_COLUMNS, *tail], notes=notes)
    if len(hot) > top:
        lines.append(f"  ... and {len(hot) - top} more {more}")
    return lines
