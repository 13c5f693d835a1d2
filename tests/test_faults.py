"""The fault items of the issue "Trustworthy however it is run": each test damages something on
purpose and checks that auditor says what is wrong, naming where, instead of answering wrongly.

One section per item; the checks of a section can fail only through the code of that item.
The recorder's items (threads, entering and leaving, tensors without strides, checkpointing,
deep models, keyword arguments, torch.compile, memory) use the models in ``fault_models.py``.
"""

from __future__ import annotations

import collections
import csv
import functools
import gc
import importlib
import io
import os
import re
import sys
import time
import traceback
import tracemalloc
import types
import warnings
import weakref
import zlib

import numpy as np
import pandas as pd
import pytest
import torch
from fault_models import (
    CLI_FACTORIES,
    Block,
    Chain,
    Checkpointed,
    CountingMode,
    ForeignThreads,
    Masked,
    global_state,
    nested_checkpoints,
    wrapped,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pandas.testing import assert_frame_equal
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack

import auditor
from auditor._recording import _log as log
from auditor._recording._mode import RecorderMode
from auditor._recording._profile import ProfileSession
from tests.kernels import fake_cuda_problem

# -- the CSV file (item 7) ----------------------------------------------------------------------
#
# A file is read back exactly, or refused with a ValueError naming the line and the column.
# ``_forge`` rewrites a damaged file with its ``end`` count and checksums made right again, so
# that a test reaches the check it is about instead of the checksum (README, "The event log").

#: An error text with every character that CSV, the formula guard or a line count could trip on.
ERROR = "RuntimeError: =1+2, \"quoted\", 'single'\nsecond line\r\nthird: ünï©ødé ✓, -3"
FORMULAS = ["=HYPERLINK(\"http://x\")", "+1", "-2", "@SUM(A1)", "\tTAB", "\rCR", "'quoted", "''twice"]


def _model_and_input():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.Softmax(dim=1), nn.Conv2d(4, 4, 3, padding=1))
    x = torch.randn(2, 3, 8, 8)
    return model.to(memory_format=torch.channels_last), x.to(memory_format=torch.channels_last)


@functools.cache
def _complete() -> auditor.Audit:
    model, x = _model_and_input()
    return auditor.audit(model, x, record_source=True, record_time=True)


@functools.cache
def _incomplete() -> auditor.Audit:
    """Ops, one without tensors (an ``event`` row), durations, and an error text that has it all."""
    model, x = _model_and_input()
    fa = auditor.FormatAuditor(record_time=True)
    try:
        with fa:
            model(x).sum().backward()
            torch.ops.profiler._record_function_enter_new("x", None)
            raise RuntimeError(ERROR.removeprefix("RuntimeError: "))
    except RuntimeError:
        pass
    assert not fa.audit.complete and fa.audit.error == ERROR
    assert (~fa.audit.events["seq"].isin(fa.audit.tensors["seq"])).any()
    return fa.audit


@functools.cache
def _zero_ops() -> auditor.Audit:
    fa = auditor.FormatAuditor()
    try:
        with fa:
            raise KeyError("'before any op")
    except KeyError:
        pass
    assert not fa.audit.complete and len(fa.audit.events) == 0
    return fa.audit


@functools.cache
def _odd_categories() -> auditor.Audit:
    """Unused categories, out of sorted order, and texts a spreadsheet would run as formulas."""
    a = _complete()
    events, tensors = a.events.copy(), a.tensors.copy()
    modules = events["module"].cat.categories
    events["module"] = events["module"].cat.rename_categories(dict(zip(modules, FORMULAS)))
    events["source"] = events["source"].cat.add_categories([*FORMULAS[len(modules):], "=unused()", "-", "'"])
    tensors["shape"] = tensors["shape"].cat.add_categories(["(9, 9)", "(1,)"])
    tensors["arg"] = tensors["arg"].cat.reorder_categories(tensors["arg"].cat.categories[::-1])
    return auditor.Audit(events, tensors, complete=True, error="@not a formula")


AUDITS = {"complete": _complete, "incomplete": _incomplete, "zero ops": _zero_ops,
          "odd categories": _odd_categories}


def _assert_same(a: auditor.Audit, b: auditor.Audit) -> None:
    assert_frame_equal(b.events, a.events)  # categories and their order too
    assert_frame_equal(b.tensors, a.tensors)  # categories and their order too
    assert (b.complete, b.error) == (a.complete, a.error)


def _read(text: str) -> auditor.Audit:
    return auditor.Audit.read_csv(io.StringIO(text, newline=""))


def _refused(text: str, *patterns: str) -> str:
    with pytest.raises(ValueError) as info:
        _read(text)
    message = str(info.value)
    for pattern in patterns:
        assert re.search(pattern, message), message
    return message


def _rows(text: str) -> tuple[list[list[str]], list[int]]:
    """The rows and the line each starts on."""
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    rows, lines, start = [], [], 1
    for row in reader:
        rows.append(row)
        lines.append(start)
        start = reader.line_num + 1
    return rows, lines


def _write(rows: list[list[str]]) -> str:
    out = io.StringIO()
    csv.writer(out, lineterminator="\r\n").writerows(rows)
    return out.getvalue()


def _forge(rows: list[list[str]]) -> str:
    """``rows`` as auditor writes them: the ``end`` count and each ``crc32`` (README) recomputed."""
    header, body = rows[0], [list(r[:-1]) for r in rows[1:]]
    value = header.index("value")
    for row in body:
        if row[0] == "end":
            row[value] = str(sum(r[0] in ("tensor", "event") for r in body))
    crc = zlib.crc32("\x1f".join(header).encode())
    out = [header]
    for row in body:
        crc = zlib.crc32("\x1f".join(row).encode(), crc)
        out.append([*row, f"{crc:08x}"])
    return _write(out)


def _set(audit: auditor.Audit, kind: str, column: str, value: str, nth: int = 0, forge: bool = True):
    """The audit's text with one cell of the ``nth`` row of ``kind`` set; and that row's line."""
    rows, lines = _rows(audit.to_csv())
    at = [i for i, r in enumerate(rows) if r[0] == kind][nth]
    rows[at][rows[0].index(column)] = value
    return (_forge if forge else _write)(rows), lines[at]


def _data_rows(rows: list[list[str]]) -> list[int]:
    return [i for i, r in enumerate(rows) if r[0] in ("tensor", "event")]


@pytest.mark.parametrize("via", ["path", "text", "text buffer", "binary buffer"])
@pytest.mark.parametrize("name", list(AUDITS))
def test_csv_round_trip_is_exact(name, via, tmp_path):
    a = AUDITS[name]()
    if via == "path":
        a.to_csv(tmp_path / "a.csv")
        assert not list(tmp_path.glob("*.partial"))
        source = tmp_path / "a.csv"
    elif via == "text":
        source = a.to_csv()
    elif via == "text buffer":
        source = io.StringIO(newline="")
        a.to_csv(source)
        source.seek(0)
    else:
        source = io.BytesIO()
        a.to_csv(source)
        source.seek(0)
    b = auditor.Audit.read_csv(source)
    _assert_same(a, b)
    assert b.to_csv() == a.to_csv()


def test_csv_keeps_unused_categories_in_order_and_the_error_text():
    a, z = _odd_categories(), _zero_ops()
    b = _read(a.to_csv())
    assert list(b.tensors["shape"].cat.categories[-2:]) == ["(9, 9)", "(1,)"]
    assert "(9, 9)" not in set(b.tensors["shape"])
    assert list(b.events["source"].cat.categories) == list(a.events["source"].cat.categories)
    assert list(b.tensors["arg"].cat.categories) == list(a.tensors["arg"].cat.categories)
    c = _read(z.to_csv())
    assert (c.complete, c.error, len(c.events), len(c.tensors)) == (False, "KeyError: \"'before any op\"", 0, 0)
    assert _read(_incomplete().to_csv()).error == ERROR


def test_csv_neutralises_formulas_and_stays_a_plain_csv():
    a = _odd_categories()
    text = a.to_csv()
    rows, _ = _rows(text)
    for row in rows:
        for cell in row:
            assert not cell.startswith(("=", "+", "@", "\t", "\r")), cell
            if cell.startswith("-"):
                assert re.fullmatch(r"-\d+(\.\d+)?(e[-+]\d+)?", cell), cell
    cells = {cell for row in rows for cell in row}
    assert {"'" + f if f.startswith(("=", "+", "-", "@", "\t", "\r", "'")) else f for f in FORMULAS} <= cells
    assert "'@not a formula" in cells
    # pandas (and so a spreadsheet) opens it as one table
    df = pd.read_csv(io.StringIO(text), keep_default_na=False, dtype=str)
    data = df[df["record"].isin(["tensor", "event"])]
    assert len(data) == len(a.tensors) + (~a.events["seq"].isin(a.tensors["seq"])).sum()
    assert list(df.columns[:2]) == ["record", "seq"] and df.columns[-1] == "crc32"
    # the checksums are what the README says they are
    assert _forge(rows) == text


def test_csv_cut_at_any_row_boundary_is_refused():
    for text in (_complete().to_csv(), _incomplete().to_csv(), _zero_ops().to_csv()):
        rows, _ = _rows(text)
        for keep in range(1, len(rows)):
            head = _write(rows[:keep])
            assert text.startswith(head)
            message = _refused(head, r"^line \d+", r"cut")
        assert "without its 'end' row" in message


def test_csv_cut_inside_a_row_is_refused():
    text = _incomplete().to_csv()
    starts = [m.end() for m in re.finditer("\r\n", text)][:-1]
    for start, end in zip(starts, starts[1:]):
        for cut in (start + 1, (start + end) // 2, end - 3):
            _refused(text[:cut], r"^line \d+")


@pytest.mark.parametrize(
    "column, value, message",
    [
        ("position", "300", r"300 is out of the column's range -1\.\.127 \(int8\)"),
        ("item", "-2", r"-2 is out of the column's range -1\.\."),
        ("ndim", "128", r"128 is out of the column's range 0\.\.127 \(int8\)"),
        ("bytes", "9223372036854775808", r"9223372036854775808 is out of the column's range 0\.\.9223372036854775807"),
        ("tid", "-1", r"-1 is out of the column's range 0\.\."),
        ("seq", "-1", r"-1 is out of the column's range 0\.\."),
        ("world_size", "0", r"0 is out of the column's range 1\.\."),
        ("tid", "", r"an empty cell, in a int32 column"),
        ("position", "1.7", r"'1\.7' is not an integer"),
        ("position", "1.0", r"'1\.0' is not an integer"),
        ("position", "+1", r"'\+1' is not an integer"),
        ("position", " 1", r"' 1' is not an integer"),
        ("storage_offset", "1e3", r"'1e3' is not an integer"),
        ("is_param", "", r"'' is not True or False"),
        ("is_view", "true", r"'true' is not True or False"),
        ("duration_us", "nan", r"'nan' is not a number"),
        ("duration_us", "1.50", r"'1\.50' is not a number"),
        ("duration_us", "-1.0", r"-1\.0 is below the column's lowest value 0"),
        ("time_us", "1e+39", r"1e\+39 is out of the column's range \(float32\)"),
        ("gap_us", "-1.0", r"-1\.0 is below the column's lowest value 0"),
        ("phase", "sideways", r"unknown value 'sideways'"),
        ("role", "", r"unknown value ''"),
        ("shape", "(7, 7)", r"unknown value '\(7, 7\)'"),
        ("format", "=1+2", r"unknown value '=1\+2'"),
    ],
)
def test_csv_refuses_a_value_outside_its_column(column, value, message):
    text, line = _set(_complete(), "tensor", column, value)
    _refused(text, rf"^line {line}, column '{column}': {message}")


def test_csv_refuses_categories_outside_a_fixed_vocabulary_or_listed_twice():
    rows, lines = _rows(_complete().to_csv())
    phase = [i for i, r in enumerate(rows) if r[0] == "category" and r[-2] == "phase"]
    at = rows[0].index("phase")
    rows[phase[1]][at] = "sideways"
    _refused(_forge(rows), rf"^line {lines[phase[1]]}, column 'phase': category 'sideways' is not in")
    rows[phase[1]][at] = "forward"
    _refused(_forge(rows), rf"^line {lines[phase[1]]}, column 'phase': category 'forward' is listed twice")
    rows[phase[1]][at], rows[phase[1]][-2] = "", "seq"
    _refused(_forge(rows), rf"^line {lines[phase[1]]}, column 'value': 'seq' is not a categorical column")
    rows[phase[1]][-2] = "nothing"
    _refused(_forge(rows), rf"^line {lines[phase[1]]}, column 'value': 'nothing' is not a column")


def test_csv_refuses_unescaped_formulas_and_stray_cells():
    text, line = _set(_complete(), "category", "op", "=cmd()")
    _refused(text, rf"^line {line}, column 'op': '=cmd\(\)' starts like a formula")
    text, line = _set(_complete(), "category", "op", "'aten.sum.default")
    _refused(text, rf"^line {line}, column 'op': \"'aten.sum.default\" has a ' that auditor does not write")
    text, line = _set(_incomplete(), "error", "value", "-1+1")
    _refused(text, rf"^line {line}, column 'value': '-1\+1' starts like a formula")
    text, line = _set(_incomplete(), "complete", "value", "yes")
    _refused(text, rf"^line {line}, column 'value': 'yes' is not True or False")
    text, line = _set(_incomplete(), "event", "tid", "3")
    _refused(text, rf"^line {line}, column 'tid': a 'event' row leaves this cell empty")
    text, line = _set(_complete(), "tensor", "value", "x", nth=4)
    _refused(text, rf"^line {line}, column 'value': a 'tensor' row leaves this cell empty")


def _move(audit, edit) -> tuple[str, list[int]]:
    """The audit's text with its data rows (by index) rearranged by ``edit``, forged."""
    rows, lines = _rows(audit.to_csv())
    data = _data_rows(rows)
    picked = edit(list(range(len(data))))
    return _forge(rows[: data[0]] + [rows[data[i]] for i in picked] + rows[data[-1] + 1:]), [lines[d] for d in data]


def _seq_rows(audit, seq: int) -> list[int]:
    rows, _ = _rows(audit.to_csv())
    data = _data_rows(rows)
    return [k for k, i in enumerate(data) if rows[i][1] == str(seq)]


def test_csv_refuses_reordered_gapped_or_duplicated_rows():
    a = _complete()
    one, two = _seq_rows(a, 1), _seq_rows(a, 2)
    text, lines = _move(a, lambda d: d[: one[0]] + d[two[0]: two[-1] + 1] + d[one[0]: one[-1] + 1] + d[two[-1] + 1:])
    _refused(text, rf"^line {lines[one[0]]}, column 'seq': seq 2 follows seq 0: .* in order, without gaps")
    text, lines = _move(a, lambda d: [i for i in d if i not in one])
    _refused(text, rf"^line {lines[one[0]]}, column 'seq': seq 2 follows seq 0")
    text, lines = _move(a, lambda d: [i for i in d if i not in _seq_rows(a, 0)])
    _refused(text, r"^line \d+, column 'seq': seq 1 follows the start")
    # one event's rows apart
    text, lines = _move(a, lambda d: d[: one[0]] + d[one[0] + 1: one[-1] + 1] + d[two[0]:two[0] + 1] + d[one[0]:one[0] + 1])
    _refused(text, r"^line \d+, column 'seq': seq (1|2) follows seq 2")
    # a tensor twice
    text, lines = _move(a, lambda d: d[: one[1]] + [one[0]] + d[one[1]:])
    _refused(text, rf"^line {lines[one[1]]}: repeats the tensor of line {lines[one[0]]} \(seq, role, position, item\)")
    # an event row twice
    b = _incomplete()
    rows, _ = _rows(b.to_csv())
    lone = next(k for k, i in enumerate(_data_rows(rows)) if rows[i][0] == "event")
    text, lines = _move(b, lambda d: d[: lone + 1] + [lone] + d[lone + 1:])
    _refused(text, rf"^line {lines[lone]}, column 'seq': an 'event' row \(an op without tensors\) shares seq")


def test_csv_refuses_an_event_whose_rows_disagree():
    a = _complete()
    rows, lines = _rows(a.to_csv())
    data = _data_rows(rows)
    second = data[_seq_rows(a, 0)[1]]
    rows[second][rows[0].index("op")] = "aten.sum.default"
    _refused(_forge(rows), rf"^line {lines[second]}, column 'op': differs from line {lines[data[0]]}, the first row of seq 0")


def test_csv_refuses_records_out_of_place_and_a_wrong_count():
    rows, lines = _rows(_complete().to_csv())
    moved = rows[:2] + [rows[3], rows[2]] + rows[4:]
    _refused(_forge(moved), rf"^line {lines[2]}: a 'error' row out of place")
    first_data = _data_rows(rows)[0]
    moved = rows[: first_data - 1] + [rows[first_data], rows[first_data - 1]] + rows[first_data + 1:]
    _refused(_forge(moved), rf"^line {lines[first_data]}: a 'category' row out of place")
    _refused(_forge(rows[:-1] + [rows[-1], rows[-1]]), rf"^line {lines[-1] + 1}: a 'end' row out of place")
    _refused(_forge([*rows[:5], ["tensors", *rows[5][1:]], *rows[6:]]), rf"^line {lines[5]}, column 'record': unknown record 'tensors'")
    rows[-1][-2] = str(int(rows[-1][-2]) + 1)
    _refused(_write(rows), rf"^line {lines[-1]}, column 'value': the 'end' row counts '\d+' rows, the file holds \d+")


def test_csv_checksum_finds_what_the_other_checks_cannot():
    a = _complete()
    rows, lines = _rows(a.to_csv())
    tid = rows[0].index("tid")
    data = _data_rows(rows)
    # a valid value changed
    edited = [list(r) for r in rows]
    edited[data[3]][tid] = str(int(edited[data[3]][tid]) + 1)
    _refused(_write(edited), rf"^line {lines[data[3]]}: the row does not match its checksum")
    # two tensors of one op swapped: every other check passes
    i, j = data[0], data[1]
    swapped = rows[:i] + [rows[j], rows[i]] + rows[j + 1:]
    _refused(_write(swapped), rf"^line {lines[i]}: the row does not match its checksum")
    # a row removed, the count made right
    removed = [list(r) for r in rows[:j] + rows[j + 1:]]
    removed[-1][-2] = str(len(data) - 1)
    _refused(_write(removed), r"^line \d+: the row does not match its checksum")
    # two column names swapped in the header
    header = list(rows[0])
    p, q = header.index("position"), header.index("item")
    header[p], header[q] = header[q], header[p]
    _refused(_write([header, *rows[1:]]), r"^line 1: the columns are not in the order auditor writes them")
    renamed = [list(r) for r in rows]
    renamed[0][p] = "tensor.position"
    _refused(_write(renamed), r"^line 1: column 'position' is missing")
    bad = [list(r) for r in rows]
    bad[4][-1] = "zz"
    _refused(_write(bad), rf"^line {lines[4]}, column 'crc32': 'zz' is not a checksum")


def _legacy_text(a: auditor.Audit) -> str:
    """A file as auditor wrote it before format 2: the long table, no version."""
    long = a.events.merge(a.tensors, on="seq", how="left", sort=True)
    long["audit_complete"] = a.complete
    return long.to_csv(index=False)


def test_csv_refuses_what_is_not_an_auditor_csv(tmp_path):
    with pytest.raises(ValueError, match=r"^line 1: the file is empty"):
        auditor.Audit.read_csv(io.BytesIO(b""))
    (tmp_path / "empty.csv").write_bytes(b"")
    with pytest.raises(ValueError, match=r"^line 1: the file is empty"):
        auditor.Audit.read_csv(tmp_path / "empty.csv")
    _refused("a,b\r\n1,2\r\n", r"^line 1: not an auditor CSV: its first column is 'a'")
    _refused("record,a\r\n1,2\r\n", r"^line 2: no format version row")
    _refused(_legacy_text(_complete()), r"^line 1: no CSV format version \(no 'record' column\)")
    _refused(_legacy_text(_zero_ops()), r"^line 1: no CSV format version")
    rows, lines = _rows(_complete().to_csv())
    at = rows[0].index("strides")
    _refused(_forge([r[:at] + r[at + 1:] for r in rows]), r"^line 1: column 'strides' is missing")
    _refused(_forge([r[:at] + ["x" if i == 0 else ""] + r[at:] for i, r in enumerate(rows)]),
             r"^line 1: column 'x' is unexpected")
    rows[1][-2] = "3"
    _refused(_forge(rows), r"^line 2: CSV format version '3' is not one this auditor reads \(version 2\)")
    data = _complete().to_csv().encode().split(b"\n")
    data[4] = data[4][:3] + b"\xff" + data[4][3:]
    with pytest.raises(ValueError, match=r"^line 5: not UTF-8 text \(byte 0xff\)"):
        auditor.Audit.read_csv(io.BytesIO(b"\n".join(data)))
    _refused(_complete().to_csv().replace("\r\nversion,", "\r\nversion,,", 1), r"^line 2 has \d+ cells, the header \d+")


def test_csv_checks_a_column_added_to_the_schema(monkeypatch):
    """New columns are written and checked by their dtype, with nothing to change in csvfile."""
    monkeypatch.setitem(log.EVENT_COLUMNS, "lane", "int8")
    monkeypatch.setitem(log.EVENT_COLUMNS, "time_us", "float64")
    monkeypatch.setitem(log.TENSOR_COLUMNS, "tag", "category")
    monkeypatch.setitem(log.TENSOR_COLUMNS, "pinned", "bool")
    monkeypatch.setitem(log.TENSOR_COLUMNS, "lane", "int16")  # an event column's name too
    monkeypatch.setitem(log.FIXED_CATEGORIES, "tag", ("a", "b", "-c"))
    a = _complete()
    events, tensors = a.events.copy(), a.tensors.copy()
    events["lane"] = np.arange(len(events), dtype=np.int8) % 3
    events["time_us"] = np.linspace(0, 1, len(events))
    tensors["tag"] = pd.Categorical(np.where(tensors["role"] == "input", "a", "-c"), categories=["a", "b", "-c"])
    tensors["pinned"] = tensors["is_param"]
    tensors["lane"] = np.arange(len(tensors), dtype=np.int16) - 1
    b = auditor.Audit(events, tensors)
    _assert_same(b, _read(b.to_csv()))
    assert {"lane", "tensor.lane", "time_us", "tag", "pinned"} <= set(_rows(b.to_csv())[0][0])
    for column, value, message in [("lane", "200", r"200 is out of the column's range -128\.\.127 \(int8\)"),
                                   ("time_us", "x", r"'x' is not a number"),
                                   ("tag", "c", r"unknown value 'c'"),
                                   ("pinned", "1", r"'1' is not True or False"),
                                   ("tensor.lane", "40000", r"40000 is out of the column's range -32768\.\.32767")]:
        text, line = _set(b, "tensor", column, value)
        _refused(text, rf"^line {line}, column '{column}': {message}")
    rows, lines = _rows(b.to_csv())
    at = next(i for i, r in enumerate(rows) if r[0] == "category" and r[-2] == "tag")
    rows[at][rows[0].index("tag")] = "d"
    _refused(_forge(rows), rf"^line {lines[at]}, column 'tag': category 'd' is not in the column's vocabulary")


def test_csv_write_is_atomic_and_refuses_what_it_could_not_read_back(tmp_path, monkeypatch):
    path = tmp_path / "a.csv"
    _complete().to_csv(path)
    before = path.read_bytes()

    def half_then_fail(self, text, *args, **kwargs):
        with open(self, "w", newline="") as f:
            f.write(text[: len(text) // 2])
        raise OSError("disk full")

    monkeypatch.setattr(type(path), "write_text", half_then_fail)
    with pytest.raises(OSError, match="disk full"):
        _incomplete().to_csv(path)
    monkeypatch.undo()
    assert path.read_bytes() == before and not list(tmp_path.glob("*.partial"))
    a = _complete()
    events = a.events.copy()
    events["op"] = events["op"].cat.remove_categories(["aten.sum.default"])
    with pytest.raises(ValueError, match="column 'op' has missing values"):
        auditor.Audit(events, a.tensors).to_csv(path)
    with pytest.raises(ValueError, match=r"tensors\['seq'\] must name events, grouped in order"):
        auditor.Audit(a.events, a.tensors.iloc[::-1]).to_csv(path)
    assert path.read_bytes() == before


# The fuzz test: damage a valid file any way at all; the read is exact or names what is wrong.
_NAMED = re.compile(r"line \d+|column '")
_CELLS = ["=1+2", "'", "''", "'x", '"', '"a,b"', "+A1", "@x", "-", "\t1", "\r", "\n", "", "x,y", "1.7"]
_INTS = [c for c, d in {**log.EVENT_COLUMNS, **log.TENSOR_COLUMNS}.items() if d.startswith("int")]


@functools.cache
def _fuzz_base() -> tuple[auditor.Audit, bytes]:
    a = _incomplete()
    return a, a.to_csv().encode()


def _damage(data: bytes, how: tuple) -> bytes:
    kind, i, j, extra = how
    if kind == "cut":
        return data[: i % (len(data) + 1)]
    if kind == "replace":
        i %= len(data)
        return data[:i] + bytes([j % 256]) + data[i + 1:]
    if kind == "flip":
        i %= len(data)
        return data[:i] + bytes([data[i] ^ (1 << (j % 8))]) + data[i + 1:]
    text = data.decode()
    if kind in ("swap", "duplicate", "delete"):
        lines = re.split("(?<=\r\n)", text)
        i, j = i % len(lines), j % len(lines)
        if kind == "swap":
            lines[i], lines[j] = lines[j], lines[i]
        elif kind == "duplicate":
            lines.insert(i, lines[i])
        else:
            del lines[i]
        return "".join(lines).encode()
    rows, _ = _rows(text)
    row = rows[1 + i % (len(rows) - 1)]
    if kind == "overflow":
        column = rows[0].index(_INTS[j % len(_INTS)])
        dtype = {**log.EVENT_COLUMNS, **log.TENSOR_COLUMNS}[rows[0][column]]
        info = np.iinfo(dtype)
        row[column] = str([info.max + 1, info.min - 1, 2**64 + extra][extra % 3])
    else:  # inject
        row[j % len(row)] = _CELLS[extra % len(_CELLS)]
    return _write(rows).encode()


@settings(max_examples=200, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.tuples(st.sampled_from(["cut", "replace", "flip", "swap", "duplicate", "delete", "overflow", "inject"]),
                 st.integers(0, 2**20), st.integers(0, 2**20), st.integers(0, 2**10)))
def test_csv_damage_is_read_exactly_or_named(how):
    original, data = _fuzz_base()
    damaged = _damage(data, how)
    try:
        back = auditor.Audit.read_csv(io.BytesIO(damaged))
    except ValueError as exc:
        assert _NAMED.search(str(exc)), str(exc)
        return
    _assert_same(original, back)


# -- threads (item 1) ---------------------------------------------------------------------------
#
# Module hooks are global to the process; the dispatch-mode stack is per thread. Other threads'
# module calls must not reach the module column, and their ops must not be recorded; the
# autograd engine's threads, which run the recording's backward with its modes, must be.


def _small_conv_net():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 4, 3, padding=1))
    return model.to(memory_format=torch.channels_last), torch.randn(2, 3, 8, 8).to(memory_format=torch.channels_last)


def test_threads_other_threads_module_calls_and_ops_stay_out_of_the_log():
    model, x = _small_conv_net()
    model(x).sum().backward()  # every step from now on accumulates into existing gradients
    alone = auditor.audit(model, x, record_time=False)
    expected = (alone.events["op"].astype(str).tolist(), alone.events["module"].astype(str).tolist())
    with ForeignThreads(2) as foreign:
        while foreign.calls < 4:  # both threads are running their models
            time.sleep(0.01)
        seen = foreign.calls
        for _ in range(20):
            a = auditor.audit(model, x, record_time=False)
            assert set(a.events["module"].astype(str)) == set(alone.events["module"].astype(str))
            assert (a.events["op"].astype(str).tolist(), a.events["module"].astype(str).tolist()) == expected
            assert "alien" not in " ".join(a.events["module_type"].astype(str)) + " ".join(a.events["module"].astype(str))
        assert foreign.calls > seen  # they ran beside the recordings
    assert not foreign.errors


@pytest.mark.filterwarnings("ignore:None of the inputs have requires_grad")  # inner checkpoints under no_grad
def test_threads_backward_on_the_engines_worker_threads_is_recorded_with_its_modules():
    """Reentrant checkpoints nested past the engine's reentrant depth (60) run their backward,
    recomputation included, on the engine's worker threads: every op is recorded, and each
    op, and every node such a thread makes, is its own module's."""
    from fault_models import ThreadOf

    depth = 70
    torch.manual_seed(0)
    model, x = nested_checkpoints(depth, noted=True), torch.randn(2, 4, requires_grad=True)
    counter = CountingMode()
    ThreadOf.threads = set()
    with counter:
        model(x).sum().backward()
    assert len(ThreadOf.threads) > 1  # the engine did use another thread
    model.zero_grad(set_to_none=True)
    x.grad = None
    with auditor.FormatAuditor() as fa:
        model(x).sum().backward()
    ev = fa.audit.events
    assert ev["op"].astype(str).tolist() == counter.ops
    bw = ev[ev["phase"] == "backward"]
    ops, modules = bw["op"].astype(str), bw["module"].astype(str)
    levels = ["<root>"] + [".".join(["inner"] * k) for k in range(1, depth)]
    # tanh and its backward belong to the level, the linear layer's ops to its lin
    tanh_backward = ops.eq("aten.tanh_backward.default")
    assert sorted(modules[tanh_backward]) == sorted(levels)
    assert not (ops.isin(["aten.mm.default", "aten.addmm.default"]) & ~modules.str.endswith("lin")).any()
    # a level is recomputed once per checkpoint around it: level k, k times
    recomputed = modules[ops.eq("aten.tanh.default")].value_counts()
    assert {name: int(n) for name, n in recomputed.items()} == {levels[k]: k for k in range(1, depth)}


# -- entering and leaving (item 2) ---------------------------------------------------------------


def _raise_keyboard_interrupt(*_a, **_k):
    raise KeyboardInterrupt


@pytest.fixture
def untouched():
    """The test must leave torch's global state as it found it."""
    before = global_state()
    yield before
    assert global_state() == before


def test_entry_reentering_an_active_auditor_raises_and_the_recording_goes_on(untouched):
    model, x = _small_conv_net()
    fa = auditor.FormatAuditor()
    with fa:
        with pytest.raises(RuntimeError, match="already recording"):
            with fa:
                pass
        model(x)
        assert len(_get_current_dispatch_mode_stack()) == 1
    assert "aten.convolution.default" in set(fa.audit.events["op"].astype(str))
    with fa:  # and it can record again afterwards
        model(x)
    assert fa.audit.complete


def _pushed_then_interrupted(self):
    TorchDispatchMode.__enter__(self)
    raise KeyboardInterrupt


def _patch(monkeypatch, target: str, replacement) -> None:
    """``monkeypatch.setattr`` on a dotted path whose package does not name its module
    (``torch.optim`` hides ``optimizer``)."""
    path, name = target.rsplit(".", 1)
    owner, attrs = None, []
    while owner is None:
        try:
            owner = importlib.import_module(path)
        except ImportError:
            path, attr = path.rsplit(".", 1)
            attrs.insert(0, attr)
    for attr in attrs:
        owner = getattr(owner, attr)
    monkeypatch.setattr(owner, name, replacement)


@pytest.mark.parametrize(
    "target, replacement, error",
    [
        ("auditor._recording._profile.ProfileSession.start", _raise_keyboard_interrupt, KeyboardInterrupt),
        ("auditor._recording._modules.register_module_forward_hook", _raise_keyboard_interrupt, KeyboardInterrupt),
        ("auditor._recording._mode.RecorderMode.__enter__", _pushed_then_interrupted, KeyboardInterrupt),
        ("torch.optim.optimizer.register_optimizer_step_post_hook", _raise_keyboard_interrupt, KeyboardInterrupt),
    ],
    ids=["profiler start", "module hook", "mode pushed, then interrupted", "optimizer hook"],
)
def test_entry_failure_leaves_no_mode_and_no_hook(untouched, monkeypatch, target, replacement, error):
    _patch(monkeypatch, target, replacement)
    fa = auditor.FormatAuditor(record_time=True)
    with pytest.raises(error):
        with fa:
            pytest.fail("the block must not run")
    assert global_state() == untouched
    with pytest.raises(RuntimeError, match="no audit"):
        _ = fa.audit
    monkeypatch.undo()
    model, x = _small_conv_net()
    with fa:  # the same auditor records once the fault is gone
        model(x)
    assert len(fa.audit.events) == 4


def _failing_exit(self, *exc):
    raise RuntimeError("mode exit failed")


_STOP = ProfileSession.stop


def _stopped_then_interrupted(self):
    _STOP(self)
    raise KeyboardInterrupt


@pytest.mark.parametrize(
    "target, replacement, error",
    [
        ("auditor._result.Audit.from_raw", _raise_keyboard_interrupt, KeyboardInterrupt),
        ("auditor._recording._log.build_frames", lambda raw: 1 / 0, ZeroDivisionError),
        ("auditor._recording._profile.ProfileSession.stop", _stopped_then_interrupted, KeyboardInterrupt),
        ("auditor._recording._mode.RecorderMode.__exit__", _failing_exit, RuntimeError),
        ("auditor._recording._modules.ForwardModuleTracker._fw_post_hook", _raise_keyboard_interrupt, KeyboardInterrupt),
    ],
    ids=["building the audit", "building the frames", "profiler stop", "mode exit", "interrupted inside the block"],
)
def test_exit_failure_leaves_no_mode_and_no_hook(untouched, monkeypatch, target, replacement, error):
    model, x = _small_conv_net()
    _patch(monkeypatch, target, replacement)
    with pytest.raises(error):
        with auditor.FormatAuditor(record_time=True):
            model(x).sum().backward()
    assert global_state() == untouched
    torch.ones(2) + 1  # no mode left to record it


def test_exit_keyboard_interrupt_in_the_block_gives_an_incomplete_audit(untouched):
    model, x = _small_conv_net()
    fa = auditor.FormatAuditor()
    with pytest.raises(KeyboardInterrupt):
        with fa:
            model(x)
            raise KeyboardInterrupt
    assert global_state() == untouched
    assert not fa.audit.complete and fa.audit.error.startswith("KeyboardInterrupt")
    assert len(fa.audit.events) == 4


# -- tensors without strides (item 3) ------------------------------------------------------------
#
# Each case runs as it runs without the recorder; the tensors that have no strides are recorded
# with their sizes (-1 for a ragged one), strides "()", format "-" and 0 bytes.

_D4 = torch.randn(2, 3, 4, 4, generator=torch.Generator().manual_seed(0))
_D4 = _D4 * (_D4 > 0)
_D2 = _D4[0, 0]
_W = torch.randn(4, 3, generator=torch.Generator().manual_seed(1))


def _coo():
    s = _D4.to_sparse().requires_grad_()
    y = (s * 2).to_dense()
    y.sum().backward()
    return y, s.grad.to_dense()


def _coo_mm():
    s, w = _D2.to_sparse().requires_grad_(), _W.clone().requires_grad_()
    y = torch.sparse.mm(s, w)
    y.sum().backward()
    return y, s.grad.to_dense(), w.grad


def _compressed(layout: str):
    def run():
        a = {"csr": _D2.to_sparse_csr, "csc": _D2.to_sparse_csc, "bsr": lambda: _D2.to_sparse_bsr((2, 2)),
             "bsc": lambda: _D2.to_sparse_bsc((2, 2))}[layout]()
        if layout in ("bsr", "bsc"):  # no matrix product on CPU for blocked layouts
            return a.to_dense() * 2, a.values().sum()
        w = _W.clone().requires_grad_()
        y = a @ w
        y.sum().backward()
        return y, w.grad, a.to_dense()
    return run


def _jagged():
    parts = [_D4[0, :2, 0, :3], _D4[1, :, 0, :3]]
    nt = torch.nested.nested_tensor(parts, layout=torch.jagged, requires_grad=True)
    w = _W.T[:, :3].clone().requires_grad_()
    y = torch.nn.functional.linear(nt, w).relu()
    y.values().sum().backward()
    return y.values(), w.grad


def _strided_nested():
    nt = torch.nested.nested_tensor([_D4[0, :2, 0, :3], _D4[1, :, 0, :3]], requires_grad=True)
    y = torch.nested.to_padded_tensor(nt * 2, 0.0)
    y.sum().backward()
    return y, nt.grad.to_padded_tensor(0.0)


def _mkldnn():
    import torch.utils.mkldnn

    torch.manual_seed(0)
    conv = torch.utils.mkldnn.to_mkldnn(nn.Conv2d(3, 4, 3, padding=1).eval())
    with torch.no_grad():  # mkldnn tensors have no autograd
        y = conv(_D4.to_mkldnn())
        return torch.relu(y).to_dense(), y.to_dense()


def _quantized():
    q = torch.quantize_per_tensor(_D4, 0.1, 0, torch.quint8).contiguous(memory_format=torch.channels_last)
    return torch.relu(q).dequantize(), q.int_repr()


def _meta():
    x = torch.empty(2, 3, 8, 8, device="meta").to(memory_format=torch.channels_last).requires_grad_()
    w = torch.empty(4, 3, 3, 3, device="meta").to(memory_format=torch.channels_last).requires_grad_()
    y = torch.nn.functional.conv2d(x, w)
    y.sum().backward()
    return [(t.shape, t.stride()) for t in (y, x.grad, w.grad)]


def _complex():
    x = (_D4 + 1j * _D4.flip(0)).to(memory_format=torch.channels_last).requires_grad_()
    y = (x * x).abs()
    y.sum().backward()
    return y, x.grad


STRIDELESS = {"sparse_coo": _coo, "sparse_coo_mm": _coo_mm, "sparse_csr": _compressed("csr"),
              "sparse_csc": _compressed("csc"), "sparse_bsr": _compressed("bsr"), "sparse_bsc": _compressed("bsc"),
              "jagged_nested": _jagged, "strided_nested": _strided_nested, "mkldnn": _mkldnn}
STRIDED_KINDS = {"quantized": _quantized, "meta": _meta, "complex": _complex}


def _same(a, b) -> None:
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b)
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _same(x, y)
    else:
        assert a == b


@pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning")  # torch's beta and deprecation notes
@pytest.mark.parametrize("name", list(STRIDELESS) + list(STRIDED_KINDS))
def test_strideless_tensors_run_as_without_the_recorder_and_are_marked_not_applicable(name):
    run = {**STRIDELESS, **STRIDED_KINDS}[name]
    plain = run()
    counter = CountingMode()
    with counter:
        run()
    with auditor.FormatAuditor(record_source=True, record_time=True) as fa:
        recorded = run()
    _same(plain, recorded)
    a = fa.audit
    assert a.events["op"].astype(str).tolist() == counter.ops
    t = a.tensors
    strideless = (t["ndim"] > 0) & (t["strides"].astype(str) == "()")
    if name in STRIDELESS:
        assert strideless.any()
        assert set(t.loc[strideless, "format"].astype(str)) == {"-"}
        assert (t.loc[strideless, "bytes"] == 0).all()
        assert not t.loc[strideless, "shape"].astype(str).str.contains("j").any()  # no symbolic sizes
    else:
        assert not strideless.any()  # they have strides, and keep their labels
        assert {"channels_last"} <= set(t["format"].astype(str))
    if name == "jagged_nested":
        assert "(2, -1, 3)" in set(t["shape"].astype(str))
    if name in ("sparse_coo", "mkldnn"):  # 4-D, yet no format: torch's strides for them are not a layout
        four_d = strideless & (t["ndim"] == 4)
        assert four_d.any() and set(t.loc[four_d, "format"].astype(str)) == {"-"}
    a.ops(), a.hotspots(), a.causes(), a.report(), a.summary(), a.coverage()
    _assert_same(a, _read(a.to_csv()))
    if name in STRIDELESS:  # strict mode judges them too (never a loss: they have no format)
        with auditor.FormatAuditor(strict=True):
            _same(plain, run())


# -- activation checkpointing (item 4) -----------------------------------------------------------


@pytest.mark.parametrize("use_reentrant", [True, False], ids=["reentrant", "non-reentrant"])
def test_checkpoint_recomputed_ops_belong_to_the_module_they_recompute(use_reentrant):
    torch.manual_seed(0)
    model = Checkpointed(use_reentrant).to(memory_format=torch.channels_last)
    x = torch.randn(1, 3, 8, 8).to(memory_format=torch.channels_last)
    a = auditor.audit(model, x, record_time=False, record_source=True)
    ev = a.events
    bw = ev[ev["phase"] == "backward"]
    ops, modules = bw["op"].astype(str), bw["module"].astype(str)
    recomputed = bw[ops.isin(["aten.convolution.default", "aten.relu.default"])]
    expected = {"aten.convolution.default": "conv", "aten.relu.default": "act"}
    assert sorted(recomputed["module"].astype(str)) == ["a.act", "a.conv", "b.act", "b.conv"]
    for op, module in zip(recomputed["op"].astype(str), recomputed["module"].astype(str)):
        assert module.endswith(expected[op]), (op, module)
    # their lines are the blocks' own forward lines
    block_line = f"{Block.forward.__code__.co_filename}:{Block.forward.__code__.co_firstlineno + 1}"
    assert set(recomputed["source"].astype(str)) == {block_line}
    # and the backward ops after the recomputation are their modules' too
    grads = {"aten.convolution_backward.default": ["a.conv", "b.conv", "head", "stem"],
             "aten.threshold_backward.default": ["a.act", "b.act"]}
    for op, names in grads.items():
        assert sorted(modules[ops.eq(op)]) == names
    # nothing in the head and stem was recomputed
    assert not recomputed["module"].astype(str).isin(["head", "stem"]).any()


# -- deep models (item 5) ------------------------------------------------------------------------


@pytest.mark.parametrize("depth", [200, 1000])
def test_deep_module_trees_are_named_without_recursion(untouched, depth):
    """A module tree 1000 deep whose forward is a loop: naming it must not recurse."""
    model, x = Chain(depth), torch.randn(3)
    plain = model(x)
    a = auditor.audit(model, x, record_time=False)
    modules = set(a.events["module"].astype(str))
    assert "first" + ".next" * (depth - 1) in modules and len(modules - {"<root>", "<global>"}) == depth
    assert torch.equal(model(x), plain)


def test_deep_nesting_that_runs_plainly_runs_under_the_audit(untouched):
    """200 modules each calling the next: torch calls every module through one more frame
    under any module hook, and the recorder makes room for them."""
    model, x = wrapped(200), torch.randn(3)
    model(x).sum().backward()  # runs plainly at the default limit
    a = auditor.audit(model, x)
    assert "inner" + ".inner" * 198 in set(a.events["module"].astype(str))  # the 200th module
    assert len(a.events[(a.events["op"] == "aten.mul.Tensor") & (a.events["phase"] == "forward")]) == 200


def test_deep_nesting_1000_runs_at_the_limit_the_plain_run_needs(untouched):
    """1000 levels need a raised recursion limit plainly; the audit needs no more than that."""
    model, x = wrapped(1000), torch.randn(3)
    limit = sys.getrecursionlimit()
    try:
        low, high = 1000, 10000  # the least limit at which the plain step runs
        while high - low > 50:
            mid = (low + high) // 2
            sys.setrecursionlimit(mid)
            try:
                model(x).sum().backward()
                high = mid
            except RecursionError:
                low = mid
        sys.setrecursionlimit(high + 50)
        a = auditor.audit(model, x)
        assert sys.getrecursionlimit() == high + 50  # given back
    finally:
        sys.setrecursionlimit(limit)
    assert "inner" + ".inner" * 998 in set(a.events["module"].astype(str)) and a.complete


# -- keyword arguments (item 8) ------------------------------------------------------------------


def test_kwargs_reach_the_model_in_real_and_fake_audits():
    torch.manual_seed(0)
    model = Masked().to(memory_format=torch.channels_last)
    x = torch.randn(2, 3, 8, 8).to(memory_format=torch.channels_last)
    mask = torch.rand(1, 4, 1, 1)
    kwargs = {"mask": mask, "scale": 3.0}
    expected = model(x, **kwargs)
    a = auditor.audit(model, x, kwargs=kwargs, record_time=False)
    muls = a.events[(a.events["op"] == "aten.mul.Tensor") & (a.events["phase"] == "forward")]
    assert len(muls) == 2  # the mask, then the scale
    inputs = a.tensors[a.tensors["seq"].isin(muls["seq"]) & (a.tensors["role"] == "input")]
    assert "(1, 4, 1, 1)" in set(inputs["shape"].astype(str))
    assert torch.equal(model(x, **kwargs), expected)
    # a read-only mapping is a mapping
    from types import MappingProxyType

    model.zero_grad(set_to_none=True)
    b = auditor.audit(model, x, kwargs=MappingProxyType(kwargs), record_time=False)
    assert b.events["op"].astype(str).tolist() == a.events["op"].astype(str).tolist()
    # fake: the tensor in kwargs is made fake on the target like the inputs
    target = "cuda" if fake_cuda_problem() is None else "cpu"
    f = auditor.audit(model, x, kwargs=kwargs, fake=True, device=target)
    assert set(f.tensors["device"].astype(str)) == {"cuda:0" if target == "cuda" else "cpu"}
    assert "(1, 4, 1, 1)" in set(f.tensors["shape"].astype(str))
    with pytest.raises(TypeError, match="missing 1 required keyword-only argument: 'mask'"):
        auditor.audit(model, x, record_time=False)


@pytest.mark.parametrize("bad", [[("mask", 1)], "mask", 3, {1: 2}])
def test_kwargs_must_be_a_mapping_of_names(bad):
    with pytest.raises(TypeError, match=r"^kwargs (must be a mapping|keys must be argument names)"):
        auditor.audit(Masked(), torch.randn(1, 3, 4, 4), kwargs=bad)


# -- torch.compile (item 9) ----------------------------------------------------------------------
#
# Under a Python dispatch mode Dynamo compiles nothing and runs no compiled code: the frames run
# eagerly, the recorder sees the eager ops, and the audit says so, once.


def _compile_case(backend: str):
    torch._dynamo.reset()
    model, x = _small_conv_net()
    compiled = torch.compile(model, backend=backend)
    first = compiled(x)  # compiled before the block
    return model, compiled, x, first


@pytest.mark.parametrize("backend", ["eager", "inductor"])  # inductor: 9 s with a cold cache here
def test_compile_runs_eagerly_is_marked_and_said_once(backend):
    model, compiled, x, first = _compile_case(backend)
    expected = model(x)
    eager = auditor.audit(model, x, record_time=False)
    model.zero_grad(set_to_none=True)
    from torch._dynamo.utils import counters

    frames = dict(counters["frames"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with auditor.FormatAuditor() as fa:
            out = compiled(x)
            out.sum().backward()
    assert dict(counters["frames"]) == frames  # nothing was compiled inside
    assert torch.equal(out, expected) and out.stride() == expected.stride()
    ev = fa.audit.events
    assert ev["op"].astype(str).tolist() == eager.events["op"].astype(str).tolist()  # the eager ops
    assert ev["module"].astype(str).tolist() == eager.events["module"].astype(str).tolist()  # wrapper looked through
    forward_ops = ev["phase"].eq("forward") & ~ev["op"].astype(str).isin(["aten.sum.default", "aten.ones_like.default"])
    assert ev.loc[forward_ops, "compiled"].all() and not ev.loc[~forward_ops & (ev["phase"] == "forward"), "compiled"].any()
    backward = ev[ev["phase"] == "backward"]
    assert backward.loc[backward["forward_seq"].isin(ev.index[forward_ops]), "compiled"].all()
    said = [str(w.message) for w in caught if str(w.message).startswith("auditor:")]
    assert said == [f"auditor: {int(ev['compiled'].sum())} recorded ops ran inside torch.compile'd code (events with "
                    "compiled=True, their backward included); under a Python dispatch mode Dynamo runs that code "
                    "eagerly, so the audit shows the eager ops and their layouts, not the compiled graph's kernels"]
    # and the compiled code still runs after, as before: Inductor's generated kernels need not
    # round as ATen's do (they differ where ATen runs AVX2 kernels), so it is compared to itself
    assert torch.equal(compiled(x), first)


def test_compile_no_warning_without_compiled_code():
    model, x = _small_conv_net()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        a = auditor.audit(model, x, record_time=False)
    assert not a.events["compiled"].any()


# -- memory (item 10) ----------------------------------------------------------------------------


def _buffers_of(mode) -> int:
    return sum(len(b) for b in (mode.events, mode.tensors, mode.layouts, mode._node_nrs, mode._node_events,
                                mode.compiled, mode.failed))


def test_memory_the_recorder_is_gone_once_the_audit_is_built():
    model, x = _small_conv_net()
    fa = auditor.FormatAuditor(record_time=True)
    with fa:
        mode = weakref.ref(fa._mode)
        model(x).sum().backward()
    assert fa._mode is None and fa._tracker is None and fa._profile is None and not fa._hooks
    gc.collect()
    assert mode() is None
    assert len(fa.audit.events) > 0


def test_memory_a_traceback_that_holds_the_mode_holds_no_buffers():
    """An op that raises inside the mode (here strict's error) leaves the mode's frame in the
    traceback the user keeps: its buffers must be empty."""
    model, x = _model_and_input()
    with pytest.raises(auditor.FormatLossError) as info:
        with auditor.FormatAuditor(strict=True):
            model(x).sum().backward()
    modes = [f.f_locals["self"] for f, _ in traceback.walk_tb(info.value.__traceback__)
             if isinstance(f.f_locals.get("self"), RecorderMode)]
    assert modes
    assert all(_buffers_of(m) == 0 and m.facts is None for m in modes)


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _training_steps(n: int, keep: list | None) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1),
                          nn.Softmax(dim=1), nn.Conv2d(16, 8, 3, padding=1)).to(memory_format=torch.channels_last)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(4, 3, 16, 16).to(memory_format=torch.channels_last)
    for _ in range(n):
        fa = auditor.FormatAuditor(record_time=True)
        with fa:
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
        if keep is not None:
            keep.append(fa.audit)


def _reachable(root) -> tuple[int, collections.Counter]:
    """Bytes (``sys.getsizeof``) of everything reachable from ``root`` and the types found."""
    seen, found, size, todo = set(), collections.Counter(), 0, [root]
    while todo:
        o = todo.pop()
        if id(o) in seen or isinstance(o, (type, types.ModuleType)):
            continue
        seen.add(id(o))
        if isinstance(o, weakref.ref) and isinstance(o(), torch.Tensor):
            found["weak reference to a tensor"] += 1
        found[type(o).__name__] += 1
        size += sys.getsizeof(o)
        todo.extend(gc.get_referents(o))
    return size, found


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_memory_does_not_grow_over_50_recorded_steps():
    """50 training steps, one FormatAuditor each: dropped audits leave nothing behind, and a
    kept audit holds its DataFrames, not the recorder's buffers."""
    _training_steps(10, None)  # caches, allocator pools, the profiler's first start
    gc.collect()
    rss = _rss_mib()
    _training_steps(50, None)
    gc.collect()
    rss_dropped = _rss_mib() - rss
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        _training_steps(50, None)
        gc.collect()
        dropped = tracemalloc.get_traced_memory()[0] - base
        kept: list = []
        base = tracemalloc.get_traced_memory()[0]
        _training_steps(50, kept)
        gc.collect()
        per_audit = (tracemalloc.get_traced_memory()[0] - base) / 50
    finally:
        tracemalloc.stop()
    # a step's raw buffers (event tuples, weak references, layout keys) are about 40 kB: 50 of
    # them left behind would be 2 MB
    assert dropped < 512 * 1024, dropped
    assert rss_dropped < 16, rss_dropped
    audit_bytes, found = _reachable(kept[-1])
    assert not {"weak reference to a tensor", "RecorderMode", "OpOverload", "ForwardModuleTracker", "RawLog"} & set(found)
    assert per_audit < 1.25 * audit_bytes + 8 * 1024, (per_audit, audit_bytes)


# -- the command line's faults (the CLI items) ---------------------------------------------------



@pytest.fixture
def factories(tmp_path):
    path = tmp_path / "models.py"
    path.write_text(CLI_FACTORIES)
    return path


def _cli_error(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines[-1].startswith("format-audit: error: "), err
    return lines[-1]


@pytest.mark.parametrize("factory, error", [("key_error", "KeyError: 'x'"),
                                            ("assertion", "AssertionError: wants 4 channels")])
def test_cli_an_exception_in_the_users_forward_is_exit_2_in_one_line(factories, capsys, factory, error):
    from auditor.cli import main

    assert main([f"{factories}:{factory}", "--input", "1,3,8,8"]) == 2
    assert _cli_error(capsys).endswith(f"{factory} failed on input 1,3,8,8 float32: {error}")


@pytest.mark.parametrize("args, message", [
    (["--input", "1,5,8,8"], "failed on input 1,5,8,8"),  # a shape the model cannot take
    (["--input", "1,3,8"], "needs a 4-D --input"),
    (["--input", ""], "--input must be comma-separated positive integers"),
    (["--top", "-1"], "--top must be at least 1, got -1"),
])
def test_cli_impossible_flags_are_exit_2_in_one_line(factories, capsys, args, message):
    from auditor.cli import main

    assert main([f"{factories}:small", *args]) == 2
    assert message in _cli_error(capsys)


def test_cli_an_existing_out_is_refused_without_force(factories, tmp_path, capsys):
    from auditor.cli import main

    out = tmp_path / "out"
    assert main([f"{factories}:small", "--input", "1,3,8,8", "--no-backward", "--out", str(out)]) == 0
    written = (out / "report.txt").read_text()
    capsys.readouterr()
    assert main([f"{factories}:small", "--input", "1,3,8,8", "--out", str(out)]) == 2
    assert "already holds an audit" in _cli_error(capsys) and (out / "report.txt").read_text() == written
    assert main([f"{factories}:small", "--input", "1,3,8,8", "--out", str(out), "--force"]) == 0


def test_cli_models_with_the_same_factory_name_get_distinct_folders(factories, tmp_path, capsys):
    from auditor.cli import main

    other = tmp_path / "elsewhere" / "models.py"
    other.parent.mkdir()
    other.write_text(CLI_FACTORIES)
    out = tmp_path / "out"
    argv = [f"{factories}:small", f"{other}:small", "--input", "1,3,8,8", "--no-backward", "--out", str(out)]
    assert main(argv) == 0
    assert sorted(p.name for p in out.iterdir()) == ["small", "small-2"]
    assert all((out / name / "events.csv").exists() for name in ("small", "small-2"))


# -- a torch without the private entry points the recorder uses -------------------------------------


def test_a_missing_private_entry_point_is_named_with_the_torch_version(monkeypatch):
    from auditor._recording import _torch

    name = "torch._C._current_graph_task_id"
    monkeypatch.setattr(_torch, "MISSING", {name: _torch.Missing(name, "not found")})
    with pytest.raises(_torch.TorchInternalsError, match=rf"torch\._C\._current_graph_task_id.*torch "
                                                         rf"{re.escape(torch.__version__)}.*tested on torch 2\."):
        with auditor.FormatAuditor():
            pass
    assert not _get_current_dispatch_mode_stack()  # nothing was left behind
    stand_in = _torch.lookup("torch._C._no_such_binding_anywhere")
    assert not stand_in and isinstance(stand_in, _torch.Missing)
    with pytest.raises(_torch.TorchInternalsError, match="_no_such_binding_anywhere"):
        stand_in()
    monkeypatch.setattr(_torch, "MISSING", {})
    _torch.require_recorder()
    monkeypatch.setitem(_torch.ATTRIBUTES, "Tensor._is_view", False)
    with pytest.raises(_torch.TorchInternalsError, match="Tensor._is_view"):
        _torch.require_recorder()


def test_a_torch_without_the_reduction_tag_finds_reductions_by_their_schema(monkeypatch):
    from auditor._recording import _torch

    aten = torch.ops.aten
    reductions = [aten.sum.dim_IntList, aten.mean.dim, aten.amax.default, aten.var.correction, aten.argmax.default]
    others = [aten.add.Tensor, aten.convolution.default, aten.sum_.default if hasattr(aten, "sum_") else aten.mul.Tensor,
              aten.cat.default, aten.softmax.int]
    tagged = [_torch.is_reduction(f) for f in reductions + others]
    monkeypatch.setattr(_torch, "_TAG_REDUCTION", None)
    by_schema = [_torch.is_reduction(f) for f in reductions + others]
    assert by_schema == [True] * len(reductions) + [False] * len(others)
    if getattr(torch.Tag, "reduction", None) is not None:
        assert tagged == by_schema


def test_a_lazy_entry_point_is_looked_up_once_and_a_missing_one_names_its_feature(monkeypatch):
    from auditor._recording import _torch

    assert _torch.GraphLowering is _torch.GraphLowering  # kept after the first read
    monkeypatch.setitem(_torch.ENTRIES["inductor"], "no_such_pass", "torch._inductor.no_such_pass")
    monkeypatch.setitem(_torch._WHERE, "no_such_pass", ("inductor", "torch._inductor.no_such_pass"))
    monkeypatch.setitem(_torch.FEATURES, "inductor", (*_torch.FEATURES["inductor"], "torch._inductor.no_such_pass"))
    monkeypatch.delitem(_torch.MISSING, "torch._inductor.no_such_pass", raising=False)
    with pytest.raises(_torch.TorchInternalsError, match=r"compiled audits .*need (.+, )?torch\._inductor\.no_such_pass, "
                                                         rf"which torch {re.escape(torch.__version__)} does not have"):
        _torch.require("inductor")
    monkeypatch.delattr(_torch, "no_such_pass", raising=False)
