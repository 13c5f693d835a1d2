"""Any DataFrame shown in a notebook as the library's own tables show theirs: source lines
short, bytes and times in units (:func:`~auditor._display.table_html`); and a timing of two
versions of a step as a stated conclusion."""

from __future__ import annotations

import pandas as pd

from ._html import table_html
from ._text import saving_text
from ._units import format_us


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
    """``frame`` to show in a notebook with short ``file:line`` sources, bytes (``bytes``,
    ``*_bytes``) and times (``*_us``) in units and no index; ``options``: those of
    :func:`~auditor._display.table_html` (``columns``, ``formats``, ``caption``, ``max_rows``)."""
    return Styled(frame, **options)


_VERDICTS = {"faster": "helps", "slower": "hurts"}


def timing_text(times: pd.DataFrame, estimated_us: float | None = None) -> str:
    """A :func:`~auditor._measure.time_interleaved` table of a step before (its first row) and
    after, in words: how much faster or slower, with the interval of the paired ratio, or that
    this machine's noise hides it; beside the audit's estimate when given."""
    names = list(times.index)
    first = names[0]
    b = float(times.at[first, "us"])
    lines = []
    for name in names[1:]:
        r = times.loc[name]
        row = {"verdict": _VERDICTS.get(r["verdict"], r["verdict"]), "ratio": r["ratio"],
               "ratio_low": r["ratio_low"], "ratio_high": r["ratio_high"], "rounds": r["rounds"],
               "saving_us": b * (1 - r["ratio"]), "saving_low_us": b * (1 - r["ratio_high"]),
               "saving_high_us": b * (1 - r["ratio_low"])}
        lines.append(f"{name} against {first} ({format_us(b)} -> {format_us(r['us'])} per step): {saving_text(row)}")
    clock = "process CPU time" if times["clock"].iat[0] == "cpu" else "wall time"
    threads = int(times["threads"].iat[0]) if "threads" in times else None
    at = f"{threads} thread{'s' if threads != 1 else ''}, " if threads else ""
    lines.append(f"({at}{clock}, {first} and the rest alternating in each round: the ratio within a round is "
                 "what load from other processes leaves alone)")
    if estimated_us is not None:
        lines.append(f"the audit estimated a saving of {format_us(estimated_us)}")
    return "\n".join(lines)
