"""The compiled step in the report and the HTML: per graph whether Inductor's layout
optimization ran, the conversions its generated code makes, and each eager cause beside them."""

from __future__ import annotations

import pandas as pd

from ._html import table_html
from ._text import Column, short_source, shorten, text_table
from ._units import format_bytes, format_us


def _headline(graphs: pd.DataFrame, conv: pd.DataFrame, compared: pd.DataFrame) -> str:
    removed = int((compared["status"] == "removed by the compiler").sum())
    kept = int((compared["status"] == "still there").sum())
    only = int((compared["status"] == "only compiled").sum())
    return (f"Compiled step (torch.compile, Inductor): {len(graphs)} graphs, {len(conv)} conversion kernels "
            f"({format_us(conv['time_us'].sum(min_count=1))}); eager causes: {removed} removed by the compiler, "
            f"{kept} still there; {only} conversions only the compiled step makes")


def compiled_text(graphs: pd.DataFrame, conv: pd.DataFrame, compared: pd.DataFrame, top: int = 10) -> str:
    """The compiled part of a compiled audit's report."""
    lines = [_headline(graphs, conv, compared), "", "Graphs:"]
    lines += text_table(graphs, [
        Column("graph", width=5), Column("phase", width=8), Column("layout_opt", "layout opt", width=10,
                                                                   text=lambda v: "on" if v else "off"),
        Column("kernels", width=7, align=">"), Column("conversions", width=11, align=">"),
        Column("time_us", "time", width=9, align=">", text=format_us),
        Column("layout_opt_reason", "why", most=70)])
    if len(conv):
        lines += ["", "Conversions in the generated code:"]
        lines += text_table(conv.head(top), [
            Column("phase", width=8), Column("kernel", most=44),
            Column("from_format", "from", most=16), Column("to_format", "to", most=16),
            Column("bytes", width=8, align=">", text=format_bytes), Column("time_us", "time", width=9, align=">",
                                                                           text=format_us),
            Column("source", "line", most=40, text=short_source, clip=shorten)],
            notes=[f"{r}{' [weight, every step]' if w else ''}{'; ' + n if n else ''}"
                   for r, w, n in zip(conv.head(top)["reason"], conv.head(top)["weight"], conv.head(top)["note"])])
    if len(compared):
        lines += ["", "Eager causes under the compiler:"]
        lines += text_table(compared.head(top), [
            Column("cause", width=5, text=lambda v: "-" if pd.isna(v) else str(int(v))),
            Column("phase", width=8), Column("pattern", most=20), Column("source", "line", most=40, text=short_source, clip=shorten),
            Column("status", most=24), Column("kernel", most=44)])
    return "\n".join(lines)


def compiled_html(graphs: pd.DataFrame, conv: pd.DataFrame, compared: pd.DataFrame, top: int = 10) -> str:
    """The compiled part of a compiled audit's HTML."""
    parts = [f"<p>{_headline(graphs, conv, compared)}</p>",
             table_html(graphs.drop(columns=["output_code"]), caption="Graphs Inductor lowered"),
             table_html(conv, caption="Conversions in the generated code", max_rows=top, more="audit.compiled.conversions()"),
             table_html(compared, caption="Eager causes under the compiler", max_rows=top,
                        more="auditor.compare_compiled()")]
    return "<div>" + "".join(parts) + "</div>"
