"""Text shared by every rendering: names cut to a width, source lines as people read them, and
the one fixed-width text table (HTML tables: :mod:`auditor._display._html`).

A ``path:line`` source is shown relative to the deepest folder holding it among the working
directory, its project and the installed packages (``torchvision/models/resnet.py:150``),
never cut (:func:`short_source`), in reports, tables and figures alike; the recorded path
stays in the DataFrames and the CSV.
"""

from __future__ import annotations

import functools
import os
import re
import site
import sysconfig
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pandas as pd

from ._units import format_us

#: Folders that mark a project's root.
PROJECT_MARKERS = (".git", "pyproject.toml", "setup.py", "setup.cfg")


#: the space between a number and its unit (``4.0 ms``, ``802.8 kB``, ``0 B``)
_NUMBER_UNIT = re.compile(r"(?<=\d) (?=[kMGTµmn]?[Bs](?![A-Za-z]))")
#: a space no line breaks at (textwrap breaks at ASCII whitespace only; a browser not at all)
NBSP = "\u00a0"


def join_units(text: str) -> str:
    """``text`` with a non-breaking space between each number and its unit: HTML that flows, and
    text that wraps, never part ``4.0`` from ``ms``."""
    return _NUMBER_UNIT.sub(NBSP, text)


def wrap(text: str, width: int | None) -> list[str]:
    """``text`` wrapped to ``width`` at spaces (``textwrap.wrap``), never between a number and
    its unit; ``width=None``: one line, for HTML, which flows in its own width."""
    if width is None:
        return [text]
    return [part.replace(NBSP, " ") for part in textwrap.wrap(join_units(text), width)] or [""]


def shorten(name: str, width: int) -> str:
    """Shorten a long module or op name from the left, where it repeats its parents."""
    return name if len(name) <= width else "…" + name[-(width - 1):]


def cut(text: str, width: int) -> str:
    """The first ``width`` characters of ``text``."""
    return text[:width]


def short_source(source) -> str:
    """A ``path:line`` source as people read it: the short path (:func:`short_path`) and the
    line, never cut. Anything else (a notebook cell's name, ``""``) as is."""
    source = "" if source is None else str(source)
    path, sep, line = source.rpartition(":")
    return f"{short_path(path)}:{line}" if sep and line.isdigit() else source


def short_path(path: str) -> str:
    """``path`` relative to the deepest folder holding it among the working directory, its
    project root and the installed packages' folders (site-packages); else unchanged."""
    if not os.path.isabs(path):
        return path
    path = os.path.normpath(path)
    best = ""
    for base in _bases(os.getcwd()):
        if len(base) > len(best) and path.startswith(base + os.sep):
            best = base
    return os.path.relpath(path, best) if best else path


@functools.lru_cache(maxsize=8)
def _bases(cwd: str) -> tuple[str, ...]:
    """The folders paths are shown relative to, for this working directory."""
    found = [cwd]
    here = cwd
    while os.path.dirname(here) != here:
        if any(os.path.exists(os.path.join(here, m)) for m in PROJECT_MARKERS):
            found.append(here)
            break
        here = os.path.dirname(here)
    paths = sysconfig.get_paths()
    found += [paths.get("purelib", ""), paths.get("platlib", ""), paths.get("stdlib", "")]
    try:
        found += [*site.getsitepackages(), site.getusersitepackages()]
    except AttributeError:  # an old virtualenv's site module
        pass
    # the file system's root is no folder to be relative to
    return tuple({os.path.normpath(b) for b in found if b and os.path.dirname(os.path.normpath(b)) != b})


@dataclass(frozen=True)
class Column:
    """One column of a :func:`text_table`.

    Attributes:
        key: the frame's column.
        header: its heading (default: ``key``).
        width: the least width; a longer text widens its row (as a format width does).
        most: when given, the column fits the longest text shown, between ``width`` and
            ``most``, and a longer text is cut to it by ``clip``.
        align: ``<`` or ``>``.
        text: a value -> its text.
        clip: how a text is cut to the width (:func:`cut`: its start; :func:`shorten`: its end).
        gap: spaces before the column (none before the first).
    """

    key: str
    header: str | None = None
    width: int = 0
    most: int | None = None
    align: str = "<"
    text: Callable[[object], str] = str
    clip: Callable[[str, int], str] = cut
    gap: int = 1


def text_table(frame: pd.DataFrame, columns: Sequence[Column], *, indent: str = "  ", header: bool = True,
               notes: Sequence[str] | None = None, tails: Sequence[str] | None = None) -> list[str]:
    """``frame`` as fixed-width text lines: a heading line (``header``), then one line per row,
    each starting with ``indent``.

    ``tails``: per row, text written right after its line (a flag); ``notes``: per row, a line
    written under it, indented to the second column (its source line), none where empty.
    """
    cells = [[c.text(v) for v in frame[c.key]] for c in columns]
    widths = []
    for c, texts in zip(columns, cells, strict=True):
        w = c.width if c.most is None else min(c.most, max([c.width, *map(len, texts)]))
        widths.append(w)
        if c.most is not None:
            texts[:] = [t if len(t) <= w else c.clip(t, w) for t in texts]

    def line(texts: Sequence[str]) -> str:
        parts = [(" " * c.gap if i else "") + f"{t:{c.align}{w}}"
                 for i, (c, w, t) in enumerate(zip(columns, widths, texts, strict=True))]
        return indent + "".join(parts)

    lines = [line([c.key if c.header is None else c.header for c in columns])] if header else []
    under = " " * (len(indent) + widths[0] + columns[1].gap) if len(columns) > 1 else indent
    for i, texts in enumerate(zip(*cells)):
        lines.append(line(texts) + (tails[i] if tails is not None else ""))
        if notes is not None and notes[i]:
            lines.append(under + notes[i])
    return lines


def saving_text(row) -> str:
    """One verified step's time, in words: how much faster or slower after than before, with its
    interval and rounds, or that this machine's noise hides it. ``row``: a row of
    ``Fixes.verify()`` (``step_us_before``, ``ratio``, ``ratio_low``, ``ratio_high``,
    ``saving_us``, ``saving_low_us``, ``saving_high_us``, ``rounds``, ``verdict``)."""
    verdict = str(row["verdict"])
    if verdict in ("not applied", "changes outputs", ""):
        return verdict or "-"
    if verdict == "hurts contiguous":
        return _hurts_contiguous(row)
    ratio, low, high = float(row["ratio"]), float(row["ratio_low"]), float(row["ratio_high"])
    interval = f"[{low:.3f}, {high:.3f}]"
    rounds = f"{int(row['rounds'])} paired rounds"
    if verdict == "helps":
        return (f"{1 - ratio:.1%} faster: after / before {ratio:.3f} {interval} over {rounds}, saving "
                f"{format_us(row['saving_us'])} [{format_us(row['saving_low_us'])}, {format_us(row['saving_high_us'])}]")
    if verdict == "hurts":
        return (f"{ratio:.2f}× slower: after / before {ratio:.3f} {interval} over {rounds}, costing "
                f"{format_us(-row['saving_us'])} [{format_us(-row['saving_high_us'])}, {format_us(-row['saving_low_us'])}]")
    if low <= 1 <= high:
        return (f"within noise: after / before {ratio:.3f} {interval} over {rounds} straddles 1, so no saving can "
                "be told from this machine's noise")
    # an interval that does not straddle 1 and still decides nothing: too few rounds to stand on
    return (f"within noise: after / before {ratio:.3f} {interval} over {rounds}, too few rounds to tell a saving "
            "from this machine's noise")


def _hurts_contiguous(row) -> str:
    return (f"hurts contiguous: the model run all-contiguous has {row.get('contiguous_hotspots_before')} hotspot "
            f"groups without the fix and {row.get('contiguous_hotspots_after')} with it, so it is not made "
            "automatically")


def measured_short(row) -> str:
    """A verified saving in a table cell: the saving and its interval (``1.2 ms [529.3 µs, 1.6
    ms]``), what it costs, or the verdict; :func:`saving_text` has the ratio and rounds."""
    verdict = str(row["verdict"])
    if verdict == "helps":
        return f"{format_us(row['saving_us'])} [{format_us(row['saving_low_us'])}, {format_us(row['saving_high_us'])}]"
    if verdict == "hurts contiguous":
        return (f"hurts contiguous ({row.get('contiguous_hotspots_before')} -> "
                f"{row.get('contiguous_hotspots_after')} groups)")
    if verdict == "hurts":
        return (f"costs {format_us(-row['saving_us'])} [{format_us(-row['saving_high_us'])}, "
                f"{format_us(-row['saving_low_us'])}]")
    return verdict or "-"


def estimate_text(row) -> str:
    """What a fix of one cause saves, as its estimate can stand behind it: the number (with why it
    is 0, when it is), or, where ``causes()["saving_trusted"]`` is False, why there is none."""
    note = str(row.get("saving_note", "") or "")
    if not bool(row.get("saving_trusted", True)):
        return f"no estimate of what a fix saves: {note}" if note else "no estimate of what a fix saves"
    return f"a fix saves about {format_us(row['saving_us'])}" + (f" ({note})" if note else "")
