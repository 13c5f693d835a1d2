"""The fault items of the issue "Trustworthy however it is run": each test damages something on
purpose and checks that auditor says what is wrong, naming where, instead of answering wrongly.

One section per item; the checks of a section can fail only through the code of that item.
"""

from __future__ import annotations

import csv
import functools
import io
import re
import zlib

import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pandas.testing import assert_frame_equal
from torch import nn

import auditor
from auditor.recording import log

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
