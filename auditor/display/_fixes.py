"""Suggested fixes (:class:`~auditor.fix.Fixes`) as text and as HTML, from their table."""

from __future__ import annotations

from collections.abc import Collection

import pandas as pd

from ._html import header_html, table_html
from ._text import short_source
from ._units import format_bytes


def fixes_headline(frame: pd.DataFrame, hotspot_groups: int) -> str:
    """How many fixes, for how many hotspot groups, and the bytes they save."""
    if frame.empty:
        return "Suggested fixes: none (no hotspots)."
    return (f"Suggested fixes: {len(frame)} for {hotspot_groups} hotspot groups, "
            f"{format_bytes(frame['bytes'].clip(lower=0).sum())} to save "
            f"(forward {format_bytes(frame['forward_bytes'].sum())}, "
            f"backward {format_bytes(frame['backward_bytes'].sum())} of hotspots)")


def fixes_text(frame: pd.DataFrame, hotspot_groups: int, *, writes: Collection[str] = ()) -> str:
    """The headline, then each fix: what and where, the line as it is, what to write or do, and
    why. ``frame`` is ``Fixes.frame``; ``writes``: the actions whose suggestion is code to write
    at the line (the others' is something to do)."""
    lines = [fixes_headline(frame, hotspot_groups)]
    for r in frame.itertuples():
        where = short_source(r.source) or r.module
        lines.append("")
        lines.append(
            f"{r.fix}. {r.action}: {where}  ({r.module}, {r.module_type or '-'})  "
            f"saves {format_bytes(r.bytes)} ({r.hotspots} hotspot group{'s' if r.hotspots != 1 else ''})"
        )
        if r.line:
            lines.append(f"     now:   {r.line.strip()}")
        if r.suggestion:
            label = "write:" if r.action in writes else "do:   "
            lines.append(f"     {label} {r.suggestion.strip()}")
        lines.append(f"     why:   {r.detail}")
    return "\n".join(lines)


def fixes_html(frame: pd.DataFrame, hotspot_groups: int) -> str:
    """The headline, then one table row per fix."""
    head = header_html([fixes_headline(frame, hotspot_groups)])
    if frame.empty:
        return head
    return head + table_html(frame, columns={
        "fix": "fix", "action": "action", "source": "file:line", "module": "module", "module_type": "type",
        "bytes": "saves", "hotspots": "hotspot groups", "line": "now", "suggestion": "do", "detail": "why"},
        formats={"line": str.strip})
