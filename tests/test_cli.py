"""format-audit: files written, progress shown, every exit status, every flag's checks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
from chromium_fit import needs_chromium, overflows
from fault_models import CLI_FACTORIES as FACTORY
from matplotlib.image import imread

import auditor
import auditor.plot
from auditor import cli
from auditor._fix._suggest import VERIFY_COLUMNS
from auditor.cli import main
from format_auditor_cli import build_parser
from tests.kernels import needs_fake_cuda, needs_inductor


@pytest.fixture
def models_file(tmp_path):
    path = tmp_path / "models.py"
    path.write_text(FACTORY)
    return path


def test_writes_every_file_and_prints_the_report(models_file, tmp_path, capsys):
    out = tmp_path / "out"
    code = main([f"{models_file}:small", "--input", "2,3,16,16", "--out", str(out)])
    assert code == 0
    printed = capsys.readouterr()
    assert "aten._softmax.default" in printed.out and "loses" in printed.out
    assert str(out / "events.csv") in printed.out
    assert "recording" in printed.err or "done" in printed.err  # progress on stderr
    names = sorted(p.name for p in out.iterdir())
    assert names == ["causes.csv", "coverage.csv", "events.csv", "heatmap.png", "hotspots.csv", "report.txt",
                     "summary.csv", "timeline.png"]
    a = auditor.Audit.read_csv(out / "events.csv")
    assert len(a.hotspots()) == 5
    for png in ("heatmap.png", "timeline.png"):
        img = imread(out / png)
        assert img.shape[0] > 150 and (img[..., :3] < 0.97).any(axis=-1).mean() > 0.03
    assert "aten._softmax.default" in (out / "report.txt").read_text()


def test_a_model_files_sequential_gets_no_source_line_of_the_command_lines(models_file, tmp_path):
    """An nn.Sequential built in a model file runs only torch's code: its ops have no line of
    the user's, and the frames above the auditor (the command line's script, or this test) are
    not named as theirs (format_auditor_cli.py:224 was)."""
    out = tmp_path / "out"
    assert main([f"{models_file}:small", "--input", "2,3,16,16", "--out", str(out), "--record-source"]) == 0
    sources = set(pd.read_csv(out / "events.csv", keep_default_na=False)["source"])
    assert not [s for s in sources if "format_auditor_cli" in s or "test_cli" in s or "auditor" in s], sources


def test_several_models_get_a_directory_each(models_file, tmp_path, capsys):
    out = tmp_path / "out"
    assert main([f"{models_file}:small", f"{models_file}:clean", "--input", "1,3,8,8", "--out", str(out), "--no-backward"]) == 0
    assert (out / "small" / "events.csv").exists() and (out / "clean" / "hotspots.csv").exists()
    err = capsys.readouterr().err
    assert "2/2" in err or "6/6" in err


@pytest.mark.parametrize(
    "args, message",
    [
        (["torchvision:not_a_model"], "unknown torchvision model 'not_a_model'"),
        (["{f}:missing"], "has no factory 'missing'"),
        (["{f}:NOT_A_FACTORY"], "has no factory 'NOT_A_FACTORY'"),
        (["{f}:broken"], "raised RuntimeError: no weights here"),
        (["nowhere/file.py:make"], "no such file"),
        (["no_such_package_xyz.mod:make"], "cannot import"),
        (["resnet50"], "MODEL must look like"),
        (["{f}:small", "--input", "1,3,x,8"], "--input must be"),
        (["{f}:small", "--input", "1,3,0,8"], "--input must be"),
        (["{f}:small", "--format", "nhwc"], "unknown --format 'nhwc'"),
        (["{f}:small", "--dtype", "float128"], "unknown --dtype 'float128'"),
        (["{f}:small", "--input", "1,3,8"], "needs a 4-D --input"),
        (["{f}:small", "--depth", "0"], "--depth must be at least 1"),
        (["{f}:small", "--input", "1,5,8,8"], "failed on input 1,5,8,8"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(models_file, capsys, args, message):
    argv = [a.format(f=models_file) for a in args]
    assert main(argv) == 2
    err = capsys.readouterr().err
    last = [line for line in err.splitlines() if line.strip()][-1]
    assert last.startswith("format-audit: error: ") and message in last
    assert "Traceback" not in err


@needs_fake_cuda
def test_fake_audit_for_cuda_without_a_gpu(models_file, tmp_path, capsys):
    out = tmp_path / "out"
    argv = [f"{models_file}:small", "--input", "64,3,16,16", "--fake", "--device", "cuda", "--dtype", "float16", "--out", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "float16 channels_last fake cuda" in printed and "aten._softmax.default" in printed
    a = auditor.Audit.read_csv(out / "events.csv")
    assert set(a.tensors["device"].astype(str)) == {"cuda:0"}
    assert "float16" in set(a.tensors["dtype"].astype(str))


@pytest.mark.parametrize(
    "args, message",
    [
        (["--device", "nowhere"], "unknown --device 'nowhere'"),
        pytest.param(["--device", "cuda"], "add --fake", marks=pytest.mark.skipif(
            __import__("torch").cuda.is_available(), reason="this machine has a GPU")),
    ],
)
def test_bad_device(models_file, capsys, args, message):
    assert main([f"{models_file}:small", "--input", "1,3,8,8", *args]) == 2
    assert message in capsys.readouterr().err


def test_unwritable_out(models_file, tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main([f"{models_file}:small", "--input", "1,3,8,8", "--out", str(blocker / "sub")]) == 2
    assert "cannot write there" in capsys.readouterr().err


def test_python_dash_m_and_usage_errors_from_argparse(models_file, tmp_path):
    run = subprocess.run(
        [sys.executable, "-m", "auditor", f"{models_file}:clean", "--input", "1,3,8,8", "--no-backward"],
        capture_output=True, text=True, timeout=300,
    )
    assert run.returncode == 0 and "channels_last propagates" in run.stdout
    run = subprocess.run([sys.executable, "-m", "auditor"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 2 and "Traceback" not in run.stderr and "usage:" in run.stderr
    run = subprocess.run([sys.executable, "-m", "auditor", "torchvision:nope"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 2 and run.stderr.strip().splitlines()[-1] == "format-audit: error: unknown torchvision model 'nope'"


def _last_line(err: str) -> str:
    return [line for line in err.splitlines() if line.strip()][-1]


# ---- exit statuses ----------------------------------------------------------------------------


def test_exit_0_when_the_audit_ran(models_file, capsys):
    assert main([f"{models_file}:small", "--input", "1,3,8,8"]) == 0
    assert "format-audit:" not in capsys.readouterr().err


def test_exit_1_strict_stops_at_the_first_loss_in_one_line(models_file, capsys):
    assert main([f"{models_file}:small", "--input", "1,3,8,8", "--strict"]) == 1
    err = capsys.readouterr().err
    last = _last_line(err)
    assert last.startswith(f"format-audit: {models_file}:small: aten._softmax.default lost channels_last")
    assert "Inputs: self: shape (1, 8, 8, 8)" in last and "Traceback" not in err
    assert main([f"{models_file}:clean", "--input", "1,3,8,8", "--strict"]) == 0


@pytest.mark.parametrize(
    "factory, message",
    [
        ("key_error", "key_error failed on input 1,3,8,8 float32: KeyError: 'x'"),
        ("assertion", "assertion failed on input 1,3,8,8 float32: AssertionError: wants 4 channels"),
    ],
)
def test_exit_2_any_exception_in_the_users_forward(models_file, capsys, factory, message):
    assert main([f"{models_file}:{factory}", "--input", "1,3,8,8"]) == 2
    err = capsys.readouterr().err
    assert _last_line(err) == f"format-audit: error: {models_file}:{message}"
    assert "Traceback" not in err


def test_exit_2_a_batch_too_large_to_allocate(models_file, capsys):
    # within every --input limit, but 2**62 float32 elements overflow the storage size in torch
    assert main([f"{models_file}:small", "--input", "1073741824,1073741824,4,1"]) == 2
    last = _last_line(capsys.readouterr().err)
    assert last.startswith(f"format-audit: error: {models_file}:small failed on input 1073741824,1073741824,4,1 float32: RuntimeError: ")


def test_exit_2_with_traceback_prints_the_users_frame_too(models_file, capsys):
    assert main([f"{models_file}:key_error", "--input", "1,3,8,8", "--traceback"]) == 2
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and 'return {"y": x}["x"]' in err
    assert _last_line(err).startswith("format-audit: error: ") and _last_line(err).endswith("KeyError: 'x'")


def test_a_later_models_failure_still_prints_the_earlier_reports(models_file, capsys):
    assert main([f"{models_file}:small", f"{models_file}:key_error", "--input", "1,3,8,8"]) == 2
    printed = capsys.readouterr()
    assert f"== {models_file}:small" in printed.out and "aten._softmax.default" in printed.out
    assert "KeyError: 'x'" in _last_line(printed.err)


def _raise(exc):
    def raiser(*args, **kwargs):
        raise exc

    return raiser


@pytest.mark.parametrize(
    "target, name, extra, what",
    [
        (auditor.Audit, "report", [], "analysing {f}:small: KeyError: 'column'"),
        (auditor, "suggest_fixes", ["--fix"], "analysing {f}:small: KeyError: 'column'"),
        (auditor.plot, "heatmap", ["--out", "{out}"], "writing the files of {f}:small: KeyError: 'column'"),
        (auditor.cli, "default_input", [], "KeyError: 'column'"),  # a bug in the CLI itself
    ],
)
def test_exit_3_an_internal_error_after_the_model_ran(models_file, tmp_path, capsys, monkeypatch, target, name, extra, what):
    monkeypatch.setattr(target, name, _raise(KeyError("column")))
    argv = [f"{models_file}:small", *(a.format(out=tmp_path / "out") for a in extra)]
    if name != "default_input":
        argv += ["--input", "1,3,8,8"]
    assert main(argv) == 3
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines[-2] == "format-audit: internal error: " + what.format(f=models_file)
    assert lines[-1] == "this is a bug in format-audit; please report it with the command line and --traceback output"
    assert "Traceback" not in err


def test_exit_3_with_traceback_shows_where_it_broke(models_file, capsys, monkeypatch):
    def broken_report(self, top=10, depth=1):
        raise ValueError("analysis bug")

    monkeypatch.setattr(auditor.Audit, "report", broken_report)
    assert main([f"{models_file}:small", "--input", "1,3,8,8", "--traceback"]) == 3
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "in broken_report" in err
    assert "format-audit: internal error: analysing" in err


def test_an_oserror_while_writing_is_the_out_folders_exit_2(models_file, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(auditor.Audit, "to_csv", _raise(PermissionError(13, "Permission denied")))
    out = tmp_path / "out"
    assert main([f"{models_file}:small", "--input", "1,3,8,8", "--out", str(out)]) == 2
    assert _last_line(capsys.readouterr().err) == f"format-audit: error: --out {out}: cannot write events.csv (Permission denied)"


def test_exit_130_when_interrupted(models_file, capsys, monkeypatch):
    monkeypatch.setattr(auditor, "audit", _raise(KeyboardInterrupt()))
    assert main([f"{models_file}:small", "--input", "1,3,8,8"]) == 130
    err = capsys.readouterr().err
    assert _last_line(err).startswith("format-audit: interrupted before the step was recorded")
    assert "Traceback" not in err


def test_ctrl_c_while_verifying_writes_what_is_finished_and_says_what_is_missing(models_file, tmp_path, capsys,
                                                                                 monkeypatch):
    """Ctrl-C during --verify: the recording, the analysis and the fixes are written, the report
    printed, the verification named as missing, status 130, no traceback."""
    monkeypatch.setattr(auditor.Fixes, "verify", _raise(KeyboardInterrupt()))
    out = tmp_path / "out"
    status = main([f"{models_file}:small", "--input", "1,3,8,8", "--fix", "--verify", "--out", str(out),
                   "--no-progress"])
    assert status == 130
    captured = capsys.readouterr()
    last = _last_line(captured.err)
    assert last.startswith("format-audit: interrupted while verifying fixes") and "missing: the verification" in last
    assert "Traceback" not in captured.err and "Format audit:" in captured.out
    for name in ("events.csv", "causes.csv", "report.txt", "fixes.txt", "fixes.patch"):
        assert (out / name).exists(), name
    assert not (out / "verify.csv").exists()


def test_ctrl_c_while_importing_torch_exits_130_without_a_traceback():
    """The first seconds: Ctrl-C while format-audit imports torch is one line and status 130."""
    code = ("import builtins, sys, format_auditor_cli as f\n"
            "real = builtins.__import__\n"
            "def imp(name, *a, **k):\n"
            "    if name == 'auditor.cli': raise KeyboardInterrupt\n"
            "    return real(name, *a, **k)\n"
            "builtins.__import__ = imp\n"
            "sys.exit(f.main(['torchvision:resnet18']))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parent.parent)
    assert done.returncode == 130 and "Traceback" not in done.stderr
    assert done.stderr.strip() == "format-audit: interrupted while starting (importing torch): nothing was audited"


def test_threads_sets_torchs_count_and_html_writes_the_report(models_file, tmp_path, monkeypatch):
    """--threads N sets torch's intra-op threads for the run (the timed step stays at one);
    --html writes report.html, a page with the report's tables; --html without --out is refused."""
    monkeypatch.setattr(torch, "set_num_threads", torch.set_num_threads)  # restored after the test
    before = torch.get_num_threads()
    out = tmp_path / "out"
    try:
        assert main([f"{models_file}:small", "--input", "1,3,8,8", "--threads", "1", "--html", "--out", str(out),
                     "--no-progress"]) == 0
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    page = (out / "report.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and "Format audit:" in page and "<table" in page
    assert main([f"{models_file}:small", "--html"]) == 2


@pytest.mark.slow
def test_report_html_tables_fit_1400_px_in_chromium(tmp_path, monkeypatch):
    """report.html of a model whose cause sits in a library's file (a long file:line), with its
    fixes and their verification, fits a 1400 px window in headless Chromium (issue 29)."""
    browser = needs_chromium()
    real = auditor.Fixes.verify
    monkeypatch.setattr(auditor.Fixes, "verify",  # a short verification: its table is what is laid out
                        lambda self, *a, **k: real(self, *a, **{**k, "rounds": 4, "max_rounds": 4, "budget_s": 5}))
    out = tmp_path / "out"
    assert main(["torchvision:shufflenet_v2_x0_5", "--input", "2,3,32,32", "--html", "--fix", "--verify",
                 "--out", str(out), "--no-progress"]) == 0
    shots = os.environ.get("AUDITOR_SHOTS")  # a folder: a screenshot of the page, to look at
    result = overflows((out / "report.html").read_text(), tmp_path, "report", browser,
                       screenshot=Path(shots) / "cli_report.png" if shots else None)
    assert result["tables"] >= 4 and result["width"] == 1400
    assert result["bad"] == []


def test_help_says_what_top_limits_and_offers_threads_and_html():
    text = " ".join(build_parser().format_help().split())
    assert "causes shown in the report" in text and "--threads N" in text and "--html" in text


def test_torchvision_builders_get_random_weights_offline():
    """Every builder is called with weights=None, and with weights_backbone=None where it takes it
    (lraspp_mobilenet_v3_large would otherwise download its backbone)."""
    import torchvision

    for name in torchvision.models.list_models():
        kwargs = cli.random_weights(torchvision.models.get_model_builder(name))
        assert kwargs["weights"] is None and kwargs.get("weights_backbone", None) is None
    lraspp = torchvision.models.get_model_builder("lraspp_mobilenet_v3_large")
    assert cli.random_weights(lraspp) == {"weights": None, "weights_backbone": None}


# ---- flags ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, message",
    [
        (["--top", "0"], "--top must be at least 1, got 0"),
        (["--top", "-3"], "--top must be at least 1, got -3"),
        (["--top", "ten"], "--top must be an integer, got 'ten'"),
        (["--depth", "-1"], "--depth must be at least 1, got -1"),
        (["--depth", "1.5"], "--depth must be an integer, got '1.5'"),
        (["--input", ""], "--input must be comma-separated positive integers like 1,3,224,224, got ''"),
        (["--input="], "--input must be comma-separated positive integers like 1,3,224,224, got ''"),
        (["--input", "1,-3,8,8"], "--input must be comma-separated positive integers"),
        (["--input", "1,3,,8"], "--input must be comma-separated positive integers"),
        (["--input", "99999999999999999999,3,8,8"], "--input dimension 99999999999999999999 is too large: each must be below 2**31"),
        (["--input", "2147483648,3,8,8"], "--input dimension 2147483648 is too large"),
        (["--input", "2147483647,2147483647,2147483647,3"], "more elements than a tensor can index"),
    ],
)
def test_every_range_check_is_one_line_and_exit_2(models_file, capsys, args, message):
    assert main([f"{models_file}:small", *args]) == 2
    err = capsys.readouterr().err
    assert _last_line(err).startswith("format-audit: error: ") and message in _last_line(err)
    assert "recording" not in err  # refused before any model is built


def test_the_largest_dimension_and_element_count_pass():
    from format_auditor_cli import parse_input

    assert parse_input("2147483647,1,1,1") == (2147483647, 1, 1, 1)
    assert parse_input("2147483647,2147483647,2,1") == (2147483647, 2147483647, 2, 1)


@pytest.mark.parametrize("args", [["--top"], ["--bogus"], []])
def test_malformed_command_lines_show_the_usage_and_exit_2(models_file, capsys, args):
    argv = [f"{models_file}:small", *args] if args else []
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "usage: format-audit" in err and _last_line(err).startswith("format-audit: error: ")


def test_version(capsys):
    assert main(["--version"]) == 0
    # the installed distributions' versions: read without importing torch
    torch_release = torch.__version__.split("+")[0]
    assert capsys.readouterr().out == f"format-audit {auditor.__version__} (torch {torch_release})\n"


def test_help_lists_choices_defaults_and_exit_statuses(capsys):
    assert main(["--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines at the terminal width
    assert "{channels_last,channels_last_3d,contiguous}" in text
    assert "{float32,float64,float16,bfloat16}" in text
    for default in ("(default: channels_last)", "(default: float32)", "(default: 10)", "(default: 1 "):
        assert default in text
    assert "exit status:" in text
    for status in ("0 ", "1 a finding", "2 the model", "3 format-audit itself", "130 interrupted"):
        assert status in text


def test_the_command_line_page_names_every_flag_and_status():
    section = (Path(__file__).resolve().parent.parent / "docs" / "guides" / "cli.md").read_text()
    for action in build_parser()._actions:
        for flag in action.option_strings:
            if flag.startswith("--"):
                assert flag in section, f"docs/guides/cli.md does not name {flag}"
    for status in (0, 1, 2, 3, 130):
        assert f"| {status} |" in section


def test_record_time_and_record_source_reach_the_audit(models_file, capsys, monkeypatch):
    calls = []
    real_audit = auditor.audit

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return real_audit(*args, **kwargs)

    monkeypatch.setattr(auditor, "audit", spy)
    assert main([f"{models_file}:small", "--input", "1,3,8,8", "--record-time", "--record-source"]) == 0
    assert calls[-1]["record_time"] is True and calls[-1]["record_source"] is True
    assert main([f"{models_file}:small", "--input", "1,3,8,8", "--fix"]) == 0
    assert calls[-1]["record_source"] is True  # a fix names the line to change
    assert calls[-1]["record_time"] is True  # on by default
    assert main([f"{models_file}:small", "--input", "1,3,8,8", "--no-record-time"]) == 0
    assert calls[-1]["record_time"] is False
    assert main([f"{models_file}:small", "--input", "1,3,8,8", "--fake"]) == 0
    assert calls[-1]["record_time"] is False and calls[-1]["fake"] is True  # fakes have no times
    n = len(calls)
    assert main([f"{models_file}:small", "--input", "1,3,8,8", "--record-time", "--fake"]) == 2
    assert len(calls) == n and "fake audit has no times" in capsys.readouterr().err


def test_record_time_times_every_op(models_file, tmp_path, capsys, monkeypatch):
    audits = []
    real_audit = auditor.audit
    monkeypatch.setattr(auditor, "audit", lambda *a, **k: audits.append(real_audit(*a, **k)) or audits[-1])
    assert main([f"{models_file}:small", "--input", "1,3,8,8"]) == 0
    assert audits[0].events["duration_us"].notna().all() and audits[0].events["time_us"].notna().all()


def test_fix_prints_and_writes_the_suggested_fixes(models_file, tmp_path, capsys):
    out = tmp_path / "out"
    assert main([f"{models_file}:small", "--input", "1,3,8,8", "--fix", "--trace", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    fixes = (out / "fixes.txt").read_text()
    assert "auditor.keep_format(" in fixes and fixes.strip() in printed
    assert printed.index("Hotspots:") < printed.index(fixes.strip())  # after the report
    written = sorted(p.name for p in out.iterdir())
    # every file but those of --verify and --compile (--force checks them all)
    assert written == sorted(set(cli.OUTPUT_FILES) - {"verify.csv", "conversions.csv", "graphs.csv", "compiled.csv", "report.html"})
    assert "fixes.txt" not in (out / "report.txt").read_text()


def test_verify_proves_each_fix_and_writes_its_table(models_file, tmp_path, capsys):
    out = tmp_path / "out"
    assert main([f"{models_file}:small", "--input", "1,3,8,8", "--fix", "--verify", "--out", str(out)]) == 0
    printed = capsys.readouterr()
    assert "verifying fixes" in printed.err
    table = pd.read_csv(out / "verify.csv")
    assert set(VERIFY_COLUMNS) <= set(table.columns)
    row = table[table["kind"] == "fix"].iloc[0]
    assert row["applied"] and row["same_outputs"] and row["hotspots_before"] > 0 and row["hotspots_after"] == 0
    assert "measured: " in printed.out  # the report leads with the measured saving


@pytest.mark.parametrize("args, message", [
    (["--verify"], "--verify proves the suggested fixes: give --fix too"),
    (["--fix", "--verify", "--fake"], "--verify runs the fixes for real"),
    (["--warmup", "-1"], "--warmup must be at least 0"),
])
def test_verify_and_warmup_usage_errors(models_file, capsys, args, message):
    assert main([f"{models_file}:small", "--input", "1,3,8,8", *args]) == 2
    assert message in _last_line(capsys.readouterr().err)


# ---- output folders ---------------------------------------------------------------------------


def test_an_existing_audit_is_refused_without_force(models_file, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "report.txt").write_text("an earlier audit\n")
    (out / "fixes.txt").write_text("its fixes\n")
    (out / "notes.md").write_text("not ours\n")
    assert main([f"{models_file}:small", "--input", "1,3,8,8", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert _last_line(err) == (f"format-audit: error: --out {out} already holds an audit (report.txt, fixes.txt); "
                               "add --force to overwrite it")
    assert "recording" not in err and (out / "report.txt").read_text() == "an earlier audit\n"
    assert main([f"{models_file}:small", "--input", "1,3,8,8", "--out", str(out), "--force"]) == 0
    assert "aten._softmax.default" in (out / "report.txt").read_text()
    assert not (out / "fixes.txt").exists()  # the earlier audit's, not this one's
    assert (out / "notes.md").read_text() == "not ours\n"


def test_a_folder_that_holds_only_other_files_is_fine(models_file, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.md").write_text("")
    assert main([f"{models_file}:clean", "--input", "1,3,8,8", "--out", str(out), "--no-backward"]) == 0


def test_several_models_refuse_an_existing_audit_in_any_folder(models_file, tmp_path, capsys):
    out = tmp_path / "out"
    (out / "clean").mkdir(parents=True)
    (out / "clean" / "events.csv").write_text("")
    argv = [f"{models_file}:small", f"{models_file}:clean", "--input", "1,3,8,8", "--out", str(out)]
    assert main(argv) == 2
    assert f"--out {out / 'clean'} already holds an audit (events.csv)" in capsys.readouterr().err
    assert not (out / "small").exists()  # refused before anything was written


def test_models_with_the_same_name_get_distinct_folders(models_file, tmp_path, capsys):
    other = tmp_path / "other" / "models.py"
    other.parent.mkdir()
    other.write_text(FACTORY)
    out = tmp_path / "out"
    argv = [f"{models_file}:small", f"{models_file}:small", f"{other}:small", "--input", "1,3,8,8",
            "--no-backward", "--out", str(out)]
    assert main(argv) == 0
    assert sorted(p.name for p in out.iterdir()) == ["small", "small-2", "small-3"]
    for folder in ("small", "small-2", "small-3"):
        assert (out / folder / "events.csv").exists()
    printed = capsys.readouterr().out
    assert str(out / "small-3" / "events.csv") in printed


def test_folder_names_never_collide():
    assert cli.folder_names(["a.py:make", "b.py:make"]) == ["make", "make-2"]
    assert cli.folder_names(["x:foo-2", "y:foo", "z:foo"]) == ["foo-2", "foo", "foo-3"]
    assert cli.folder_names(["torchvision:resnet18"] * 3) == ["resnet18", "resnet18-2", "resnet18-3"]


# ---- model specs ------------------------------------------------------------------------------


def test_timm_model(capsys):
    pytest.importorskip("timm")
    assert main(["timm:efficientnet_b0", "--input", "2,3,32,32", "--no-backward", "--top", "1"]) == 0
    printed = capsys.readouterr().out
    assert "== timm:efficientnet_b0  input 2x3x32x32" in printed and "Format audit:" in printed


def test_timm_unknown_model(capsys):
    pytest.importorskip("timm")
    assert main(["timm:no_such_net"]) == 2
    assert _last_line(capsys.readouterr().err) == "format-audit: error: timm has no model 'no_such_net'"


def test_timm_not_installed(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "timm", None)  # `import timm` raises ImportError
    assert main(["timm:efficientnet_b0"]) == 2
    last = _last_line(capsys.readouterr().err)
    assert last == "format-audit: error: timm:efficientnet_b0 needs timm, which is not installed (pip install timm)"


def test_package_module_factory(models_file, capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(models_file.parent))
    monkeypatch.delitem(sys.modules, "models", raising=False)
    assert main(["models:clean", "--input", "1,3,8,8", "--no-backward"]) == 0
    assert "== models:clean" in capsys.readouterr().out


def test_a_factory_that_returns_no_module(models_file, capsys):
    assert main([f"{models_file}:NOT_A_FACTORY", "--input", "1,3,8,8"]) == 2
    models_file.write_text(FACTORY + "\ndef number():\n    return 3\n")
    assert main([f"{models_file}:number", "--input", "1,3,8,8"]) == 2
    assert "returned a int, not a torch.nn.Module" in _last_line(capsys.readouterr().err)


# -- progress -------------------------------------------------------------------------------------


def test_progress_is_one_line_per_stage_of_each_model_in_a_log(models_file, tmp_path, capsys):
    out = tmp_path / "out"
    argv = [f"{models_file}:small", f"{models_file}:clean", "--input", "1,3,8,8", "--out", str(out), "--fix",
            "--no-backward"]
    assert main(argv) == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("[")]
    stages = ["building", "recording", "analysing", "suggesting fixes", "writing files", "done"]
    expected = [f"{name} ({i}/2): {stage}" for i, name in ((1, "small"), (2, "clean")) for stage in stages]
    assert [line.split("] ", 1)[1].rsplit(" ", 1)[0].split(" ", 1)[1].strip() for line in lines] == expected
    assert lines[-1].startswith("[####################] 10/10 ")


@pytest.mark.parametrize("how", ["flag", "env"])
def test_progress_switched_off(models_file, capsys, monkeypatch, how):
    argv = [f"{models_file}:clean", "--input", "1,3,8,8", "--no-backward"]
    if how == "flag":
        argv.append("--no-progress")
    else:
        monkeypatch.setenv("AUDITOR_PROGRESS", "0")
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "building" not in err and "done" not in err


def test_progress_on_a_terminal_is_a_bar():
    import io

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    stream = Terminal()
    p = cli.Progress(4, stream=stream, enabled=True)
    p.step("m (1/2): building")
    for label in ("m (1/2): recording", "m (1/2): done", "n (2/2): building", "n (2/2): done"):
        p.advance(label)
    p.close()
    text = stream.getvalue()
    assert "\r" in text and "n (2/2): done" in text and "4/4" in text
    assert "\n[" not in text  # not the log's lines
    off = Terminal()
    p = cli.Progress(2, stream=off, enabled=False)
    p.step("x")
    p.advance("y")
    p.close()
    assert off.getvalue() == ""


@needs_inductor
def test_compile_adds_the_compiled_step_and_its_files(models_file, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    out = tmp_path / "out"
    assert main([f"{models_file}:small", "--input", "1,3,8,8", "--compile", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "compiled" in printed.lower()
    for name in ("conversions.csv", "graphs.csv", "compiled.csv"):
        assert (out / name).exists(), name
    graphs = pd.read_csv(out / "graphs.csv")
    assert len(graphs) >= 2 and set(graphs["phase"]) >= {"forward", "backward"}
    assert main([f"{models_file}:small", "--input", "1,3,8,8", "--compile", "--fake"]) == 2
    assert "--compile" in _last_line(capsys.readouterr().err)


@pytest.mark.parametrize("argv", [["--help"], ["--version"], ["m:f", "--bogus"], ["m:f", "--top", "0"]])
def test_the_command_line_answers_help_and_mistakes_without_importing_torch(argv):
    """The console script parses before it imports torch (seconds), so --help, --version and a
    mistyped flag answer at once."""
    import subprocess

    code = ("import sys, format_auditor_cli as c; status = c.main(sys.argv[1:]); "
            "assert 'torch' not in sys.modules, 'torch was imported'; sys.exit(status)")
    done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=60)
    assert done.returncode == (0 if argv[0].startswith("--") else 2), done.stderr
    assert "torch was imported" not in done.stderr
    assert (done.stdout + done.stderr).strip()


def test_lraspp_is_built_without_fetching_its_backbone(monkeypatch):
    """Built offline: any download attempt fails the test."""
    import torch.hub

    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", _raise(AssertionError("downloads weights")))
    model = cli.load_model("torchvision:lraspp_mobilenet_v3_large")
    assert isinstance(model, torch.nn.Module)


def test_torchs_device_noise_is_kept_out_of_a_cpu_run():
    """Issue 29: on a machine without a GPU torch's profiler library printed "USDT ...
    profiler_start" and "ERROR ... gpuGetDeviceCount failed" into format-audit's output. The
    CLI quiets it before torch is imported (a subprocess: the setting must precede the import)."""
    code = ("import format_auditor_cli as f\n"
            "f.quiet_device_noise(None)\n"
            "import torch\n"
            "with torch.profiler.profile():\n"
            "    torch.randn(4, 4).sum()\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parent.parent, env={k: v for k, v in __import__("os").environ.items()
                                                                          if k != "KINETO_LOG_LEVEL"})
    assert done.returncode == 0
    assert "gpuGetDeviceCount" not in done.stderr and "USDT" not in done.stderr and "ERROR" not in done.stderr


def test_compile_has_a_compiling_stage_of_its_own(models_file, capsys, monkeypatch):
    """Issue 29: with --compile the progress sat on "recording" for minutes while Inductor
    compiled. Compiling is now a stage of its own, then the eager step is recorded."""
    from auditor import _api

    seen = []

    def compiled_step(step, options=None, record_time=True):
        seen.append("compiled")
        return None

    monkeypatch.setattr(_api, "record_compiled_step", compiled_step)
    assert main([f"{models_file}:small", "--input", "1,3,8,8", "--compile", "--progress"]) == 0
    err = capsys.readouterr().err
    assert seen == ["compiled"]
    assert err.index("small (1/1): compiling") < err.index("small (1/1): recording") < err.index("analysing")
