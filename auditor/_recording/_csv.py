"""The event log as one CSV file and back, exactly; a damaged file is a ``ValueError``.

The file (format version 2, docs, "The event log") is a plain CSV. Its first column, ``record``,
says what each row holds; its last, ``crc32``, is a CRC-32 of the row's other cells chained from
the previous row's, so a changed, moved, repeated or missing row is found and named:

    version   the format version, in ``value``
    complete  ``True`` or ``False``, in ``value``
    error     the error text of an incomplete audit, in ``value``
    category  one category of the column named in ``value``, in that column's cell; listed in
              order, so categories no row uses survive
    tensor    one tensor with its event's cells
    event     an event without tensors (its tensor cells are empty)
    hidden    one copy made inside an op (``Audit.hidden``), in the ``hidden.*`` cells
    end       the number of ``tensor`` and ``event`` rows, in ``value``: without it, the file
              was cut

Every column of ``log.EVENT_COLUMNS``, ``log.TENSOR_COLUMNS`` and ``profile.HIDDEN_COLUMNS`` is
written and checked by the rule of its dtype, read from those dicts at each call, so a column
added there needs nothing here. Text that a spreadsheet would run as a formula is prefixed with ``'``.
A path is written through :func:`~._files.atomic_write`, as every file the package writes.
"""

from __future__ import annotations

import csv
import io
import math
import os
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pandas as pd

from . import _log as log
from ._files import atomic_write
from ._profile import HIDDEN_COLUMNS

FORMAT_VERSION = "2"
RECORD, VALUE, CRC = "record", "value", "crc32"

#: Where each kind of row may come: version, complete, error, categories, data, end.
_RANK = {"version": 0, "complete": 1, "error": 2, "category": 3, "event": 4, "tensor": 4, "hidden": 5, "end": 6}
_ONCE = ("version", "complete", "error", "end")
_DATA = ("event", "tensor")

#: Lowest value of a column where its dtype's lowest is not the right bound (-1 is "none" for
#: position and item); every other column may hold any value of its dtype.
_LOWEST: dict[str, float] = {
    "seq": 0, "position": -1, "item": -1, "tid": 0, "ndim": 0, "storage_offset": 0, "bytes": 0,
    "rank": 0, "world_size": 1, "duration_us": 0.0, "time_us": 0.0, "start_us": 0.0, "gap_us": 0.0, "forward_seq": -1,
}

#: A text cell starting with one of these gets a ``'`` in front (OWASP, "CSV injection"); so does
#: one starting with ``'``, so that reading removes exactly one ``'`` and every text comes back.
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
_GUARDED = (*_FORMULA_START, "'")
_BOOLS = {"True": True, "False": False}
_ENCODING, _ERRORS = "utf-8", "surrogatepass"  # an exception text may hold lone surrogates


class CsvAudit(NamedTuple):
    """What :func:`read_csv` returns: the three tables and how the recording ended."""

    events: pd.DataFrame
    tensors: pd.DataFrame
    complete: bool
    error: str
    hidden: pd.DataFrame


class _Column(NamedTuple):
    name: str  # in the file
    table: str  # "events", "tensors" or "hidden"
    key: str  # in that table
    dtype: str


def _columns() -> list[_Column]:
    """The schema's columns, events' then tensors'; the tensors' ``seq`` is the file's ``seq``
    column (their event's). Read from ``log`` at each call, so added columns are picked up."""
    cols = [_Column(c, "events", c, d) for c, d in log.EVENT_COLUMNS.items()]
    for c, d in log.TENSOR_COLUMNS.items():
        name = f"tensor.{c}" if c in log.EVENT_COLUMNS and c != "seq" else c
        cols.append(_Column(name, "tensors", c, d))
    cols.extend(_Column(f"hidden.{c}", "hidden", c, d) for c, d in HIDDEN_COLUMNS.items())
    clash = {RECORD, VALUE, CRC} & {c.name for c in cols}
    if clash:
        raise RuntimeError(f"schema columns {sorted(clash)} clash with the CSV file's own columns")
    return cols


def _rule(col: _Column) -> str:
    """The rule that writes and reads a column: "category", "bool", "int" or "float"."""
    if col.dtype == "category":
        return "category"
    try:
        rule = {"b": "bool", "i": "int", "u": "int", "f": "float"}.get(np.dtype(col.dtype).kind)
    except TypeError:  # not a numpy dtype ("string", ...)
        rule = None
    if rule is None:
        raise TypeError(f"column {col.key!r}: the CSV file has no rule for dtype {col.dtype!r}")
    return rule


def _escape(text: str) -> str:
    return "'" + text if text.startswith(_GUARDED) else text


def _unescape(text: str) -> str:
    """Inverse of :func:`_escape`; ValueError for a cell it never writes, so that each text has
    one cell (``'x`` is not another way to write ``x``)."""
    if not text.startswith(_GUARDED):
        return text
    if text.startswith("'") and text[1:].startswith(_GUARDED):
        return text[1:]
    if text.startswith("'"):
        raise ValueError(f"{text!r} has a ' that auditor does not write")
    raise ValueError(f"{text!r} starts like a formula without the ' auditor puts in front")


def _joined(cells) -> bytes:
    return "\x1f".join(cells).encode(_ENCODING, _ERRORS)


# -- writing -----------------------------------------------------------------------------------
def to_csv(events: pd.DataFrame, tensors: pd.DataFrame, complete: bool, path_or_buf=None, error: str = "",
           hidden: pd.DataFrame | None = None):
    """Write the log as one CSV file (format above); with no ``path_or_buf``, return the text.
    A path is written atomically (:func:`atomic_write`)."""
    if hidden is None:
        hidden = log.hidden_frame()
    text = _render(events, tensors, complete, error, hidden)
    if path_or_buf is None:
        return text
    if isinstance(path_or_buf, (str, os.PathLike)):
        atomic_write(path_or_buf, lambda tmp: tmp.write_text(text, _ENCODING, _ERRORS, newline=""))
    else:
        try:
            path_or_buf.write(text)
        except TypeError:  # a binary buffer
            path_or_buf.write(text.encode(_ENCODING, _ERRORS))
    return None


def _render(events: pd.DataFrame, tensors: pd.DataFrame, complete: bool, error: str, hidden: pd.DataFrame) -> str:
    """The file's text: every row built as cells first, so that the checksums cover exactly
    the cells that the reader will see."""
    cols = _columns()
    names = list(dict.fromkeys(c.name for c in cols))
    blank = [""] * len(names)
    kinds, event_of_row, tensor_of_row = _data_layout(events, tensors)
    n_hidden = len(hidden)
    if n_hidden and ((hidden["seq"].to_numpy() < 0).any() or (hidden["seq"].to_numpy() >= len(events)).any()
                     or (np.diff(hidden["seq"].to_numpy()) < 0).any()):
        raise ValueError("hidden['seq'] must name events, in order of seq")
    none = np.full(n_hidden, -1)
    hidden_index = np.concatenate([np.full(len(kinds), -1), np.arange(n_hidden)])
    cells, categories = {}, {}
    for col in cols:
        if col.name in cells:  # the tensors' seq: the file's seq column is the events'
            continue
        frame, index = {"events": (events, np.concatenate([event_of_row, none])),
                        "tensors": (tensors, np.concatenate([tensor_of_row, none])),
                        "hidden": (hidden, hidden_index)}[col.table]
        text, cats = _cells(col, frame[col.key])
        cells[col.name] = text[index]
        if cats is not None:
            categories[col.name] = cats
    columns = [cells[name] for name in names]
    kinds = kinds + ["hidden"] * n_hidden

    rows = [["version", *blank, FORMAT_VERSION], ["complete", *blank, str(bool(complete))],
            ["error", *blank, _escape(error)]]
    for name, cats in categories.items():
        at = names.index(name) + 1
        for cat in cats:
            row = ["category", *blank, name]
            row[at] = _escape(cat)
            rows.append(row)
    rows.extend(zip(kinds, *columns, [""] * len(kinds)))
    rows.append(["end", *blank, str(len(kinds) - n_hidden)])

    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n")  # CR and LF in a cell are then quoted
    header = [RECORD, *names, VALUE, CRC]
    writer.writerow(header)
    crc = zlib.crc32(_joined(header))
    for row in rows:
        crc = zlib.crc32(_joined(row), crc)
        writer.writerow([*row, f"{crc:08x}"])
    return out.getvalue()


def _cells(col: _Column, series: pd.Series) -> tuple[np.ndarray, list | None]:
    """A column's values as text cells, with an empty cell appended (the tensor cells of an
    event row), and a categorical's categories."""
    values = series.to_numpy()
    rule = _rule(col)
    if rule == "category":
        cat = pd.Categorical(series)
        if (cat.codes < 0).any():
            raise ValueError(f"column {col.key!r} has missing values, which the CSV file cannot hold")
        cats = [str(c) for c in cat.categories]
        text = np.array(list(map(_escape, cats)), dtype=object)[cat.codes].tolist()
        return np.array([*text, ""], dtype=object), cats
    if rule == "float":
        text = [repr(v) if v == v else "" for v in values.astype(np.float64).tolist()]
    elif rule == "bool":
        text = np.where(values.astype(bool), "True", "False").tolist()
    else:
        typed = values.astype(col.dtype)  # what the reader will check the cells against
        if not np.array_equal(typed, values):
            raise ValueError(f"column {col.key!r} holds values that do not fit {col.dtype}")
        text = typed.astype(str).tolist()
    return np.array([*text, ""], dtype=object), None


def _data_layout(events: pd.DataFrame, tensors: pd.DataFrame):
    """Per data row: its kind, its event and its tensor (-1: none, the appended empty cell).
    Tensors are written in their order, which must already be grouped by seq."""
    n = len(events)
    seq = tensors["seq"].to_numpy()
    if not np.array_equal(events["seq"].to_numpy(), np.arange(n)):
        raise ValueError("events['seq'] must be 0 .. n-1 in order")
    if len(seq) and (seq.min() < 0 or seq.max() >= n or (np.diff(seq) < 0).any()):
        raise ValueError("tensors['seq'] must name events, grouped in order of seq")
    counts = np.bincount(seq.astype(np.int64), minlength=n) if n else np.zeros(0, np.int64)
    per_event = np.maximum(counts, 1)
    event_of_row = np.repeat(np.arange(n), per_event)
    has_tensor = np.repeat(counts > 0, per_event)
    tensor_of_row = np.full(len(event_of_row), -1)
    tensor_of_row[has_tensor] = np.arange(len(seq))
    return np.where(has_tensor, "tensor", "event").tolist(), event_of_row, tensor_of_row


# -- reading -----------------------------------------------------------------------------------
def read_csv(path_or_buf) -> CsvAudit:
    """Inverse of :func:`to_csv`. A file that is not exactly what :func:`to_csv` wrote (cut,
    edited, reordered, another format) raises ``ValueError`` naming the line and column."""
    lines, rows = _parse(_read_text(path_or_buf))
    cols = _check_header(rows[0], rows[1:], lines)
    body = _Body(cols, rows[0], np.array(lines[1:]), rows[1:])
    categories = body.categories()
    values = {c: body.column(c, categories.get(c.name)) for c in cols}
    first = body.check_order(values)
    _check_crc(lines, rows)
    events = pd.DataFrame({c.key: values[c][first] for c in cols if c.table == "events"})
    tensors = pd.DataFrame({c.key: values[c] for c in cols if c.table == "tensors"})
    hidden = pd.DataFrame({c.key: values[c] for c in cols if c.table == "hidden"})
    return CsvAudit(events, tensors, body.meta("complete") == "True", _unescape(body.meta("error")), hidden)


def _read_text(source) -> str:
    """The file's text: ``source`` is CSV text itself, a path, or a text or binary buffer."""
    if isinstance(source, str) and ("\n" in source or source.startswith(RECORD + ",")):
        return source
    data = Path(source).read_bytes() if isinstance(source, (str, os.PathLike)) else source.read()
    if isinstance(data, bytes):
        try:
            data = data.decode(_ENCODING, _ERRORS)
        except UnicodeDecodeError as exc:
            line = data[: exc.start].count(b"\n") + 1
            raise ValueError(f"line {line}: not UTF-8 text (byte {data[exc.start]:#04x})") from None
    return data.removeprefix("\ufeff")  # a BOM, as spreadsheets write one


def _parse(text: str) -> tuple[list[int], list[list[str]]]:
    """CSV rows and the line each starts on (a quoted cell may hold line breaks); every row
    as wide as the header."""
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    lines, rows, start = [], [], 1
    try:
        for row in reader:
            lines.append(start)
            rows.append(row)
            start = reader.line_num + 1
    except csv.Error as exc:
        raise ValueError(f"line {start}: not valid CSV ({exc}): the file is cut or damaged") from None
    if not rows:
        raise ValueError("line 1: the file is empty, not an auditor CSV")
    for line, row in zip(lines, rows):
        if len(row) != len(rows[0]):
            raise ValueError(f"line {line} has {len(row)} cells, the header {len(rows[0])}: "
                             "the row is cut or damaged")
    return lines, rows


def _check_header(header: list[str], body: list[list[str]], lines: list[int]) -> list[_Column]:
    """The format version first (a later format may have other columns), then the columns."""
    cols = _columns()
    if header[:1] != [RECORD]:
        if {"seq", "audit_complete"} <= set(header):
            raise ValueError("line 1: no CSV format version (no 'record' column): the file was "
                             "written by an auditor release before CSV format 2, which cannot "
                             "show that a file was cut; record the audit again")
        first = header[0] if header else ""
        raise ValueError(f"line 1: not an auditor CSV: its first column is {first!r}, not {RECORD!r}")
    if not body or body[0][0] != "version" or VALUE not in header:
        raise ValueError(f"line {lines[1] if body else 1}: no format version row after the header: "
                         "not an auditor CSV, or cut")
    version = body[0][header.index(VALUE)]
    if version != FORMAT_VERSION:
        raise ValueError(f"line {lines[1]}: CSV format version {version!r} is not one this auditor "
                         f"reads (version {FORMAT_VERSION})")
    expected = [RECORD, *dict.fromkeys(c.name for c in cols), VALUE, CRC]
    for name in expected:
        if name not in header:
            raise ValueError(f"line 1: column {name!r} is missing")
    for name in header:
        if name not in expected or header.count(name) > 1:
            raise ValueError(f"line 1: column {name!r} is unexpected or repeated")
    if header != expected:
        raise ValueError(f"line 1: the columns are not in the order auditor writes them: {expected}")
    return cols


class _Body:
    """The rows after the header as a grid of cells, with each row's line and kind."""

    def __init__(self, cols: list[_Column], header: list[str], lines: np.ndarray, rows: list[list[str]]):
        self.cols = cols
        self.where = {name: i for i, name in enumerate(header)}
        self.lines = lines
        self.grid = np.array(rows, dtype=object).reshape(len(rows), len(header))
        self.kind = self.grid[:, 0]
        self._check_kinds()
        self.data = np.flatnonzero(np.isin(self.kind, _DATA))
        self.tensor = np.flatnonzero(self.kind == "tensor")
        self.hidden = np.flatnonzero(self.kind == "hidden")
        self._check_stray_cells()
        self._check_meta()

    def _check_kinds(self) -> None:
        """Rows come in the order of ``_RANK``: version, complete, error once each, then any
        category, event and tensor rows, then ``end``."""
        last = -1
        for line, kind in zip(self.lines.tolist(), self.kind.tolist()):
            rank = _RANK.get(kind)
            if rank is None:
                raise ValueError(f"line {line}, column {RECORD!r}: unknown record {kind!r}")
            if last < _RANK["error"]:
                in_place = rank == last + 1
            else:
                in_place = rank > last or (rank == last and kind not in _ONCE)
            if not in_place:
                raise ValueError(f"line {line}: a {kind!r} row out of place (rows are: version, complete, "
                                 "error, category rows, event and tensor rows, end)")
            last = rank
        if last != _RANK["end"]:
            raise ValueError(f"line {self.lines[-1]}: the file ends without its 'end' row: it was cut")

    def _check_stray_cells(self) -> None:
        """Each kind of row fills only its own cells: a value elsewhere is damage."""
        allowed = np.zeros(self.grid.shape, dtype=bool)
        allowed[:, [0, -1]] = True
        allowed[~np.isin(self.kind, _DATA), self.where[VALUE]] = True
        events = [self.where[c.name] for c in self.cols if c.table == "events"]
        allowed[np.ix_(self.data, events)] = True
        allowed[np.ix_(self.hidden, [self.where[c.name] for c in self.cols if c.table == "hidden"])] = True
        allowed[np.ix_(self.tensor, [self.where[c.name] for c in self.cols if c.table != "hidden"])] = True
        for row in np.flatnonzero(self.kind == "category"):
            named = self.where.get(self.grid[row, self.where[VALUE]])
            if named is None or named in (0, self.where[VALUE], self.where[CRC]):
                raise self._fail(row, VALUE, f"{self.grid[row, self.where[VALUE]]!r} is not a column")
            allowed[row, named] = True
        stray = (self.grid != "") & ~allowed
        if stray.any():
            row, at = np.argwhere(stray)[0]
            raise self._fail(row, list(self.where)[at],
                             f"a {self.kind[row]!r} row leaves this cell empty, not {self.grid[row, at]!r}")

    def _check_meta(self) -> None:
        """``complete`` is True or False, ``error`` is text as :func:`_escape` writes it, ``end``
        counts the data rows."""
        if self.meta("complete") not in _BOOLS:
            raise self._fail(1, VALUE, f"{self.meta('complete')!r} is not True or False")
        try:
            _unescape(self.meta("error"))
        except ValueError as exc:
            raise self._fail(2, VALUE, str(exc)) from None
        if self.meta("end") != str(len(self.data)):
            raise self._fail(len(self.kind) - 1, VALUE, f"the 'end' row counts {self.meta('end')!r} "
                             f"rows, the file holds {len(self.data)}")

    def meta(self, kind: str) -> str:
        """The ``value`` of the one row of this kind (version, complete, error, end)."""
        return self.grid[self.kind == kind, self.where[VALUE]][0]

    def _fail(self, row: int, name: str, message: str) -> ValueError:
        return ValueError(f"line {self.lines[row]}, column {name!r}: {message}")

    def categories(self) -> dict[str, list[str]]:
        """Category rows -> {column: its categories as written (escaped), in order}; each
        must be valid text, listed once, and in the column's fixed vocabulary if it has one."""
        cols = {c.name: c for c in self.cols if _rule(c) == "category"}
        out: dict[str, list[str]] = {name: [] for name in cols}
        seen: dict[str, set[str]] = {name: set() for name in cols}
        for row in np.flatnonzero(self.kind == "category"):
            name = self.grid[row, self.where[VALUE]]
            if name not in cols:
                raise self._fail(row, VALUE, f"{name!r} is not a categorical column")
            cell = self.grid[row, self.where[name]]
            try:
                text = _unescape(cell)
            except ValueError as exc:
                raise self._fail(row, name, str(exc)) from None
            vocabulary = log.FIXED_CATEGORIES.get(cols[name].key)
            if vocabulary is not None and text not in vocabulary:
                raise self._fail(row, name, f"category {text!r} is not in the column's vocabulary")
            if cell in seen[name]:
                raise self._fail(row, name, f"category {text!r} is listed twice")
            seen[name].add(cell)
            out[name].append(cell)
        return out

    def column(self, col: _Column, categories: list[str] | None):
        """One schema column over its rows (every data row for events, tensor rows for
        tensors), checked and typed by its dtype's rule."""
        rows = {"events": self.data, "tensors": self.tensor, "hidden": self.hidden}[col.table]
        cells = self.grid[rows, self.where[col.name]]
        rule = _rule(col)
        if rule == "category":
            codes = pd.Index(categories, dtype=object).get_indexer(cells) if len(cells) else np.zeros(0, int)
            if (codes < 0).any():
                bad = int(np.argmax(codes < 0))
                raise self._fail(rows[bad], col.name, f"unknown value {cells[bad]!r} "
                                 f"(not one of the column's {len(categories)} categories)")
            return pd.Categorical.from_codes(codes, categories=[_unescape(c) for c in categories])
        parse = {"int": _int_parser, "float": _float_parser, "bool": _bool_parser}[rule](col)
        codes, uniques = pd.factorize(cells)
        parsed = []
        for k, cell in enumerate(uniques):
            try:
                parsed.append(parse(cell))
            except ValueError as exc:
                raise self._fail(rows[int(np.argmax(codes == k))], col.name, str(exc)) from None
        return np.array(parsed, dtype=col.dtype)[codes]

    def check_order(self, values: dict) -> np.ndarray:
        """Rows in the order the log has them; returns the data row that starts each event."""
        seq = next(values[c] for c in self.cols if c.table == "events" and c.key == "seq")
        first, owner = self._check_seq(seq.astype(np.int64))
        self._check_event_cells(first[owner], seq)
        self._check_duplicate_tensors({c.key: values[c] for c in self.cols if c.table == "tensors"})
        hidden_seq = next(values[c] for c in self.cols if c.table == "hidden" and c.key == "seq").astype(np.int64)
        bad = (hidden_seq >= len(first)) | (np.diff(hidden_seq, prepend=0) < 0)
        if bad.any():
            at = int(np.argmax(bad))
            raise self._fail(self.hidden[at], "hidden.seq", f"seq {hidden_seq[at]} names no event in order")
        return first

    def _check_seq(self, seq: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``seq`` runs 0, 1, 2, ... without gaps, each event's rows together, an ``event`` row
        alone; returns each event's first data row and each data row's event."""
        step = np.diff(seq, prepend=-1)
        jump = (step != 0) & (step != 1)
        if jump.any():
            at = int(np.argmax(jump))
            before = f"seq {seq[at - 1]}" if at else "the start"
            raise self._fail(self.data[at], "seq", f"seq {seq[at]} follows {before}: rows must list "
                             "seq 0, 1, 2, ... in order, without gaps")
        shared = np.bincount(seq)[seq] > 1 if len(seq) else np.zeros(0, bool)
        lonely = (self.kind[self.data] == "event") & shared
        if lonely.any():
            at = int(np.argmax(lonely))
            raise self._fail(self.data[at], "seq", f"an 'event' row (an op without tensors) shares seq {seq[at]}")
        return np.flatnonzero(step == 1), np.cumsum(step == 1) - 1

    def _check_event_cells(self, event_first: np.ndarray, seq: np.ndarray) -> None:
        """Every row of an event repeats its event cells exactly (``event_first``: the first
        data row of each data row's event)."""
        for c in self.cols:
            if c.table != "events":
                continue
            cells = self.grid[self.data, self.where[c.name]]
            differs = cells != cells[event_first]
            if differs.any():
                at = int(np.argmax(differs))
                line = self.lines[self.data[event_first[at]]]
                raise self._fail(self.data[at], c.name, f"differs from line {line}, the first row of seq {seq[at]}")

    def _check_duplicate_tensors(self, tensors: dict) -> None:
        """No (seq, role, position, item) twice, but for position -1 (unknown keywords, which
        may be several)."""
        keys = pd.DataFrame({k: np.asarray(getattr(tensors[k], "codes", tensors[k]))
                             for k in ("seq", "role", "position", "item")})
        twice = keys.duplicated() & (keys["position"] != -1)
        if twice.any():
            at = int(np.argmax(twice))
            same = int(np.argmax((keys == keys.iloc[at]).all(axis=1)))
            raise ValueError(f"line {self.lines[self.tensor[at]]}: repeats the tensor of line "
                             f"{self.lines[self.tensor[same]]} (seq, role, position, item)")


def _int_parser(col: _Column) -> Callable[[str], int]:
    info = np.iinfo(col.dtype)
    low, high = max(int(info.min), _LOWEST.get(col.key, info.min)), int(info.max)

    def parse(cell: str) -> int:
        if cell == "":
            raise ValueError(f"an empty cell, in a {col.dtype} column")
        try:
            value = int(cell)
        except ValueError:
            value = None
        if value is None or str(value) != cell:  # no '1.7', ' 5', '+5', '05', '5_0'
            raise ValueError(f"{cell!r} is not an integer")
        if not low <= value <= high:
            raise ValueError(f"{value} is out of the column's range {low}..{high} ({col.dtype})")
        return value

    return parse


def _float_parser(col: _Column) -> Callable[[str], float]:
    low = _LOWEST.get(col.key, -math.inf)
    high = float(np.finfo(col.dtype).max)

    def parse(cell: str) -> float:
        if cell == "":
            return math.nan
        try:
            value = float(cell)
        except ValueError:
            value = math.nan
        if value != value or repr(value) != cell:  # what repr() writes, and NaN only as ""
            raise ValueError(f"{cell!r} is not a number")
        if value < low:
            raise ValueError(f"{cell} is below the column's lowest value {low}")
        if abs(value) > high:
            raise ValueError(f"{cell} is out of the column's range ({col.dtype})")
        return value

    return parse


def _bool_parser(col: _Column) -> Callable[[str], bool]:
    def parse(cell: str) -> bool:
        if cell not in _BOOLS:
            raise ValueError(f"{cell!r} is not True or False")
        return _BOOLS[cell]

    return parse


def _check_crc(lines: list[int], rows: list[list[str]]) -> None:
    """Each row's ``crc32`` continues the previous row's over its other cells: a row changed,
    moved, repeated or removed after writing breaks the chain at that line."""
    crc = zlib.crc32(_joined(rows[0]))
    for line, row in zip(lines[1:], rows[1:]):
        stored = row[-1]
        if len(stored) != 8 or stored.strip("0123456789abcdef"):
            raise ValueError(f"line {line}, column {CRC!r}: {stored!r} is not a checksum")
        if f"{zlib.crc32(_joined(row[:-1]), crc):08x}" != stored:
            raise ValueError(f"line {line}: the row does not match its checksum (column {CRC!r}): "
                             "it, or a row before it, was changed, moved or removed after writing")
        crc = int(stored, 16)
