"""format-audit: files written, progress shown, bad input gets one line and exit status 2."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from matplotlib.image import imread

import auditor
from auditor.cli import main

FACTORY = textwrap.dedent(
    """
    import torch.nn as nn

    def small():
        return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.Softmax(dim=1), nn.Conv2d(8, 8, 3, padding=1))

    def clean():
        return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1))

    def broken():
        raise RuntimeError("no weights here")

    NOT_A_FACTORY = 3
    """
)


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
    assert names == ["coverage.csv", "events.csv", "heatmap.png", "hotspots.csv", "report.txt", "summary.csv", "timeline.png"]
    a = auditor.Audit.read_csv(out / "events.csv")
    assert len(a.hotspots()) == 5
    for png in ("heatmap.png", "timeline.png"):
        img = imread(out / png)
        assert img.shape[0] > 150 and (img[..., :3] < 0.97).any(axis=-1).mean() > 0.03
    assert "aten._softmax.default" in (out / "report.txt").read_text()


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
