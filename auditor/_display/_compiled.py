"""The compiled step in the report and the HTML: per graph whether Inductor's layout
optimization ran, the conversions its generated code makes, and each eager cause beside them."""

from __future__ import annotations

import pandas as pd

from .._analysis._compiled import COMPILED_TIME, DECISION_COLUMNS, EAGER_TIME
from ._html import table_html
from ._text import Column, short_source, shorten, text_table
from ._units import format_bytes, format_us


def _headline(graphs: pd.DataFrame, conv: pd.DataFrame, compared: pd.DataFrame) -> str:
    removed = int((compared["status"] == "removed by the compiler").sum())
    kept = int((compared["status"] == "still there").sum())
    only = int((compared["status"] == "only compiled").sum())
    return (f"Compiled step (torch.compile, Inductor): {_count(len(graphs), 'graph')}, "
            f"{_count(len(conv), 'conversion kernel')} ({format_us(conv['time_us'].sum(min_count=1))}); eager causes: "
            f"{removed} removed by the compiler, {kept} still there; {_count(only, 'conversion')} only the compiled "
            f"step makes")


def _count(n: int, noun: str) -> str:
    """``1 graph``, ``2 graphs``, ``0 graphs``."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


#: the compared rows no eager cause explains: shown apart from the eager causes
ONLY_COMPILED = "only compiled"


def _compared_parts(compared: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """The eager causes under the compiler, and apart from them the conversions only the
    compiled step makes (issue 29: those sat under the eager causes' heading)."""
    only = compared["status"] == ONLY_COMPILED if len(compared) else pd.Series(dtype=bool)
    parts = [("Eager causes under the compiler", compared[~only]),
             ("Conversions only the compiled step makes (no eager cause)", compared[only])]
    return [(title, rows) for title, rows in parts if len(rows)]


def _filled(graphs: pd.DataFrame, compared: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The tables with the columns a compiled step read from an older CSV lacks (the decision's
    parts, the compared times and their note), empty."""
    graphs = graphs.assign(**{c: "" for c in DECISION_COLUMNS if c not in graphs})
    compared = compared.assign(**{c: float("nan") for c in ("eager_time_us", "compiled_time_us") if c not in compared},
                               **({"time_note": ""} if "time_note" not in compared else {}))
    return graphs, compared


def compiled_text(graphs: pd.DataFrame, conv: pd.DataFrame, compared: pd.DataFrame, top: int = 10) -> str:
    """The compiled part of a compiled audit's report."""
    graphs, compared = _filled(graphs, compared)
    lines = [_headline(graphs, conv, compared), "",
             "Graphs (time: the graph's kernels per compiled step, every kernel with its computing, timed at the "
             "eager ops' thread count; the eager step's op times above are the uncompiled step's ops, another "
             "program: compare steps with auditor's benchmarks/compiled.py):"]
    lines += text_table(graphs, [
        Column("graph", width=5), Column("phase", width=8), Column("layout_opt", "layout opt", width=10,
                                                                   text=lambda v: "on" if v else "off"),
        Column("kernels", width=7, align=">"), Column("conversions", width=11, align=">"),
        Column("time_us", "time", width=9, align=">", text=format_us),
        Column("layout_opt_rule", "decided by", most=22),
        Column("layout_opt_reason", "why", most=70)],
        notes=[_decision_note(g) for g in graphs.to_dict("records")])
    if len(conv):
        lines += ["", "Conversions in the generated code (times: the compiled kernels', not eager ops'):"]
        lines += text_table(conv.head(top), [
            Column("phase", width=8), Column("kernel", most=44),
            Column("from_format", "from", most=16), Column("to_format", "to", most=16),
            Column("bytes", width=8, align=">", text=format_bytes), Column("time_us", "time", width=9, align=">",
                                                                           text=format_us),
            Column("source", "line", most=40, text=short_source, clip=shorten)],
            notes=[f"{r}{' [weight, every step]' if w else ''}{'; ' + n if n else ''}"
                   for r, w, n in zip(conv.head(top)["reason"], conv.head(top)["weight"], conv.head(top)["note"])])
    for title, rows in _compared_parts(compared):
        lines += ["", f"{title}:"]
        lines += text_table(rows.head(top), [
            Column("cause", width=5, text=lambda v: "-" if pd.isna(v) else str(int(v))),
            Column("phase", width=8), Column("pattern", most=20), Column("source", "line", most=40, text=short_source, clip=shorten),
            Column("status", most=24), Column("eager_time_us", "eager", width=9, align=">", text=format_us),
            Column("compiled_time_us", "compiled", width=9, align=">", text=format_us), Column("kernel", most=44)],
            notes=list(rows.head(top)["time_note"].fillna("")))
    if len(compared):
        lines += ["", f"Times beside each cause: {EAGER_TIME}; {COMPILED_TIME}."]
    return "\n".join(lines)


def _decision_note(g: dict) -> str:
    """A graph's numbers, the convolutions that tipped its layout and what to change."""
    parts = [f"numbers: {g['layout_opt_numbers']}" if g.get("layout_opt_numbers") else "",
             f"tipped by: {g['layout_opt_tipped']}" if g.get("layout_opt_tipped") else "",
             f"to change: {g['layout_opt_change']}" if g.get("layout_opt_change") else ""]
    return "; ".join(p for p in parts if p)


def compiled_html(graphs: pd.DataFrame, conv: pd.DataFrame, compared: pd.DataFrame, top: int = 10) -> str:
    """The compiled part of a compiled audit's HTML."""
    graphs, compared = _filled(graphs, compared)
    parts = [f"<p>{_headline(graphs, conv, compared)}</p>",
             table_html(graphs.drop(columns=["output_code"]), caption="Graphs Inductor lowered"),
             table_html(conv, caption="Conversions in the generated code (times: the compiled kernels', not eager ops')", max_rows=top, more="audit.compiled.conversions()"),
             *(table_html(rows, caption=title, max_rows=top, more="auditor.compare_compiled()")
               for title, rows in _compared_parts(compared))]
    return "<div>" + "".join(parts) + "</div>"
