"""Suggested fixes (:class:`~auditor._fix.Fixes`) as text and as HTML, from their table."""

from __future__ import annotations

import html
import textwrap
from collections.abc import Collection

import pandas as pd

from ._html import header_html, table_html
from ._text import join_units, saving_text, short_source, wrap
from ._units import format_bytes, format_us


def fixes_headline(frame: pd.DataFrame, hotspot_groups: int) -> str:
    """How many fixes, for how many hotspot groups, and the bytes they save."""
    if frame.empty:
        return "Suggested fixes: none (no hotspots)."
    return (f"Suggested fixes: {len(frame)} for {hotspot_groups} hotspot groups, "
            f"{format_bytes(frame['bytes'].clip(lower=0).sum())} to save "
            f"(forward {format_bytes(frame['forward_bytes'].sum())}, "
            f"backward {format_bytes(frame['backward_bytes'].sum())} of hotspots)")


def fixes_text(frame: pd.DataFrame, hotspot_groups: int, *, writes: Collection[str] = ()) -> str:
    """The headline, then each fix: what and where, the statement as it is, what to write or do,
    why, and, where it cannot be made automatically, why not. ``frame`` is ``Fixes.frame``;
    ``writes``: the actions whose suggestion is code to write at the line (the others' is
    something to do)."""
    lines = [fixes_headline(frame, hotspot_groups)]
    for r in frame.to_dict("records"):
        where = short_source(r["source"])
        # a fix at a line says where and which module; one with no line (a module swapped) names the module
        what = (f"{r['action']}: {where}  ({r['module']}, {r['module_type'] or '-'})" if where
                else f"{r['action']} {r['module']} ({r['module_type'] or '-'})")
        lines.append("")
        lines.append(f"{r['fix']}. {what}  saves {format_bytes(r['bytes'])} "
                     f"({r['hotspots']} hotspot group{'s' if r['hotspots'] != 1 else ''})")
        if r["line"]:
            lines.extend(_block("now:  ", r["line"]))
        if r["suggestion"]:
            lines.extend(_block("write:" if r["action"] in writes else "do:   ", r["suggestion"]))
        lines.extend(_wrapped("     why:   ", r["detail"]))
        if r.get("reason"):
            lines.extend(_wrapped("     by hand: ", r["reason"]))
    return "\n".join(lines)


def applied_text(frame: pd.DataFrame) -> str:
    """``Fixes.apply()``'s table as text: per fix made or tried, its round, pattern, action and
    line, then what was done or why not; one line each, not a pandas table as wide as its
    longest detail."""
    if frame.empty:
        return "Applied: nothing (no fixes)."
    made = int(frame["applied"].astype(bool).sum())
    lines = [f"Applied {made} of {len(frame)} fix{'es' if len(frame) != 1 else ''}:"]
    for r in frame.to_dict("records"):
        where = short_source(r["source"])
        round_ = "" if int(r["round"]) == 1 else f" (exposed, round {int(r['round'])})"
        lines.append(f"  fix {r['fix']}{round_} [{r['pattern']}] {r['action']}" + (f" at {where}" if where else "")
                     + (": made" if r["applied"] else ": NOT made"))
        if r["detail"]:
            lines.append(f"      {r['detail']}")
    return "\n".join(lines)


#: where the fixes' and the verification's prose wraps, as the report's does
WIDTH = 114


def _wrapped(label: str, text: str, hang: int | None = None) -> list[str]:
    """``text`` after ``label``, wrapped at :data:`WIDTH` (never between a number and its unit),
    its later lines under its first (``hang``: that many spaces further in than the label)."""
    under = " " * (len(label) if hang is None else len(label) + hang)
    first, *rest = wrap(str(text), WIDTH - len(label))
    return [f"{label}{first}", *(f"{under}{line}" for line in rest)]


def _block(label: str, code: str) -> list[str]:
    """A statement of one or more lines under a label, its own indentation kept relative to its
    first line."""
    code_lines = textwrap.dedent(code).splitlines() or [""]
    return [f"     {label} {code_lines[0]}", *(f"     {' ' * len(label)} {line}" for line in code_lines[1:])]


def fixes_html(frame: pd.DataFrame, hotspot_groups: int) -> str:
    """The headline, one table row per fix (what, where, what it saves, why, and why it is by
    hand), then each fix's statement as it is and what to write or do, as code blocks under the
    table: a function body keeps its lines and indentation and is never wrapped inside a name, as
    it was in a narrow table column."""
    head = header_html([fixes_headline(frame, hotspot_groups)])
    if frame.empty:
        return head
    shown = frame
    if "reason" in frame:
        shown = frame.assign(detail=[d + (f" (by hand: {r})" if r else "") for d, r in zip(frame["detail"], frame["reason"])])
    table = table_html(shown, columns={
        "fix": "fix", "action": "action", "source": "file:line", "module": "module", "module_type": "type",
        "bytes": "saves", "hotspots": "hotspot groups", "detail": "why"})
    return head + table + "".join(_code_html(r) for r in frame.to_dict("records") if r["line"] or r["suggestion"])


#: a statement as a block of code: its lines and indentation kept; a line longer than the page
#: wraps at a space, never inside a name
_PRE_CSS = "white-space: pre-wrap; overflow-wrap: normal; word-break: keep-all; margin: 0.2em 0 0.6em 1.5em"


def _code_html(r: dict) -> str:
    """One fix's statement as it is (``now``) and the change (``do``), each a code block."""
    where = short_source(r["source"]) or str(r["module"])
    parts = [f"<p style=\"margin: 0.6em 0 0.2em 0\"><b>fix {int(r['fix'])}</b>, {html.escape(str(r['action']))} at "
             f"<code>{html.escape(where)}</code></p>"]
    for label, code in (("now", r["line"]), ("do", r["suggestion"])):
        if code:
            text = textwrap.dedent(str(code)).strip("\n")
            parts.append(f"<div>{label}:</div><pre style=\"{_PRE_CSS}\">{html.escape(text)}</pre>")
    return "<div>" + "".join(parts) + "</div>"


def verification_text(frame: pd.DataFrame) -> str:
    """The verification table of ``Fixes.verify()`` (its ``verification``) as text: per fix, whether it was made, its cause's hotspot
    groups before and after, whether the outputs and gradients stayed the same, and the step's
    time measured beside the audit's estimate."""
    if frame.empty:
        return "Verified fixes: none (no fixes)."
    lines = [f"Verified fixes ({int((frame['kind'] == 'fix').sum())}, applied to copies, timed at one thread in "
             "process CPU time):"]
    # one fix and nothing exposed: "all together" is that fix made again, measured again
    single = int((frame["kind"] == "fix").sum()) == 1 and not (frame["kind"] == "exposed").any()
    for r in frame.to_dict("records"):
        if single and r["kind"] == "all":
            continue
        name = {"fix": f"fix {r['fix']}", "all": "all together", "exposed": "exposed by the fixes"}[r["kind"]]
        where = short_source(r["source"]) if r["source"] else ""
        lines.append(f"  {name}" + (f" [{r['pattern']}]" + (f" {where}" if where else "") if r["pattern"] else ""))
        if r["kind"] == "exposed":
            what = "made with the others" if r["applied"] else f"by hand: {r['reason']}"
            lines.append(f"      a new cause once every fix is made ({r['hotspots_before']} hotspot groups); its fix: "
                         f"{what}")
            continue
        if r["verdict"] == "removed by the other fixes":  # by hand, and gone with the automatic fixes
            why, _, made = str(r["reason"]).partition("; removed by the automatic fixes ")
            lines.append(f"      {why}")
            lines.append(f"      hotspot groups {r['hotspots_before']} -> 0 once the automatic fixes "
                         f"{made.partition(' made together')[0]} are made together; same outputs and gradients")
            lines.append(f"      verdict: {r['verdict']}")
            continue
        if not r["applied"]:
            lines.append(f"      not applied: {r['reason']}")
            continue
        same = "same outputs and gradients" if r["same_outputs"] else "OUTPUTS CHANGED"
        lines.append(f"      hotspot groups {r['hotspots_before']} -> {r['hotspots_after']}; {same} (largest "
                     f"difference {r['max_rel_diff']:.1e} of the largest value)")
        if not pd.isna(r.get("contiguous_hotspots_after", pd.NA)):
            lines.append(f"      run all-contiguous: hotspot groups {r['contiguous_hotspots_before']} -> "
                         f"{r['contiguous_hotspots_after']}")
        lines.extend(_wrapped("      ", f"step {format_us(r['step_us_before'])} -> {format_us(r['step_us_after'])}: "
                                        f"{saving_text(r)}; estimated {format_us(r['estimated_us'])}", hang=2))
        lines.append(f"      verdict: {r['verdict']}")
    return "\n".join(lines)


def verification_html(frame: pd.DataFrame) -> str:
    """The verification table of ``Fixes.verify()`` (its ``verification``) as HTML: one row per fix, the measured saving beside the
    estimate."""
    if frame.empty:
        return header_html(["Verified fixes: none (no fixes)."])
    shown = frame.assign(measured=[join_units(saving_text(r)) for r in frame.to_dict("records")])
    return table_html(shown, columns={
        "kind": "kind", "fix": "fix", "pattern": "pattern", "source": "file:line", "applied": "applied",
        "hotspots_before": "hotspots before", "hotspots_after": "hotspots after",
        "contiguous_hotspots_before": "contiguous run before", "contiguous_hotspots_after": "contiguous run after",
        "same_outputs": "same outputs",
        "measured": "saving, measured", "estimated_us": "saving, estimated", "step_us_before": "step before",
        "step_us_after": "step after", "verdict": "verdict", "reason": "reason"},
        formats={"fix": _fix_number},
        caption="Verified fixes (applied to copies, timed at one thread in process CPU time)")


def _fix_number(n) -> str:
    """A verified row's fix: its number, or ``-`` for the row of all fixes together (fix 0)."""
    return "-" if n == 0 else str(n)
