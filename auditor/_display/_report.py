"""The audit's one-screen text report, from the analysis tables: causes first, their symptoms
folded under them."""

from __future__ import annotations

import re
from collections.abc import Sequence

import pandas as pd

from .._analysis._costs import times_note
from .._analysis._summaries import module_at_depth
from .._recording import _rules as rules
from ._text import Column, estimate_text, saving_text, short_source, shorten, text_table, wrap
from ._units import format_bytes, format_us

#: Kinds whose name alone does not say what they are, explained where the report counts them.
KIND_NOTES = {rules.NOT_APPLICABLE: " (no image read or written, or a factory)",
              rules.AMBIGUOUS_KIND: " (only 1-channel or 1×1 images, which fit either format)"}

#: Symptoms listed under one cause before "... and N more".
SYMPTOMS_SHOWN = 4
#: Modules listed before "... and N more" (the HTML shows as many).
MODULES_SHOWN = 5

#: A hotspot table's columns after its lead ones: where and what (:func:`hotspot_lines`) ...
HOTSPOT_COLUMNS = [
    # a module's name is never cut ("….1,4–11.block.*.avgpool" named no module): a long one widens its row
    Column("phase", width=8), Column("module", width=6), Column("op", width=2, most=40),
    Column("kind", width=8),
]
#: ... and by default what it did and how much.
HOTSPOT_TAIL = [
    Column("formats", "from -> to", width=30, most=30), Column("count", "n", width=4, align=">"),
    Column("bytes", width=9, align=">", text=format_bytes),
]
#: A symptom under its cause: one hotspot group.
SYMPTOM_COLUMNS = [
    Column("phase", width=8), Column("module", width=24),
    Column("op", width=40, most=40, clip=shorten), Column("kind", width=8), Column("count", width=4, align=">", text="{}x".format),
    Column("bytes", width=9, align=">", text=format_bytes),
]
#: The modules that cost most (their time, when timed, follows).
MODULE_COLUMNS = [
    Column("module", width=30), Column("hotspots", text=lambda n: f"{n:>4} hotspot{'' if n == 1 else 's'}"),
    Column("bytes", width=9, align=">", text=format_bytes), Column("share", width=6, align=">", text="{:.1%}".format),
]


def audit_report(ops: pd.DataFrame, hot: pd.DataFrame, summary: pd.DataFrame, causes: pd.DataFrame | None = None,
                 *, complete: bool = True, error: str = "", top: int = 10, depth: int = 1,
                 verified: pd.DataFrame | None = None, threads: int | None = None,
                 kernels: pd.DataFrame | None = None, step_time=None) -> str:
    """Totals, the ``top`` causes with the hotspots they lead to, and the modules at ``depth``
    that cost most.

    ``ops``, ``hot``, ``summary`` and ``causes`` are :func:`~auditor._analysis.ops_table`,
    :func:`~auditor._analysis.hotspots`, :func:`~auditor._analysis.summary` and
    :func:`~auditor._analysis.cause_table` of one audit (without causes, the hotspot groups are
    listed on their own). ``verified``: the verification table of ``Fixes.verify()`` (its ``verification``), once the fixes were verified:
    each cause then leads with its measured saving, the estimate beside it. ``threads``: the
    intra-op threads the times were taken at (``Audit.threads``), said in the head. ``kernels``:
    a fake audit's ``Audit.kernels``, said in the head (:func:`kernel_lines`). ``step_time``: how
    the recorder's own cost was kept out of the times (a ``StepTime``).
    """
    lines = total_lines(ops, hot, causes, complete, error, threads=threads, verified=verified, kernels=kernels,
                        step_time=step_time)
    if len(hot):
        lines.append("")
        if causes is not None and len(causes):
            lines.extend(_cause_lines(causes, hot, top, verified))
        else:
            lines.extend(hotspot_lines(hot, top, more="groups in Audit.hotspots()"))
        summ, timed = module_rows(summary)
        what = "time" if timed else "bytes"
        lines.append("")
        lines.append(f"Modules with most hotspot {what} (depth {depth}; share of the hotspots' {what}):")
        time = [Column("time_us", width=9, align=">", text=format_us)] if timed else []
        lines.extend(text_table(summ.head(MODULES_SHOWN), [*MODULE_COLUMNS, *time], header=False))
        if len(summ) > MODULES_SHOWN:  # as the HTML says it
            lines.append(f"  ... and {len(summ) - MODULES_SHOWN} more (Audit.summary({depth}))")
    else:
        lines.append("  No losses or conversions between convolutions: channels_last propagates.")
    return "\n".join(lines)


def module_rows(summary: pd.DataFrame) -> tuple[pd.DataFrame, bool]:
    """The modules with hotspots, costliest first, and whether they are timed: ``share`` is
    then each one's share of the hotspots' time (what they are ranked by), else of their bytes."""
    timed = "time_us" in summary and summary["time_us"].notna().any()
    summ = summary[(summary["bytes"] > 0) & (summary["hotspots"] > 0)]
    if timed:
        total = summ["time_us"].sum()
        summ = summ.assign(share=summ["time_us"] / total if total else 0.0)
    return summ.sort_values("time_us" if timed else "bytes", ascending=False), timed


def total_lines(ops: pd.DataFrame, hot: pd.DataFrame, causes, complete: bool, error: str, *,
                threads: int | None = None, verified: pd.DataFrame | None = None,
                kernels: pd.DataFrame | None = None, step_time=None, width: int | None = 114) -> list[str]:
    """The report's head: ops per phase and kind, hotspot totals, times (at ``threads``; with
    ``verified``, the measured saving of all fixes first), and for a fake audit how its strides
    were known (``kernels``); the HTML shows it too, unwrapped (``width=None``): long lines wrap
    at ``width`` in the text, never between a number and its unit."""
    phases = ops["phase"].value_counts()
    lines = [
        f"Format audit: {len(ops)} aten ops "
        f"({phases.get('forward', 0)} forward, {phases.get('backward', 0)} backward, "
        f"{phases.get('other', 0)} other)" + ("" if complete else f"  [INCOMPLETE: {error}]"),
    ]
    if kernels is not None:
        lines.extend(kernel_lines(kernels))
    kinds = ops["kind"].value_counts()
    lines.append("  ops by kind: " + ", ".join(f"{k} {int(kinds.get(k, 0))}" + KIND_NOTES.get(k, "")
                                            for k in kinds.index if kinds.get(k, 0)))
    hot_ops = ops[ops["hotspot"]]
    by_phase = hot_ops.groupby("phase", observed=False)["bytes"].sum()
    n_causes = f"{len(causes)} cause{'s' if len(causes) != 1 else ''} -> " if causes is not None else ""
    lines.append(
        f"Hotspots: {n_causes}{len(hot)} groups, {len(hot_ops)} ops, {format_bytes(hot_ops['bytes'].sum())} moved "
        f"(forward {format_bytes(by_phase.get('forward', 0))}, backward {format_bytes(by_phase.get('backward', 0))})"
    )
    if "time_us" in ops and ops["time_us"].notna().any():
        lines.extend(_time_lines(ops, causes, threads, verified, step_time, width))
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


def kernel_lines(kernels: pd.DataFrame, most: int = 8) -> list[str]:
    """A fake audit's strides: how many ops were asked of the real kernels, and the ops it could
    not check (named, most frequent first)."""
    if not len(kernels):
        return []
    device = str(kernels["device"].iloc[0])
    lines = []
    by = kernels.groupby("checked", observed=True)
    asked = by.get_group("kernel") if "kernel" in by.groups else kernels.iloc[:0]
    if len(asked):
        lines.append(f"  fake audit on {device}: {len(asked)} ops' strides asked of this machine's kernels "
                     f"({int(asked['calls'].sum())} calls, {int(asked['relaid'].sum())} results re-laid out "
                     "where the meta kernel wrote other strides)")
    table = by.get_group("table") if "table" in by.groups else kernels.iloc[:0]
    if len(table):
        lines.append(f"  fake audit on {device}: {len(table)} ops laid out by the table of {device}'s kernels "
                     f"({', '.join(table['op'].astype(str))})")
    for what, why in (("not asked", "its kernel raised on random values; meta kernel's strides"),
                      ("not checked", f"meta kernel's strides, not checked against {device}'s kernels here")):
        if what in by.groups:
            rows = by.get_group(what).sort_values("calls", ascending=False)
            names = [f"{op} x{int(n)}" for op, n in zip(rows["op"].astype(str), rows["calls"])]
            more = f", and {len(names) - most} more (Audit.kernels)" if len(names) > most else ""
            lines.append(f"  {what} ({why}): {len(rows)} ops: {', '.join(names[:most])}{more}")
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


def _time_lines(ops: pd.DataFrame, causes, threads: int | None = None,
                verified: pd.DataFrame | None = None, step_time=None, width: int | None = 114) -> list[str]:
    """Where the step's time went: the ops, the hotspots among them, and the time between ops;
    the thread count they were taken at; what fixing every cause saves, measured first once
    ``verified``. Where the ops' times add up to more than the step, the reason, no numbers."""
    at = (f"at {threads} thread{'s' if threads != 1 else ''}, process CPU time" if threads
          else "at the thread count the recording ran at")
    measured = _measured_total(verified)
    wrong = times_note(ops)
    if wrong:
        return [f"  {part}" if i == 0 else f"    {part}"
                for paragraph in [f"time ({at}): not shown: {wrong}", *([measured] if measured else [])]
                for i, part in enumerate(wrap(paragraph, width))]
    total = ops["time_us"].sum()
    hot = ops.loc[ops["hotspot"], "time_us"].sum()
    saving = (_total_saving(causes) if causes is not None and len(causes) and causes["saving_us"].notna().any()
              else "")
    if measured:
        saving = saving.replace("; fixing every cause would save about", "; estimated for every cause: about")
    head = (f"time ({at}): ops {format_us(total)}, of which hotspots {format_us(hot)}"
            + (f" ({hot / total:.1%})" if total else "") + ("" if measured else saving))
    if measured:
        estimate = saving.removeprefix("; estimated for every cause: ").removeprefix("; ")
        head += f"\n{measured}" + (f" (estimated: {estimate})" if estimate else "")
    lines = [f"  {part}" if i == 0 else f"    {part}"
             for paragraph in head.split("\n") for i, part in enumerate(wrap(paragraph, width))]
    if "gap_us" in ops and ops["gap_us"].notna().any():
        lines.append(f"  time outside ops (the step's Python, module calls, the autograd engine): "
                     f"{format_us(ops['gap_us'].sum())}" + ("" if step_time is not None else
                                                              ", the recorder's own work included"))
    if step_time is not None:
        lines.extend(_recorder_lines(step_time, width))
    if "artifact" in ops and ops["artifact"].any():
        lines.append(f"  {int(ops['artifact'].sum())} gradient sums ran out of place only because a recorder "
                     "was active (marked in Audit.events['artifact']); they are never causes")
    return lines


def _recorder_lines(step_time, width: int | None = 114) -> list[str]:
    """The recorder's own cost, kept out of the ops and the time outside them, and how."""
    paragraph = (
        f"the recorder's own cost, not in the times above: {format_us(step_time.recorder_us)} (recorded step "
        f"{format_us(step_time.recorded_us)}; the same step without the auditor {format_us(step_time.plain_us)}, "
        f"median of {step_time.plain_steps}: ops and time outside ops are its parts; each op less "
        f"{format_us(step_time.per_record_us)} per profiler record inside it)"
        + (f"; the ops still come to {format_us(step_time.ops_us - step_time.plain_us)} more than the plain step: "
           "the recorder slows the ops themselves too, by an amount that is not separated per op"
           if step_time.ops_us > step_time.plain_us else ""))
    return [f"  {part}" if i == 0 else f"    {part}" for i, part in enumerate(wrap(paragraph, width))]


def _measured_total(verified: pd.DataFrame | None) -> str:
    """All fixes together as ``Fixes.verify`` measured them, or '' before verification."""
    if verified is None or not len(verified) or "kind" not in verified:
        return ""
    rows = verified[verified["kind"] == "all"]
    if not len(rows):
        return ""
    return f"all fixes, measured: {saving_text(rows.iloc[0])}"


def _total_saving(causes: pd.DataFrame) -> str:
    """What fixing every cause saves, over the causes whose estimate can be trusted."""
    trusted = causes["saving_trusted"].astype(bool) if "saving_trusted" in causes else pd.Series(True, causes.index)
    if not trusted.any():
        return "; what a fix saves is not estimated (see each cause)"
    rest = f" ({int((~trusted).sum())} not estimated)" if not trusted.all() else ""
    return f"; fixing every cause would save about {format_us(causes.loc[trusted, 'saving_us'].sum())}{rest}"


def _cause_lines(causes: pd.DataFrame, hot: pd.DataFrame, top: int, verified: pd.DataFrame | None = None) -> list[str]:
    """Each cause: what and where, the fix (measured, once verified), and its symptoms, largest
    first."""
    measured = {} if verified is None else {int(r["cause"]): r for r in verified.to_dict("records") if r["kind"] == "fix"}
    timed = "saving_us" in causes and causes["saving_us"].notna().any()
    order = "most time saved" if timed else "most bytes"
    lines = [f"Causes, {order} first ({len(causes)}; Audit.causes(), symptoms in Audit.hotspots()):"]
    for c in causes.head(top).itertuples():
        where = f"{c.module} ({c.module_type})" if c.module_type else c.module
        lines.append(f"  {c.cause:>2}. [{c.pattern}] {c.phase} {c.op} {c.kind} in {where}")
        if c.cause in measured:
            for i, part in enumerate(wrap(f"measured: {saving_text(measured[c.cause])}", 110)):
                lines.append(f"      {part}" if i == 0 else f"        {part}")
        label = "estimate: " if c.cause in measured else ""
        cost = f", {_cause_time(c)}; {label}{estimate_text(c._asdict())}" if timed else ""
        first, *rest = wrap(f"{c.hotspots} hotspot ops, {format_bytes(c.bytes)}{cost}", 116)
        lines.extend([f"      {first}", *(f"        {r}" for r in rest)])
        if c.source:
            lines.append(f"      at {short_source(c.source)}")
        for i, part in enumerate(wrap(c.fix, 110)):
            lines.append(f"      {'fix:' if i == 0 else '    '} {part}")
        mine = combine_blocks(hot[hot["cause"] == c.cause])
        shown = mine.head(SYMPTOMS_SHOWN)
        when = [f" {format_us(t):>9}" if t == t else "" for t in shown["time_us"]]
        lines.extend(text_table(shown, SYMPTOM_COLUMNS, indent="      - ", header=False, tails=when))
        if len(mine) > SYMPTOMS_SHOWN:
            lines.append(f"      ... and {more_rows(mine.iloc[SYMPTOMS_SHOWN:], 'hotspot groups')}")
    if len(causes) > top:
        lines.append(f"  ... and {len(causes) - top} more causes (Audit.causes())")
    return lines


def _cause_time(c) -> str:
    """A cause's time in the parts that add up to it: its hotspots, and the ops its fix
    replaces or removes beside them (what its estimate can exceed its hotspots by)."""
    replaced = getattr(c, "replaced_us", 0.0)
    # parts shown where the replaced ops are a part worth naming (1 µs and 1% of the time)
    if not replaced == replaced or replaced < max(1.0, 0.01 * c.time_us) or getattr(c, "hotspot_us", None) is None:
        return format_us(c.time_us)
    return (f"{format_us(c.time_us)} (hotspots {format_us(c.hotspot_us)} + ops its fix replaces "
            f"{format_us(replaced)})")


#: What hotspot groups must share to be shown as one row (:func:`combine_blocks`), beside their
#: module path read with its numeric parts as one block.
BLOCK_KEYS = ["phase", "op", "kind", "source", "cause", "from_format", "to_format"]
#: A module path's numeric part: an index into a Sequential or ModuleList, whole between dots.
_INDEX = re.compile(r"(?<![^.])\d+(?![^.])")


def combine_blocks(hot: pd.DataFrame) -> pd.DataFrame:
    """Hotspot groups (:func:`~auditor._analysis.hotspots`) as displayed: groups that differ only
    in the numeric parts of their module paths (the same statement, in repeated blocks ``stage3.1``,
    ``stage3.2``, ...) as one row, its module path showing each number that differs as the
    values it takes (``stage3.1–7.branch2.0``), ``count``, ``bytes``, ``share`` and ``time_us``
    summed, ``groups`` how many it combines; ordered as ``hot`` is (time, else bytes)."""
    if hot.empty or "module" not in hot:
        return hot.assign(groups=pd.Series(dtype="int64"))
    keys = [k for k in BLOCK_KEYS if k in hot]
    shape = hot["module"].astype(str).str.replace(_INDEX, "#", regex=True).rename("_shape")
    grouped = hot.assign(_shape=shape).groupby([*keys, "_shape"], sort=False, dropna=False)
    rows = []
    for _, g in grouped:
        first = g.iloc[0].to_dict()
        first["module"] = _block_path(list(g["module"].astype(str)))
        first["groups"] = len(g)
        for c in ("count", "bytes", "share"):
            if c in g:
                first[c] = g[c].sum()
        if "time_us" in g:
            first["time_us"] = g["time_us"].sum(min_count=1)
        if "first_seq" in g:
            first["first_seq"] = g["first_seq"].min()
        rows.append(first)
    out = pd.DataFrame(rows, columns=[*hot.columns, "groups"]).drop(columns="_shape", errors="ignore")
    timed = "time_us" in out and out["time_us"].notna().any()
    by = [c for c in (["time_us", "bytes"] if timed else ["bytes"]) if c in out]
    return out.sort_values(by, ascending=False, kind="stable", ignore_index=True) if by else out


def _block_path(paths: list[str]) -> str:
    """Module paths of one shape as one: each number that differs between them as its values,
    runs of consecutive ones as ``a–b`` (``["s.1.b", "s.2.b", "s.3.b"]`` -> ``s.1–3.b``)."""
    if len(set(paths)) == 1:
        return paths[0]
    parts = [_INDEX.split(p) for p in paths]
    numbers = [_INDEX.findall(p) for p in paths]
    values = [sorted({int(n[i]) for n in numbers}) for i in range(len(numbers[0]))]
    combinations = 1
    for v in values:
        combinations *= len(v)
    # every combination of the values shown must be a module, or the name suggests some that are
    # not ("features.1,4–11.block.1–2" when block.2 exists in a few): then the first number that
    # varies keeps its values and each later one that varies is "*", some index
    whole = combinations == len(set(paths))
    text, varied = parts[0][0], False
    for i, between in enumerate(parts[0][1:]):
        if len(values[i]) > 1 and varied and not whole:
            text += "*" + between
            continue
        varied |= len(values[i]) > 1
        text += _runs(values[i]) + between
    return text


def _runs(values: list[int]) -> str:
    """Sorted integers as runs: ``[0, 1, 2, 5]`` -> ``0–2,5``."""
    runs: list[list[int]] = []
    for v in values:
        if runs and v == runs[-1][-1] + 1:
            runs[-1].append(v)
        else:
            runs.append([v])
    return ",".join(str(r[0]) if len(r) == 1 else f"{r[0]}–{r[-1]}" for r in runs)


def hotspot_lines(hot: pd.DataFrame, top: int, *, more: str, lead: Sequence[Column] = (),
                  tail: Sequence[Column] = HOTSPOT_TAIL, combine: bool = True) -> list[str]:
    """Hotspot groups as a text table, the audit report's and the rank report's: the ``lead``
    columns, phase, module, op and kind, then the ``tail`` columns (by default from -> to, count
    and bytes); each row's source line under it (:func:`~._text.short_source`), the first
    ``top`` rows, then how many more (``"... and 3 more {more}"``). ``combine``: groups in
    repeated blocks as one row (:func:`combine_blocks`)."""
    if combine:
        hot = combine_blocks(hot)
    shown = hot.head(top)
    shown = shown.assign(formats=shown["from_format"].astype(str) + " -> " + shown["to_format"].astype(str))
    notes = [f"at {short_source(s)}" if s else "" for s in shown["source"]]
    lines = text_table(shown, [*lead, *HOTSPOT_COLUMNS, *tail], notes=notes)
    if len(hot) > top:
        lines.append(f"  ... and {more_rows(hot.iloc[top:], more)}")
    return lines


def more_rows(rest: pd.DataFrame, what: str) -> str:
    """How many rows were left off, and how many hotspot groups they combine where that is more
    (``3 more rows (12 groups in Audit.hotspots())``)."""
    groups = int(rest["groups"].sum()) if "groups" in rest else len(rest)
    rows = f"{len(rest)} more row{'' if len(rest) == 1 else 's'}"
    return f"{len(rest)} more {what}" if groups == len(rest) else f"{rows} ({groups} {what})"


#: the deepest level :func:`trunk_depth` looks at (``auditor.plot``'s default depth looks as deep)
TRUNK_DEPTH_MOST = 6


def trunk_depth(ops: pd.DataFrame, most: int = TRUNK_DEPTH_MOST) -> int:
    """The depth the report's module table shows by default: the shallowest at which the
    hotspots fall in two or more modules, so that a model whose children are one trunk
    (``features``, ``blocks``, ``trunk_output``) is not one row of 100% (the figures' default
    depth is chosen alike); 1 without hotspots, else the depth that splits them most."""
    hot = ops.loc[ops["hotspot"], "module"]
    best, widest = 1, 0
    for depth in range(1, most + 1):
        n = module_at_depth(hot, depth).nunique()
        if n >= 2:
            return depth
        if n > widest:
            best, widest = depth, n
    return best
