"""HTML for notebooks: pandas' own tables (``DataFrame.style``), numbers written as the text
report writes them, and source lines shown whole.

A ``file:line`` cell shows the source as the text does (:func:`~auditor._display._text.short_source`:
relative to the working directory, its project or the installed packages), never cut, with the
recorded path in its tooltip. :func:`table_html` is the one table renderer every displayed
object uses.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable, Iterable, Mapping, Sequence

import pandas as pd

from ._report import MODULES_SHOWN, combine_blocks, module_rows, total_lines
from ._text import join_units, measured_short, short_source
from ._units import format_bytes, format_us

#: Columns shown as ``file:line``, whole, with the recorded path as tooltip.
SOURCE_COLUMNS = ("source",)
#: Columns of prose or code: they wrap, and are left aligned; code in a fixed-width font.
TEXT_COLUMNS = ("fix", "detail", "suggestion", "line")
CODE_COLUMNS = ("suggestion", "line")

_TEXT_CSS = "text-align: left; vertical-align: top"
_NUMBER_CSS = "text-align: right; vertical-align: top; white-space: nowrap"
#: Prose and code wrap within these widths, so a table of three of them fits a 1400 px page.
_PROSE_CSS = f"{_TEXT_CSS}; white-space: normal; min-width: 10em; max-width: 16em"
_CODE_CSS = (f"{_TEXT_CSS}; white-space: pre-wrap; overflow-wrap: break-word; min-width: 10em; max-width: 16em; "
             "font-family: monospace")


def table_html(frame: pd.DataFrame, *, columns: Mapping[str, str] | Sequence[str] | None = None,
               formats: Mapping[str, Callable | str] | None = None, sources: Iterable[str] = SOURCE_COLUMNS,
               caption: str = "", max_rows: int | None = None, more: str = "") -> str:
    """``frame`` as an HTML table (pandas' Styler): every text cell escaped, numbers as the
    report writes them, source columns whole with their path in a tooltip, no index.

    Args:
        columns: the columns to show, in order; a mapping also renames them (``{"source":
            "file:line"}``). Default: all.
        formats: column -> a callable or a format string, over :func:`default_formats`.
        sources: columns holding ``path:line`` values (:func:`source_html`).
        caption: the table's caption (plain text).
        max_rows: rows shown; past them a line says how many more, naming ``more`` (``"Audit.causes()"``).
    """
    shown = frame if max_rows is None else frame.head(max_rows)
    names = dict(columns) if isinstance(columns, Mapping) else {c: c for c in (columns or frame.columns)}
    names = {c: n for c, n in names.items() if c in shown.columns}
    twice = sorted({n for n in names.values() if list(names.values()).count(n) > 1})
    if twice:  # two columns under one heading would share one format: raw numbers in one of them
        raise ValueError(f"columns shown under the same heading: {', '.join(map(repr, twice))}")
    fmt = {**default_formats(shown), **(formats or {})}
    sources = [c for c in sources if c in names]
    view = shown[list(names)].rename(columns=names).reset_index(drop=True)  # Styler wants a unique index
    styler = view.style.format(escape="html", na_rep="-").format_index(_heading, axis=1).hide(axis="index")
    # each later format() names its subset: one without resets the other columns' escaping
    formatted = {names[c]: _escaped(f) for c, f in fmt.items() if c in names and c not in sources}
    texts = [c for c in names if c in TEXT_COLUMNS and c not in sources and not pd.api.types.is_numeric_dtype(shown[c])]
    # three such columns fit a 1400 px page at 16em each; one alone (a fix's "why") takes twice that
    width = PROSE_WIDTH if len(texts) > 1 else LONE_PROSE_WIDTH
    for c in texts:  # prose and code: escaped, in a box of a width (a table cell ignores max-width)
        formatted[names[c]] = _boxed(formatted.get(names[c], html.escape), c in CODE_COLUMNS, width)
    if formatted:
        styler = styler.format(formatted, subset=list(formatted), na_rep="-")
    if sources:
        styler = styler.format(source_html, subset=[names[c] for c in sources])
    css = {n: column_css(shown[c], c, sources=c in sources, formatted=c in fmt and c != "op") for c, n in names.items()}
    styler = styler.set_table_styles(css, overwrite=False)
    if caption:
        styler = styler.set_caption(html.escape(caption))
    out = styler.to_html()
    if len(frame) > len(shown):
        out += _paragraph(f"... and {len(frame) - len(shown)} more" + (f" ({more})" if more else ""))
    return out


def column_css(values: pd.Series, name: str, *, sources: bool = False, formatted: bool = False) -> list[dict]:
    """A column's cell style, and its heading aligned like its cells: numbers (a fix's number
    too) right and narrow, source lines left and whole, prose and code left and wrapped within
    a width."""
    numeric = pd.api.types.is_numeric_dtype(values)
    if sources:  # whole names; a long path wraps at its folders (source_html)
        props = f"{_TEXT_CSS}; white-space: normal; overflow-wrap: normal; word-break: keep-all"
    elif name in CODE_COLUMNS and not numeric:
        props = _CODE_CSS
    elif name in TEXT_COLUMNS and not numeric:
        props = _PROSE_CSS
    elif formatted or numeric:
        props = _NUMBER_CSS
    else:
        props = _TEXT_CSS
    align = props.split(";", 1)[0]
    return [{"selector": "td", "props": props}, {"selector": "th", "props": f"{align}; vertical-align: bottom"}]


#: the width prose and code wrap within in a table of several such columns, and in one of one
PROSE_WIDTH, LONE_PROSE_WIDTH = "16em", "32em"


def _boxed(escaped: Callable[[object], str], code: bool, width: str = PROSE_WIDTH) -> Callable[[object], str]:
    """A cell formatter that puts the escaped text in a block that wraps within ``width``."""
    font = "; font-family: monospace" if code else ""
    space = "pre-wrap" if code else "normal"
    return lambda v: (f'<div style="max-width: {width}; min-width: 10em; white-space: {space}; '
                      f'overflow-wrap: break-word{font}">{_break_paths(escaped(join_units("" if v is None else str(v))))}</div>')


#: a dot between two parts of a dotted name (``torch.nn.functional``), not in a number
_NAME_DOT = re.compile(r"(?<=[A-Za-z_)])\.(?=[A-Za-z_])")


def _break_paths(text: str) -> str:
    """Escaped text in which a long dotted name may wrap after its dots (``torch.nn.<wbr>
    functional.<wbr>channel_shuffle``), so a cell of a fixed width fits it without cutting a word."""
    return _LONG_TOKEN.sub(lambda m: _NAME_DOT.sub(".<wbr>", m.group(0)), text)


#: a token too long for a 10em column: only these get break points
_LONG_TOKEN = re.compile(r"[^\s<>]{25,}")


def _heading(name) -> str:
    """A column's heading, escaped, that may wrap after its underscores: a frame's own column
    names (``hotspots_before``, ``bytes_delta``) would otherwise each hold a number column as
    wide as the name, and ``auditor.diff``'s ten of them ran past a 1400 px page."""
    return html.escape(str(name)).replace("_", "_<wbr>")


def _escaped(f: Callable | str) -> Callable[[object], str]:
    """A cell formatter whose text is escaped."""
    return lambda v: html.escape(f.format(v) if isinstance(f, str) else str(f(v)))


def default_formats(frame: pd.DataFrame) -> dict[str, Callable]:
    """Formats by column name: bytes (``bytes``, ``*_bytes``, ``bytes_*``) as ``802.8 kB``,
    times in µs (``*_us``, ``*_us_*``) as ``404.7 µs``, ``share`` as a percentage."""
    out: dict[str, Callable] = {}
    for c in frame.columns:
        name = str(c)
        if name == "bytes" or name.endswith("_bytes") or name.startswith("bytes_"):
            out[c] = format_bytes
        elif name.endswith("_us") or "_us_" in name:  # step_us_before too
            out[c] = format_us
        elif name == "share":
            out[c] = "{:.1%}".format
        elif name == "op":  # "convolution_backward", not "aten.convolution_backward.default": tables fit 1400 px
            out[c] = short_op
    return out


def short_op(op) -> str:
    """An aten op's name as a table shows it: without ``aten.`` and the ``.default`` overload."""
    text = "" if op is None else str(op)
    return text.removeprefix("aten.").removesuffix(".default")


def source_html(source) -> str:
    """One ``path:line`` as escaped HTML: the short path and line (:func:`short_source`), with
    the recorded one in its ``title`` tooltip, that may wrap after a ``/`` (never inside a
    folder's or a file's name). Anything else (a notebook cell's name) as is."""
    source = "" if source is None else str(source)
    short = html.escape(short_source(source)).replace("/", "/<wbr>")  # a narrow column wraps it at its folders
    return f'<span title="{html.escape(source, quote=True)}">{short}</span>' if source else ""


def audit_html(ops: pd.DataFrame, hot: pd.DataFrame, summary: pd.DataFrame, causes: pd.DataFrame | None = None,
               *, complete: bool = True, error: str = "", top: int = 10, depth: int = 1,
               verified: pd.DataFrame | None = None, threads: int | None = None,
               kernels: pd.DataFrame | None = None, step_time=None) -> str:
    """The report (:func:`~auditor._display._report.audit_report`) as HTML: the totals (times
    at ``threads``), the ``top`` causes (each leading with its measured saving, the estimate
    beside it, once ``verified``), the hotspot groups and the modules at ``depth`` as tables."""
    parts = [header_html(total_lines(ops, hot, causes, complete, error, threads=threads, verified=verified,
                                     kernels=kernels, step_time=step_time, width=None))]
    if not len(hot):
        parts.append(_paragraph("No losses or conversions between convolutions: channels_last propagates."))
        return _block(parts)
    timed = causes is not None and "saving_us" in causes and causes["saving_us"].notna().any()
    if causes is not None and len(causes):
        cols = {"cause": "cause", "pattern": "pattern", "phase": "phase", "op": "op", "module": "module",
                "module_type": "type", "source": "file:line", "hotspots": "hotspots", "bytes": "bytes"}
        if verified is not None:  # the measured saving leads; the estimate stands beside it, labelled
            measured = {int(r["cause"]): join_units(measured_short(r)) for r in verified.to_dict("records")
                        if r["kind"] == "fix"}
            causes = causes.assign(measured=[measured.get(int(c), "") for c in causes["cause"]])
            cols["measured"] = "saving, measured (verified)"
        if timed:
            cols |= {"time_us": "time", **{c: n for c, n in (("hotspot_us", "of it hotspots"),
                                                             ("replaced_us", "of it ops its fix replaces"))
                                            if c in causes},
                     "saving_us": "saving, estimated" if verified is not None else "saving"}
            if "saving_trusted" in causes:  # an estimate it cannot stand behind is left blank, and why is said
                causes = causes.assign(saving_us=causes["saving_us"].where(causes["saving_trusted"].astype(bool)))
                if (causes["saving_note"].astype(str) != "").any():
                    cols["saving_note"] = "about the estimate"
        cols["fix"] = "fix"
        order = "most time saved" if timed else "most bytes"
        parts.append(table_html(causes, columns=cols, max_rows=top, more="Audit.causes()",
                                caption=f"Causes, {order} first ({len(causes)})"))
    cols = {"cause": "cause", "phase": "phase", "module": "module", "op": "op", "kind": "kind",
            "from_format": "from", "to_format": "to", "count": "count", "bytes": "bytes"}
    if "time_us" in hot and hot["time_us"].notna().any():
        cols["time_us"] = "time"
    cols["source"] = "file:line"
    rows = combine_blocks(hot)
    if len(rows) < len(hot):  # repeated blocks: one row each, saying how many groups it holds
        cols = {k: v for c, n in cols.items() for k, v in ((c, n), *([("groups", "groups")] if c == "module" else []))}
    caption = f"Hotspot groups ({len(hot)}" + (f"; {len(rows)} rows, repeated blocks combined)" if len(rows) < len(hot)
                                               else ")")
    parts.append(table_html(rows, columns=cols, max_rows=top, more="Audit.hotspots()", caption=caption))
    summ, mod_timed = module_rows(summary)
    what = "time" if mod_timed else "bytes"
    cols = {"module": "module", "hotspots": "hotspots", "bytes": "bytes", "share": f"share of {what}"}
    parts.append(table_html(summ, columns=cols | ({"time_us": "time"} if mod_timed else {}),
                            max_rows=MODULES_SHOWN, more=f"Audit.summary({depth})",
                            caption=f"Modules with most hotspot {what} (depth {depth})"))
    return _block(parts)


def header_html(lines: Sequence[str]) -> str:
    """Report lines as a short header: the first in bold, the rest under it, each a number
    joined to its unit by a space no line breaks at."""
    if not lines:
        return ""
    first, *rest = lines
    body = "".join(f"<br>{html.escape(join_units(r.strip()))}" for r in rest)
    return f"<p><b>{html.escape(join_units(first))}</b>{body}</p>"


def _paragraph(text: str) -> str:
    return f"<p>{html.escape(join_units(text))}</p>"


def _block(parts: Iterable[str]) -> str:
    return "<div>" + "\n".join(p for p in parts if p) + "</div>"
