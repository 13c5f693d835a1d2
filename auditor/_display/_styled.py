"""Any DataFrame shown in a notebook as the library's own tables show theirs: source lines
short, bytes and times in units (:func:`~auditor._display._html.table_html`)."""

from __future__ import annotations

import pandas as pd

from ._html import table_html


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


def styled(frame: pd.DataFrame, **options) -> Styled:
    """``frame`` to show in a notebook as the audit's own tables show: short ``file:line``
    sources (the recorded path in a tooltip), bytes (``bytes``, ``*_bytes``) and times
    (``*_us``) in units, no index. ``options``: ``columns`` (those to show, in order; a mapping
    also renames them), ``formats`` (column -> a callable or a format string), ``caption`` and
    ``max_rows``. The DataFrame itself is ``.frame``, unchanged."""
    return Styled(frame, **options)

