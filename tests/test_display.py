"""Notebook display: HTML tables, source lines shown whole, notebook cells named as IPython
names them, and the progress switch."""

from __future__ import annotations

import html
import linecache
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pandas as pd
import pytest
import torch
import torch.nn as nn

import auditor
from auditor.display import progress
from auditor.display._html import source_html, table_html
from auditor.display._text import short_path
from auditor.distributed import RankAudits
from auditor.recording import _cells as sources

ROOT = Path(__file__).resolve().parent.parent
HERE = str(Path(__file__).resolve())
CL = torch.channels_last
ODD = "a<&>b"  # a module name that must be escaped


class Net(nn.Module):
    """A softmax with no channels_last kernel between two convolutions, in a module whose name
    needs escaping."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.add_module(ODD, nn.Softmax(dim=1))
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x):
        return self.conv2(self.get_submodule(ODD)(self.conv1(x)))  # the line


LINE = next(i for i, t in enumerate(Path(HERE).read_text().splitlines(), 1) if t.endswith("# the line"))


@pytest.fixture(scope="module")
def audit() -> auditor.Audit:
    torch.manual_seed(0)
    return auditor.audit(Net().to(memory_format=CL), torch.randn(2, 3, 8, 8).to(memory_format=CL),
                         record_time=False)


@pytest.fixture
def at_root(monkeypatch):
    monkeypatch.chdir(ROOT)


def fresh(a: auditor.Audit) -> auditor.Audit:
    """The same log, analysed again."""
    return auditor.Audit(a.events, a.tensors, complete=a.complete, error=a.error, hidden=a.hidden)


# -- HTML tables ---------------------------------------------------------------------------------


def test_audit_html_is_tables_of_causes_groups_and_modules(audit, at_root):
    out = audit._repr_html_()
    assert "<pre>" not in out
    assert out.count("<table") == 3
    causes = out[out.index("<table"):out.index("</table>")]
    assert "Causes, most bytes first (1)" in causes
    assert "<td" in causes and "aten._softmax.default" in causes and "no_cl_kernel" in causes
    assert ">20.5 kB<" in causes  # written as the report writes it
    assert "Format audit: 15 aten ops" in out.split("<table")[0]


def test_file_line_is_whole_with_the_recorded_path_as_tooltip(audit, at_root):
    out = audit._repr_html_()
    assert f'<span title="{HERE}:{LINE}">tests/test_display.py:{LINE}</span>' in out


def test_text_names_the_source_as_the_html_does(audit, at_root):
    """One way to show a source line: the report and the fixes as the HTML does, relative to
    the project; the tables keep the recorded path."""
    short = f"tests/test_display.py:{LINE}"
    report = audit.report()
    assert f"at {short}" in report and HERE not in report
    assert f">{short}</span>" in audit._repr_html_()
    fixes = str(auditor.suggest_fixes(audit))
    assert f"swap module: {short}  " in fixes and HERE not in fixes
    assert f"{HERE}:{LINE}" in set(audit.hotspots()["source"]) and f"{HERE}:{LINE}" in set(audit.causes()["source"])


def test_names_are_escaped(audit, at_root):
    out = audit._repr_html_()
    assert html.escape(ODD) in out
    assert ODD not in out
    assert ODD in audit.report()


def test_source_is_shown_relative_and_never_cut():
    lib = os.path.join(sysconfig.get_paths()["purelib"], "torchvision", "models", "resnet.py")
    assert short_path(lib) == os.path.join("torchvision", "models", "resnet.py")
    deep = "/nowhere" + "/very_long_folder_name" * 12 + "/model.py"
    frame = pd.DataFrame({"source": [f"{deep}:1234", f"{lib}:150", ""], "bytes": [1, 2, 3]})
    out = table_html(frame)
    assert f">{deep}:1234<" in out  # outside every known folder: the whole path
    assert f">{os.path.join('torchvision', 'models', 'resnet.py')}:150<" in out
    assert f'title="{lib}:150"' in out
    assert source_html("a&b.py:3") == '<span title="a&amp;b.py:3">a&amp;b.py:3</span>'


def test_report_keeps_a_long_source_whole(audit):
    deep = "/nowhere" + "/very_long_folder_name" * 12
    events = audit.events.copy()
    events["source"] = events["source"].cat.rename_categories(lambda s: deep + s if s else s)
    a = auditor.Audit(events, audit.tensors, hidden=audit.hidden)
    long = f"{deep}{HERE}:{LINE}"
    assert f"at {long}" in a.report()
    assert f">{long}<" in a._repr_html_()


def test_table_html_formats_names_and_limits():
    frame = pd.DataFrame({"module": ["x<y", "z"], "bytes": [802800, 1], "time_us": [404.7, float("nan")],
                          "share": [0.5, 0.25]})
    out = table_html(frame, columns={"module": "module", "bytes": "bytes", "time_us": "time", "share": "share"},
                     caption="A & B", max_rows=1, more="Audit.x()")
    assert ">802.8 kB<" in out and ">404.7 µs<" in out and ">50.0%<" in out
    assert "x&lt;y" in out and "<caption>A &amp; B</caption>" in out and ">time<" in out
    assert "... and 1 more (Audit.x())" in out and ">z<" not in out


def test_fixes_and_rank_audits_display_as_tables(audit, at_root):
    fixes = auditor.suggest_fixes(audit)
    out = fixes._repr_html_()
    assert "<table" in out and "swap module" in out and f"tests/test_display.py:{LINE}" in out
    assert html.escape(ODD) in out and ODD not in out
    ranks = RankAudits({0: audit, 1: audit})
    out = ranks._repr_html_()
    assert out.count("<table") == 1 + 3  # per-rank totals, then rank 0's report
    assert "identical on every rank" in out and "Rank 0:" in out and ODD not in out


# -- notebook cells ------------------------------------------------------------------------------


def test_a_notebook_cell_is_named_as_ipython_names_it(monkeypatch):
    """A cell compiled by ipykernel's compiler (a temporary file name) is recorded as
    ``Cell In[7], line 3``; the recorded name leads back to the cell's text."""
    from ipykernel.compiler import XCachingCompiler

    compiler = XCachingCompiler()
    code = "conv = nn.Conv2d(3, 4, 1).to(memory_format=CL)\nx = torch.randn(1, 3, 4, 4)\ny = conv(x).contiguous()\n"
    filename = compiler.cache(code, number=7)
    assert filename != "<ipython-input-7>" and filename.endswith(".py")

    class Shell:
        compile = compiler

    ipython = type(sys)("IPython")
    ipython.get_ipython = lambda: Shell()
    monkeypatch.setitem(sys.modules, "IPython", ipython)
    with auditor.FormatAuditor(record_source=True) as fa:
        exec(compile(code, filename, "exec"), {"nn": nn, "torch": torch, "CL": CL})
    names = set(fa.audit.events["source"])
    assert "Cell In[7], line 3" in names and not any(filename in s for s in names)
    recorded = sources.recorded("Cell In[7], line 3")
    assert recorded == f"{filename}:3"
    path, _, line = recorded.rpartition(":")
    assert linecache.getline(path, int(line)) == "y = conv(x).contiguous()\n"
    assert sources.readable([f"{HERE}:3"]) == [f"{HERE}:3"]  # a file outside every cell


def test_fixes_read_the_line_of_a_notebook_cell(monkeypatch):
    """A cause in a cell's code: the fix quotes the cell's line and rewrites its copy."""
    from ipykernel.compiler import XCachingCompiler

    compiler = XCachingCompiler()
    code = ("class Net(nn.Module):\n"
            "    def __init__(self):\n"
            "        super().__init__()\n"
            "        self.a, self.b = nn.Conv2d(3, 4, 1), nn.Conv2d(4, 4, 1)\n"
            "    def forward(self, x):\n"
            "        return self.b(self.a(x).contiguous())\n")
    filename = compiler.cache(code, number=4)

    class Shell:
        compile = compiler

    ipython = type(sys)("IPython")
    ipython.get_ipython = lambda: Shell()
    monkeypatch.setitem(sys.modules, "IPython", ipython)
    scope = {"nn": nn, "torch": torch}  # a notebook that imported torch
    exec(compile(code, filename, "exec"), scope)
    model = scope["Net"]().to(memory_format=CL)
    a = auditor.audit(model, torch.randn(1, 3, 4, 4).to(memory_format=CL), record_time=False)
    fixes = auditor.suggest_fixes(a).frame
    row = fixes[fixes["source"] == "Cell In[4], line 6"].iloc[0]
    assert row["line"].strip() == "return self.b(self.a(x).contiguous())"
    assert "contiguous(memory_format=torch.channels_last)" in row["suggestion"]


def test_outside_ipython_sources_stay_and_ipython_is_not_imported():
    code = ("import sys, torch, auditor\n"
            "a = auditor.audit(torch.nn.Conv2d(3, 3, 1), torch.randn(1, 3, 4, 4), record_time=False)\n"
            "assert a.events['source'].str.contains(':2$').any(), list(a.events['source'])\n"
            "a._repr_html_()\n"
            "assert 'IPython' not in sys.modules\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, env={**os.environ, "AUDITOR_PROGRESS": "1"})


# -- progress ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("switch", "env", "large", "shown"), [
    (True, None, True, True),
    (None, "1", True, True),
    (False, "1", True, False),  # the switch wins over the environment
    (None, "0", True, False),
    (True, None, False, False),  # a small audit shows no bar
    (None, None, True, False),  # tqdm's rule: the captured stderr is no terminal
])
def test_progress_bar_over_the_analysis(audit, capsys, monkeypatch, switch, env, large, shown):
    monkeypatch.setattr(progress, "ENABLED", switch)
    if env is None:
        monkeypatch.delenv("AUDITOR_PROGRESS", raising=False)
    else:
        monkeypatch.setenv("AUDITOR_PROGRESS", env)
    if large:
        monkeypatch.setattr(progress, "LARGE_AUDIT", 1)
    capsys.readouterr()
    a = fresh(audit)
    a.ops()
    err = capsys.readouterr().err
    assert ("analysing the audit" in err) == shown, err
    if shown:
        assert "facts" in err and "causes" in err
    assert a.causes().equals(audit.causes())


def test_progress_setting():
    assert progress.setting(False) is False and progress.setting(True) is True
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(progress, "ENABLED", None)
        for value, expected in (("off", False), ("no", False), ("ON", True), ("", None), ("maybe", None)):
            mp.setenv("AUDITOR_PROGRESS", value)
            assert progress.setting() is expected, value
            assert progress.enabled() is (expected is not False)
