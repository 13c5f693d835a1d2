"""Notebook display: HTML tables, source lines shown whole, notebook cells named as IPython
names them, and the progress switch."""

from __future__ import annotations

import html
import linecache
import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import pandas as pd
import pytest
import torch
import torch.nn as nn

import auditor
from auditor._display import progress
from auditor._display._html import source_html, table_html
from auditor._display._text import short_path
from auditor._display._units import format_bytes, format_us
from auditor._recording import _cells as sources
from auditor.distributed import RankAudits

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
    assert "<td" in causes and ">_softmax<" in causes and "no_cl_kernel" in causes
    assert ">20.5 kB<" in causes  # written as the report writes it
    assert f"Format audit: {len(audit.events)} aten ops" in out.split("<table")[0]


def test_file_line_is_whole_with_the_recorded_path_as_tooltip(audit, at_root):
    out = audit._repr_html_()
    assert f'<span title="{HERE}:{LINE}">tests/test_display.py:{LINE}</span>' in out.replace("<wbr>", "")


def test_text_names_the_source_as_the_html_does(audit, at_root):
    """One way to show a source line: the report and the fixes as the HTML does, relative to
    the project; the tables keep the recorded path."""
    short = f"tests/test_display.py:{LINE}"
    report = audit.report()
    assert f"at {short}" in report and HERE not in report
    assert f">{short}</span>" in audit._repr_html_().replace("<wbr>", "")
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
    shown = out.replace("<wbr>", "")  # a long path may wrap at its folders, never inside a name
    assert f">{deep}:1234<" in shown  # outside every known folder: the whole path
    assert f">{os.path.join('torchvision', 'models', 'resnet.py')}:150<" in shown
    assert f'title="{lib}:150"' in out
    assert source_html("a&b.py:3") == '<span title="a&amp;b.py:3">a&amp;b.py:3</span>'
    assert source_html("torchvision/models/resnet.py:150").count("/<wbr>") == 2


def test_report_keeps_a_long_source_whole(audit):
    deep = "/nowhere" + "/very_long_folder_name" * 12
    events = audit.events.copy()
    events["source"] = events["source"].cat.rename_categories(lambda s: deep + s if s else s)
    a = auditor.Audit(events, audit.tensors, hidden=audit.hidden)
    long = f"{deep}{HERE}:{LINE}"
    assert f"at {long}" in a.report()
    assert f">{long}<" in a._repr_html_().replace("<wbr>", "")


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
            "class M(torch.nn.Conv2d):\n"
            "    def forward(self, x): return super().forward(x) * 2\n"
            "a = auditor.audit(M(3, 3, 1), torch.randn(1, 3, 4, 4), record_time=False)\n"
            "assert a.events['source'].str.contains(':3$').any(), list(a.events['source'])\n"
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


# -- what the tables and the report say ------------------------------------------------------------


def _css(out: str, heading: str) -> tuple[str, str]:
    """The cell and heading style of the column headed ``heading`` in a Styler table."""
    import re

    heads = re.findall(r'<th id="[^"]*" class="col_heading level0 (col\d+)" >([^<]*)</th>', out)
    col = next(c for c, h in heads if h == heading)
    td = re.search(rf"td\.{col} {{([^}}]*)}}", out).group(1)
    th = re.search(rf"th\.{col} {{([^}}]*)}}", out).group(1)
    return td, th


def test_numbers_are_right_aligned_and_narrow_and_prose_wraps_within_a_width():
    """A fix's number is a number (right, no prose width); code and prose wrap within a
    width; every heading is aligned like its cells (a text column's heading on the left)."""
    frame = pd.DataFrame({"fix": [1], "action": ["edit source"], "line": ["a = b\nc = d"],
                          "detail": ["why " * 40], "bytes": [802800]})
    out = table_html(frame)
    td, th = _css(out, "fix")
    assert "text-align: right" in td and "min-width" not in td and "text-align: right" in th
    for heading in ("action", "line", "detail"):
        td, th = _css(out, heading)
        assert "text-align: left" in td and "text-align: left" in th
    for heading in ("line", "detail"):
        td, _ = _css(out, heading)
        assert "max-width" in td
    assert "pre-wrap" in _css(out, "line")[0]  # a multi-line statement keeps its lines
    assert out.count("<div style=\"max-width: 16em") == 2  # the line and the detail, each in a box


def test_fixes_table_fix_number_is_right_aligned_and_its_code_left(audit):
    out = auditor.suggest_fixes(audit)._repr_html_()
    td, th = _css(out, "fix")
    assert "text-align: right" in td and "text-align: right" in th
    td, th = _css(out, "why")
    assert "text-align: left" in td and "text-align: left" in th


def test_a_fixes_code_is_a_block_under_the_table_with_its_indentation():
    """Issue 41: a 12-line function body sat in a narrow "now" column, its first line stripped of
    its indentation and the others not, and "do" wrapped inside a name. Each statement is now a
    code block under the table: dedented as a whole, its lines and inner indentation kept, wrapped
    only at spaces."""
    from auditor._display._fixes import fixes_html

    body = "    def shuffle(x, groups):\n        y = x.view(2, 3)\n        return y.contiguous()\n"
    frame = pd.DataFrame({"fix": [1], "action": ["edit source"], "source": ["/x/pkg/mod.py:3"], "module": ["a.b"],
                          "module_type": ["M"], "bytes": [1000], "hotspots": [2], "detail": ["why"], "reason": [""],
                          "line": [body], "suggestion": ["torch.nn.functional.channel_shuffle(x, groups)"],
                          "forward_bytes": [500], "backward_bytes": [500]})
    out = fixes_html(frame, 2)
    table = out[:out.index("</table>")]
    assert ">now<" not in table and ">do<" not in table and ">why<" in table
    blocks = re.findall(r"<pre[^>]*>(.*?)</pre>", out, re.S)
    assert blocks[0] == "def shuffle(x, groups):\n    y = x.view(2, 3)\n    return y.contiguous()"
    assert blocks[1] == "torch.nn.functional.channel_shuffle(x, groups)"
    assert all("overflow-wrap: normal" in p and "pre-wrap" in p for p in re.findall(r"<pre style=\"([^\"]*)\"", out))
    assert '<div style="max-width: 32em' in table  # "why", the one prose column left, has room


def test_nothing_reads_as_zero_point_zero():
    assert format_bytes(0) == "0 B" and format_us(0.0) == "0 s"
    assert format_bytes(1500) == "1.5 kB"
    plain = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Conv2d(4, 4, 3))
    report = auditor.audit(plain.to(memory_format=CL), torch.randn(1, 3, 8, 8).to(memory_format=CL),
                           record_time=False).report()
    assert "0 B moved (forward 0 B, backward 0 B)" in report and "0.0" not in report


def test_report_explains_the_n_a_kind(audit):
    import re

    report = audit.report()
    assert re.search(r"n/a \d+ \(no image read or written, or a factory\)", report)


def test_one_hotspot_is_singular():
    from auditor._display._report import MODULE_COLUMNS

    text = next(c for c in MODULE_COLUMNS if c.key == "hotspots").text
    assert text(1).strip() == "1 hotspot" and text(2).strip() == "2 hotspots"


def test_modules_share_is_of_what_they_are_ranked_by():
    """Timed, a module's share is of the hotspots' time, and says so."""
    from auditor._display._report import module_rows

    summary = pd.DataFrame({"module": ["a", "b"], "hotspots": [1, 1], "bytes": [900, 100],
                            "share": [0.9, 0.1], "time_us": [10.0, 30.0]})
    rows, timed = module_rows(summary)
    assert timed and list(rows["module"]) == ["b", "a"] and list(rows["share"]) == [0.75, 0.25]
    rows, timed = module_rows(summary.assign(time_us=float("nan")))
    assert not timed and list(rows["share"]) == [0.9, 0.1]


class Block(nn.Module):
    """One repeated block: its conv's output copied contiguous, then a conv."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(4, 4, 1)
        self.conv2 = nn.Conv2d(4, 4, 1)

    def forward(self, x):
        return self.conv2(self.conv1(x).contiguous())


@pytest.fixture(scope="module")
def repeated() -> auditor.Audit:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 1), *[Block() for _ in range(5)])
    return auditor.audit(model.to(memory_format=CL), torch.randn(2, 3, 6, 6).to(memory_format=CL), record_time=False)


def test_hotspots_of_repeated_blocks_show_as_one_row_each(repeated):
    """The same statement in blocks 1..5 is one row of the report and of the HTML (module path
    ``1–5.conv2``, the counts summed), while Audit.hotspots() keeps a group per block."""
    from auditor._display._report import combine_blocks

    hot = repeated.hotspots()
    assert (hot["count"] == 1).all() and len(hot) >= 10  # one group per block and statement
    rows = combine_blocks(hot)
    assert len(rows) * 5 == len(hot) and (rows["groups"] == 5).all() and (rows["count"] == 5).all()
    assert rows["bytes"].sum() == hot["bytes"].sum() and list(rows["bytes"]) == sorted(rows["bytes"], reverse=True)
    assert set(rows["module"]) >= {"1–5", "1–5.conv2"}
    report = repeated.report()
    assert " 1–5.conv2 " in report and "5x" in report and " 1.conv2 " not in report
    shown = repeated._repr_html_()
    assert f"Hotspot groups ({len(hot)}; {len(rows)} rows, repeated blocks combined)" in shown
    assert ">1–5.conv2<" in shown and ">groups<" in shown and ">2.conv2<" not in shown


def test_block_paths_show_the_values_each_numeric_part_takes():
    from auditor._display._report import _block_path, combine_blocks

    assert _block_path(["stage3.1.branch2.0", "stage3.2.branch2.0", "stage3.3.branch2.0"]) == "stage3.1–3.branch2.0"
    assert _block_path(["features.3", "features.7", "features.8"]) == "features.3,7–8"
    # every combination a name shows is a module; where not, a later varying index is "*" (issue 29:
    # "features.1,4–11.block.1–2.avgpool" suggested features.4.block.1.avgpool, which does not exist)
    assert _block_path(["f.1.b.1.p", "f.1.b.2.p", "f.2.b.1.p", "f.2.b.2.p"]) == "f.1–2.b.1–2.p"
    assert _block_path(["f.1.b.1.p", "f.4.b.2.p", "f.5.b.2.p"]) == "f.1,4–5.b.*.p"
    hot = pd.DataFrame({"phase": "forward", "module": ["stage2.1", "stage3.1", "stage3.2", "stage3.2"],
                        "op": "aten.cat.default", "kind": "converts", "source": ["f.py:1", "f.py:1", "f.py:1", "f.py:2"],
                        "cause": 1, "from_format": "a", "to_format": "b", "count": 1, "bytes": [4, 3, 2, 1]})
    rows = combine_blocks(hot)  # a name's digits are no index; another line stays apart
    assert list(rows["module"]) == ["stage3.1–2", "stage2.1", "stage3.2"] and list(rows["groups"]) == [2, 1, 1]


def test_the_verification_html_shows_units_and_leads_with_the_measured_saving():
    """Issue 29: the fixes HTML showed raw microseconds ("26082.750500"): two columns shared the
    heading "after", so one's format was lost. Every time has its unit; headings are unique."""
    import re

    from auditor._display._fixes import verification_html
    from auditor._display._html import table_html

    row = {"kind": "fix", "fix": 1, "pattern": "p", "source": "", "applied": True, "hotspots_before": 3,
           "hotspots_after": 0, "same_outputs": True, "step_us_before": 26082.7505, "step_us_after": 24000.25,
           "saving_us": 2082.5, "saving_low_us": 1000.0, "saving_high_us": 3000.0, "ratio": 0.92, "ratio_low": 0.88,
           "ratio_high": 0.96, "rounds": 7, "estimated_us": 1931.5, "verdict": "helps", "reason": ""}
    page = verification_html(pd.DataFrame([row]))
    assert not re.findall(r">\s*-?\d+\.\d{3,}\s*<", page)
    assert "26.08 ms" in page or "26.1 ms" in page
    assert page.index("saving, measured") < page.index("saving, estimated")
    with pytest.raises(ValueError, match="same heading"):
        table_html(pd.DataFrame({"a": [1], "b": [2]}), columns={"a": "x", "b": "x"})
    assert "anywhere" not in page  # words wrap whole, never cut mid-word
    together = verification_html(pd.DataFrame([row, {**row, "kind": "all", "fix": 0, "pattern": "", "source": ""}]))
    assert re.search(r">all</td>\s*<td[^>]*>-</td>", together)  # all fixes together are no fix 0


def test_the_verification_text_says_all_together_only_for_more_than_one_fix():
    """Issue 41: with one fix, "all together" repeated it (the same fix made and timed again)."""
    from auditor._display._fixes import verification_text

    row = {"kind": "fix", "fix": 1, "pattern": "p", "source": "", "applied": True, "hotspots_before": 3,
           "hotspots_after": 0, "same_outputs": True, "max_rel_diff": 0.0, "step_us_before": 26082.7505,
           "step_us_after": 24000.25, "saving_us": 2082.5, "saving_low_us": 1000.0, "saving_high_us": 3000.0,
           "ratio": 0.92, "ratio_low": 0.88, "ratio_high": 0.96, "rounds": 7, "estimated_us": 1931.5,
           "verdict": "helps", "reason": ""}
    together = {**row, "kind": "all", "fix": 0, "pattern": "", "source": ""}
    one = verification_text(pd.DataFrame([row, together]))
    assert "fix 1" in one and "all together" not in one and one.count("verdict: helps") == 1
    two = verification_text(pd.DataFrame([row, {**row, "fix": 2}, together]))
    assert "all together" in two and two.count("verdict: helps") == 3


def test_conversions_only_the_compiled_step_makes_are_not_listed_as_eager_causes():
    """Issue 29: rows marked "only compiled" sat under "Eager causes under the compiler"."""
    from auditor._display._compiled import compiled_html, compiled_text

    graphs = pd.DataFrame({"graph": [0], "phase": ["forward"], "layout_opt": [True], "kernels": [3],
                           "conversions": [1], "time_us": [10.0], "layout_opt_reason": [""], "output_code": [""]})
    conv = pd.DataFrame(columns=["phase", "kernel", "from_format", "to_format", "bytes", "time_us", "source", "reason",
                                 "weight", "note"])
    compared = pd.DataFrame({"cause": [1, float("nan")], "phase": ["forward", "forward"], "pattern": ["p", ""],
                             "source": ["a.py:1", ""], "status": ["removed by the compiler", "only compiled"],
                             "kernel": ["", "triton_poi_0"]})
    text = compiled_text(graphs, conv, compared)
    eager, only = text.split("Conversions only the compiled step makes (no eager cause):")
    assert "only compiled" not in eager.split("Eager causes under the compiler:")[1] and "only compiled" in only
    page = compiled_html(graphs, conv, compared)
    assert page.index("Eager causes under the compiler") < page.index("Conversions only the compiled step makes")
    # counts take their noun's number: "1 graph, 0 conversion kernels", not "1 graphs" (seen in Chromium)
    assert "1 graph, 0 conversion kernels" in text and "1 conversion only the compiled step makes" in text


def test_a_long_dotted_name_may_wrap_at_its_dots_and_nothing_else_is_cut():
    """A fix's "use torch.nn.functional.channel_shuffle(x, groups)" ran off a 1400 px page: a
    long dotted name gets break points after its dots; short ones and numbers are left whole."""
    from auditor._display._html import _break_paths

    out = _break_paths("use torch.nn.functional.channel_shuffle(x, groups) in 1.25 ms (Fixes.patch() here)")
    assert "torch.<wbr>nn.<wbr>functional.<wbr>channel_shuffle(x," in out
    assert "1.25 ms" in out and "(Fixes.patch()" in out


def test_text_wraps_never_between_a_number_and_its_unit():
    """Issue 41: "[4.0 / ms, 14.9 ms]", "saving 804.3 µs [34.0 / µs, 1.8 ms]": the report's
    long lines broke between a number and its unit. At every width, each line ends and starts
    with whole quantities, and the words are the same as unwrapped."""
    from auditor._display._text import NBSP, join_units, wrap

    text = ("measured: 7.2% faster: after / before 0.928 [0.911, 0.950] over 21 paired rounds, saving 804.3 µs "
            "[34.0 µs, 1.8 ms]; estimated 1.2 ms of 0 B, 28.4 MB and 3 sets over 2 seconds")
    for width in range(12, len(text)):
        lines = wrap(text, width)
        assert " ".join(lines).split() == text.split()
        for line in lines:
            assert not re.match(r"(µs|ms|B|MB)\b", line), (width, lines)  # a unit never starts a line
            assert NBSP not in line
    joined = join_units(text)
    assert f"804.3{NBSP}µs" in joined and f"0{NBSP}B" in joined and "3 sets" in joined and "2 seconds" in joined
    assert wrap(text, None) == [text]  # HTML: one paragraph, the browser flows it


def test_html_header_flows_and_keeps_numbers_with_their_units(audit):
    """The HTML's head is the report's head unwrapped (the text wraps at 114 characters; a table
    cell or a notebook does not), each number joined to its unit by a non-breaking space."""
    out = audit._repr_html_()
    head = out[:out.index("<table")]
    assert "\u00a0kB" in head and not re.search(r"\d kB", head)


def test_a_styled_table_exports_as_shown_short_paths_and_units_in_the_headings():
    """Issue 41: ``causes()`` written with pandas carried absolute paths and raw µs under
    ``time_us``. ``styled(frame).to_csv()`` writes the table as the report shows it: each source
    relative to its package, numbers kept numbers with their unit in the heading; the frame
    itself is unchanged."""
    import io

    lib = os.path.join(sysconfig.get_paths()["purelib"], "torchvision", "models", "resnet.py")
    frame = pd.DataFrame({"cause": [1], "source": [f"{lib}:150"], "bytes": [802800], "time_us": [404.7],
                          "saving_low_us": [1.5], "share": [0.25]})
    shown = auditor.styled(frame)
    back = pd.read_csv(io.StringIO(shown.to_csv()))
    assert list(back.columns) == ["cause", "source", "bytes (B)", "time (µs)", "saving_low (µs)", "share (%)"]
    assert back["source"][0] == f"{os.path.join('torchvision', 'models', 'resnet.py')}:150"
    assert back["time (µs)"][0] == 404.7 and back["bytes (B)"][0] == 802800 and back["share (%)"][0] == 25.0
    renamed = auditor.styled(frame, columns={"source": "file:line", "time_us": "time"}).table()
    assert list(renamed.columns) == ["file:line", "time (µs)"]
    assert frame["source"][0] == f"{lib}:150"  # the DataFrame keeps the recorded path


def test_a_fix_without_a_line_names_its_module_once_not_where_a_line_goes():
    """Issue 41: "swap module: 1  (1, Softmax)" put the module's name where the source line goes."""
    from auditor._display._fixes import fixes_text

    row = {"fix": 1, "action": "swap module", "source": "", "module": "1", "module_type": "Softmax", "bytes": 81900,
           "hotspots": 5, "line": "", "suggestion": "model[1] = auditor.keep_format(model[1])", "detail": "why",
           "reason": "", "forward_bytes": 32800, "backward_bytes": 49100}
    text = fixes_text(pd.DataFrame([row]), 5)
    assert "1. swap module 1 (Softmax)  saves 81.9 kB (5 hotspot groups)" in text
    at_line = fixes_text(pd.DataFrame([{**row, "source": "/x/a.py:7"}]), 5)
    assert "1. swap module: /x/a.py:7  (1, Softmax)  saves" in at_line


def test_a_single_trunk_report_goes_deeper_and_says_how_many_modules_it_left_off():
    """Issue 41: a model whose body is one child (``features``) got one module row of 100% at
    depth 1, and the text left off modules past the fifth without a word (the HTML says "... and
    N more"). The default depth is the first that splits the hotspots; a depth given is kept."""

    class Trunk(nn.Module):
        def __init__(self):
            super().__init__()
            self.features = nn.Sequential(*[nn.Sequential(nn.Conv2d(4, 4, 3, padding=1), nn.Softmax(dim=1))
                                            for _ in range(7)], nn.Conv2d(4, 4, 3, padding=1))

        def forward(self, x):
            return self.features(x)

    cl = torch.channels_last
    a = auditor.audit(Trunk().to(memory_format=cl), torch.randn(1, 4, 8, 8).to(memory_format=cl), record_time=False)
    text = a.report()
    modules = text[text.index("Modules with most hotspot"):]
    assert "(depth 2;" in modules and "features.3" in modules and "100.0%" not in modules
    more = len(a.summary(2).query("hotspots > 0")) - 5
    assert more > 0 and f"... and {more} more (Audit.summary(2))" in modules
    assert f"... and {more} more (Audit.summary(2))" in a.html()
    assert "(depth 1;" in a.report(depth=1) and "100.0%" in a.report(depth=1)


def test_a_plans_html_names_its_columns_as_its_text_does_and_writes_ratios_to_three_places():
    """Issue 41: the plan's HTML headed ``predicted_us`` over values in ms, ratios to 6 places."""
    from auditor._display._plans import plan_html

    candidates = pd.DataFrame({"candidate": ["all contiguous", "all channels_last"], "predicted_us": [2000.0, 1500.0],
                               "measured_us": [2100.0, 1400.0], "spread": [0.01, 0.02], "vs": ["", "all contiguous"],
                               "ratio": [float("nan"), 0.6666667], "ratio_low": [float("nan"), 0.6512345],
                               "ratio_high": [float("nan"), 0.6801234], "repeats": [7, 7], "within_noise": [False, False],
                               "chosen": [False, True]})
    decisions = pd.DataFrame({"convolutions": ["a"], "format": ["channels_last"], "ratio": [0.81234567]})
    out = plan_html(headline="Layout plan", candidates=candidates, notes=[], decisions=decisions)
    assert "predicted_us" not in out and ">predicted<" in out and ">within noise<" in out
    assert ">0.667<" in out and ">0.651<" in out and ">0.812<" in out and not re.search(r"\d\.\d{4,}", out)
    assert ">2.0 ms<" in out or ">2 ms<" in out


def test_counts_take_their_nouns_number_and_module_names_are_never_cut():
    """Issue 41: "1 more rows", "in 1 regions", and merged module names cut from the left
    ("….1,4–11.block.*.avgpool"), which named no module."""
    from auditor._display._plans import plan_headline
    from auditor._display._report import SYMPTOM_COLUMNS, more_rows
    from auditor._display._text import text_table

    assert more_rows(pd.DataFrame({"groups": [3]}), "hotspot groups") == "1 more row (3 hotspot groups)"
    assert more_rows(pd.DataFrame({"groups": [3, 1]}), "hotspot groups") == "2 more rows (4 hotspot groups)"
    head = plan_headline(backward=True, device="cpu", clock="process", margin=0.02, formats={"a": "channels_last"},
                         regions=1, input_conversions=0)
    assert " in 1 region;" in head
    long = "features.1,4–11.block.1–2.avgpool.inner"
    rows = pd.DataFrame({"phase": ["forward"], "module": [long], "op": ["aten.mean.dim"], "kind": ["loses"],
                         "count": [2], "bytes": [100]})
    assert long in text_table(rows, SYMPTOM_COLUMNS, header=False)[0]
