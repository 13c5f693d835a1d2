"""The audits of a distributed run (:class:`~auditor.distributed.RankAudits`) as text and as
HTML: per-rank totals, the hotspot groups that differ between ranks, the DDP bucket copies
that change the layout, then the reference rank's own report."""

from __future__ import annotations

import pandas as pd

from ._html import header_html, table_html
from ._report import HOTSPOT_TAIL, hotspot_lines
from ._text import Column, text_table
from ._units import format_bytes

#: A hotspot group that differs: on which rank and how, before the hotspot table's columns ...
DIFFERENCE_LEAD = [Column("rank", width=4, align=">"), Column("status", width=9)]
#: ... and its count on the reference rank and on this one, and the bytes it adds or removes.
DIFFERENCE_TAIL = [
    Column("counts", "n", width=7, align=">"),
    Column("bytes_delta", "bytes +/-", width=10, align=">", text=format_bytes),
]
#: A group of bucket copies that change the layout.
BUCKET_COLUMNS = [
    Column("rank", width=4, align=">"), Column("phase", width=8), Column("stage", width=7),
    Column("op", width=24, most=24), *HOTSPOT_TAIL,
]


def _headline(totals: pd.DataFrame, world_size: int) -> str:
    if totals.empty:
        return "Distributed format audit: no ranks"
    return f"Distributed format audit: {len(totals)} of {world_size} ranks, {totals['ops'].sum()} aten ops"


def _comparison(reference: int, ranks: int, differences: pd.DataFrame) -> str:
    """The line over the differences: none to make, none found, or the table follows."""
    if ranks == 1:
        return f"Hotspots: only rank {reference} was recorded, nothing to compare."
    if differences.empty:
        return f"Hotspots: identical on every rank (compared with rank {reference})."
    return f"Hotspots differ between ranks (compared with rank {reference}):"


def _bucket_lines(ops: pd.DataFrame, hot: pd.DataFrame, top: int, table: bool = True) -> list[str]:
    """The bucket section; ``table=False``: its totals only (the HTML shows the table)."""
    if ops.empty:
        return ["DDP buckets: no copies into or out of collective buffers were recorded."]
    lines = ["DDP buckets and collective buffers (copies per rank):"]
    for r, g in ops.groupby("rank", sort=True):
        counts = g.groupby(["phase", "stage"], observed=True).size()
        parts = ", ".join(f"{p} {s} {n}" for (p, s), n in counts.items())
        changed = g["layout_change"] | g["view_mismatch"]
        lines.append(
            f"  rank {r}: {len(g)} copies ({parts}); {int(changed.sum())} change the layout or "
            f"mismatch a bucket view, {format_bytes(g.loc[changed, 'bytes'].sum())}"
        )
    if hot.empty:
        lines.append("  No copy into or out of a bucket changes the layout.")
        return lines
    if not table:
        return lines
    shown = hot.head(top)
    shown = shown.assign(formats=shown["from_format"].astype(str) + " -> " + shown["to_format"].astype(str))
    flags = ["  VIEW MISMATCH: values permuted" if v else "" for v in shown["view_mismatch"]]
    lines.extend(text_table(shown, BUCKET_COLUMNS, tails=flags))
    if len(hot) > top:
        lines.append(f"  ... and {len(hot) - top} more (RankAudits.bucket_hotspots())")
    return lines


def ranks_text(*, world_size: int, totals: pd.DataFrame, top: int = 10, reference: int | None = None,
               differences: pd.DataFrame | None = None, bucket_ops: pd.DataFrame | None = None,
               bucket_hotspots: pd.DataFrame | None = None, reference_report: str = "") -> str:
    """One screen: per-rank totals, hotspot differences from the ``reference`` rank, DDP bucket
    copies that change the layout, then the reference rank's own report.

    ``totals`` has a row per rank (``rank``, ``ops``, ``hotspot groups``, ``hotspot ops``,
    ``bytes``, ``state``); ``differences`` is ``RankAudits.differences(reference)``,
    ``bucket_ops`` and ``bucket_hotspots`` the ranks' bucket copies and their layout-changing
    groups, ``reference_report`` the reference rank's ``Audit.report()``.
    """
    lines = [_headline(totals, world_size)]
    if totals.empty:
        return lines[0]
    for t in totals.to_dict("records"):
        lines.append(
            f"  rank {t['rank']}: {t['ops']} ops, {t['hotspot groups']} hotspot groups "
            f"({t['hotspot ops']} ops, {format_bytes(t['bytes'])} moved); {t['state']}"
        )
    lines.append("")
    lines.append(_comparison(reference, len(totals), differences))
    if len(totals) > 1 and len(differences):
        shown = differences.assign(counts=[f"{b}->{a}" for b, a in zip(differences["count_before"],
                                                                        differences["count_after"], strict=True)])
        lines.extend(hotspot_lines(shown, top, more="(RankAudits.differences())", lead=DIFFERENCE_LEAD, combine=False,
                                   tail=DIFFERENCE_TAIL))
    lines.append("")
    lines.extend(_bucket_lines(bucket_ops, bucket_hotspots, top))
    lines.append("")
    lines.append(f"Rank {reference}:")
    lines.append(reference_report)
    return "\n".join(lines)


def ranks_html(*, world_size: int, totals: pd.DataFrame, top: int = 10, reference: int | None = None,
               differences: pd.DataFrame | None = None, bucket_ops: pd.DataFrame | None = None,
               bucket_hotspots: pd.DataFrame | None = None, reference_report: str = "") -> str:
    """:func:`ranks_text` as HTML tables, for notebooks; ``reference_report`` is the reference
    rank's ``Audit.html()``."""
    if totals.empty:
        return header_html([_headline(totals, world_size)])
    parts = [header_html([_headline(totals, world_size)]), table_html(totals)]
    if len(totals) > 1 and len(differences):
        parts.append(table_html(
            differences, columns={"rank": "rank", "status": "status", "phase": "phase", "module": "module", "op": "op",
                                  "kind": "kind", "count_before": f"n on rank {reference}", "count_after": "n",
                                  "bytes_delta": "bytes +/-", "source": "file:line"},
            caption=_comparison(reference, len(totals), differences).rstrip(":"), max_rows=top,
            more="RankAudits.differences()"))
    else:
        parts.append(header_html([_comparison(reference, len(totals), differences)]))
    parts.append(header_html(_bucket_lines(bucket_ops, bucket_hotspots, top, table=False)))
    if len(bucket_hotspots):
        parts.append(table_html(
            bucket_hotspots, columns=["rank", "phase", "stage", "op", "from_format", "to_format", "count", "bytes",
                                      "view_mismatch"],
            max_rows=top, more="RankAudits.bucket_hotspots()"))
    parts.append(header_html([f"Rank {reference}:"]))
    parts.append(reference_report)
    return "<div>" + "\n".join(parts) + "</div>"
