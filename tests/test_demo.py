"""`make demo`'s loop: a real model's cause found, fixed, gone on re-audit, and timed."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from auditor import demo

ROOT = Path(__file__).resolve().parent.parent


def test_the_demo_finds_verifies_patches_and_applies_a_real_fix(tmp_path):
    # a subprocess: applying the fix recompiles torchvision's channel_shuffle for the process
    out = tmp_path / "audit_out"
    run = subprocess.run([sys.executable, "-m", "auditor.demo", "--model", "shufflenet_v2_x0_5", "--input",
                          "2,3,32,32", "--rounds", "3", "--budget", "5", "--out", str(out)],
                         capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert run.returncode == 0, run.stderr
    text = run.stdout
    assert "[channel_shuffle]" in text and "edit source" in text
    groups = int(re.search(r"-> (\d+) groups", (out / "report_before.txt").read_text()).group(1))
    assert groups > 0 and f"hotspot groups {groups} -> 0; same outputs and gradients" in text  # verified
    assert "+    return torch.nn.functional.channel_shuffle(x, groups)" in text  # the patch
    assert "Hotspots: 0 causes -> 0 groups" in text  # the re-audit of the fixed copy
    assert "outputs of the fixed copy equal the original's: True" in text
    assert "estimated by causes()['saving_us']" in text and "verdict: " in text
    timing = text.split("6. What the fixes save")[1]
    verdict = timing.split("verdict: ")[1].split("\n")[0]
    words = {"helps": "% faster", "hurts": "× slower", "within noise": "within noise"}[verdict]
    assert words in timing  # a verdict in words, never a negative "faster"
    assert sorted(p.name for p in out.iterdir()) == sorted(demo.DEMO_FILES)
    assert "[channel_shuffle]" in (out / "report_before.txt").read_text()
    assert "0 causes" in (out / "report_after.txt").read_text()
    assert (out / "fixes.patch").read_text().startswith("# installed library file")
    assert "verdict" in (out / "verify.csv").read_text().splitlines()[0]
    # issue 41: section 5 was a raw 226-character pandas table holding a machine path, and the
    # demo said nothing for seconds before its first line and while verifying
    applied = text.split("== 5.")[1].split("Format audit:")[0]
    assert "Applied 1 of 1 fix:" in applied and "fix 1 [channel_shuffle] edit source at torchvision/" in applied
    assert "site-packages" not in applied and "round  fix" not in applied
    assert text.lstrip().startswith("== 1. Audit") and "(building the model" in text.split("Format audit:")[0]
    assert "timed rounds...)" in text.split("== 3.")[1].split("Verified fixes")[0]
    # an earlier demo's files are kept unless --force
    again = subprocess.run([sys.executable, "-m", "auditor.demo", "--out", str(out)], capture_output=True,
                           text=True, cwd=ROOT, timeout=600)
    assert again.returncode == 2 and "--force" in again.stderr


@pytest.mark.parametrize("flags, message", [
    (["--input", "2,3,32"], "--input must be four positive integers"),
    (["--input", "0,3,32,32"], "--input must be four positive integers"),
    (["--rounds", "2"], "--rounds must be at least 3"),
    (["--budget", "0"], "--budget must be a positive number"),
])
def test_the_demo_checks_its_flags(flags, message, capsys):
    with pytest.raises(SystemExit) as exc:
        demo.main(flags)
    assert exc.value.code == 2 and message in capsys.readouterr().err
