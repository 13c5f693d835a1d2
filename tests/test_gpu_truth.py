"""benchmarks/gpu_truth.py --dry-run: the GPU check runs its code paths on CPU, so it cannot rot
before a GPU is lent."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_truth.py"


def _run(tmp_path, *extra):
    done = subprocess.run([sys.executable, str(SCRIPT), "--dry-run", "--out", str(tmp_path), *extra],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def _check(tmp_path, parts):
    md = (tmp_path / "gpu_truth.md").read_text()
    for part in parts:
        frame = pd.read_csv(tmp_path / f"{part}.csv")
        assert len(frame), part
        assert "error" not in frame or frame["error"].isna().all(), (part, frame["error"].dropna().tolist())
        assert f"## {part}" in md


def test_dry_run_without_the_compiled_part(tmp_path):
    parts = ["corpus", "models", "amp_ratios", "verify", "hidden"]
    _run(tmp_path, "--parts", ",".join(parts))
    _check(tmp_path, parts)


@pytest.mark.slow
def test_whole_dry_run(tmp_path):
    _run(tmp_path)
    _check(tmp_path, ["corpus", "models", "amp_ratios", "verify", "compiled", "hidden"])
