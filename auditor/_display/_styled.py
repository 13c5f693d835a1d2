"""Any DataFrame shown in a notebook as the library's own tables show theirs: source lines
short, bytes and times in units (:func:`~auditor._display._html.table_html`)."""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd

from ._html import SOURCE_COLUMNS, table_html
from ._text import short_source


class Styled:
    """A DataFrame that shows itself in a notebook as the library's HTML table, and elsewhere as
    its text; ``frame`` is the DataFrame, unchanged."""

    def __init__(self, frame: pd.DataFrame, **options):
        self.frame = frame
        self.options = options

    def _repr_html_(self) -> str:
        return table_html(self.frame, **self.options)

    def __repr__(self) -> str:
        return self.frame.to_string(index=False)

    def table(self) -> pd.DataFrame:
        """The frame as its table shows it, to export (``to_csv``, a spreadsheet): the columns
        shown, in order and named as shown; each source as its short ``file:line``, relative to
        its package as the report writes it; bytes, times and shares as numbers with their unit
        in the heading (``bytes (B)``, ``time (µs)`` to 0.1 µs, ``share (%)``), never text."""
        frame = self.frame
        columns = self.options.get("columns")
        names = dict(columns) if isinstance(columns, Mapping) else {c: c for c in (columns or frame.columns)}
        out = {}
        for c, name in names.items():
            if c not in frame.columns:
                continue
            values, key, heading = frame[c], str(c), str(name)
            if c in SOURCE_COLUMNS:
                values = values.map(lambda s: short_source(s) if isinstance(s, str) else s)
            elif key == "bytes" or key.endswith("_bytes") or key.startswith("bytes_"):
                heading += " (B)"
            elif key.endswith("_us") or "_us_" in key:
                if heading == key:  # the frame's own name: its unit moves into the heading
                    heading = key.removesuffix("_us").replace("_us_", "_")
                values, heading = values.round(1), heading + " (µs)"  # to 0.1 µs, as a profiler gives
            elif key == "share":
                values, heading = (values * 100).round(2), heading + " (%)"
            out[heading] = values.to_numpy()
        return pd.DataFrame(out)

    def to_csv(self, path_or_buf=None, **kwargs):
        """:meth:`table` as CSV (``DataFrame.to_csv``, no index); with no path, the text."""
        return self.table().to_csv(path_or_buf, index=False, **kwargs)


def styled(frame: pd.DataFrame, **options) -> Styled:
    """``frame`` to show in a notebook as the audit's own tables show: short ``file:line``
    sources (the recorded path in a tooltip), bytes (``bytes``, ``*_bytes``) and times
    (``*_us``) in units, no index. ``options``: ``columns`` (those to show, in order; a mapping
    also renames them), ``formats`` (column -> a callable or a format string), ``caption`` and
    ``max_rows``. The DataFrame itself is ``.frame``, unchanged; ``.table()`` and ``.to_csv()``
    export it as shown: short ``file:line`` sources, units in the column names
    (``styled(audit.causes()).to_csv("causes.csv")``)."""
    return Styled(frame, **options)

