"""The breadth corpus's fixed sample (benchmarks/breadth.py --sample), run as the full corpus runs
(each model in its own process), and the invariants that must hold for any fix engine: no
auditor crash, no applied fix that changes outputs, every cause with a fix that is automatic or
says why not, and the table written with its columns. The share of causes fixed automatically
is measured by the full run, not pinned here."""

from __future__ import annotations

import csv
import importlib.util
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.zoo]

ROOT = Path(__file__).resolve().parent.parent


def _breadth():
    spec = importlib.util.spec_from_file_location("breadth", ROOT / "benchmarks" / "breadth.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["breadth"] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    for library in ("timm", "torchvision", "segmentation_models_pytorch"):
        pytest.importorskip(library)
    breadth = _breadth()
    out = tmp_path_factory.mktemp("breadth") / "breadth.csv"
    assert breadth.main(["--sample", "--csv", str(out), "--timeout", "300"]) == 0
    with out.open(newline="") as fh:
        header = next(csv.reader(fh))
    return breadth, out, header, breadth.read_rows(out)


def test_the_table_has_its_columns_and_every_model(sample):
    breadth, out, header, rows = sample
    assert header == breadth.COLUMNS
    models = [(r["source"], r["model"]) for r in rows if r["row"] == "model"]
    assert sorted(f"{s}/{m}" for s, m in models) == sorted(breadth.SAMPLE)
    md = out.with_suffix(".md").read_text()
    for section in ("## Totals", "## Per pattern", "## Why causes are not fixed by the engine's own verified fixes",
                    "## Slowest models", "## Per model"):
        assert section in md
    # a model with no convolution is listed, as skipped
    assert any(r["status"].startswith("skipped: no convolution") for r in rows if r["row"] == "model")


def test_no_auditor_crash(sample):
    _, _, _, rows = sample
    bad = [(r["model"], r["status"], r["error"]) for r in rows if r["row"] == "model"
           and not (r["status"] == "ok" or r["status"].startswith("skipped"))]
    assert bad == []


def test_no_applied_fix_changes_outputs(sample):
    _, _, _, rows = sample
    assert [r["model"] for r in rows if r["changed_outputs"] == "True"] == []
    applied = [r for r in rows if r["row"] == "cause" and r["applied"] == "True"]
    assert applied, "the sample applies at least one fix"
    assert all(r["same_outputs"] == "True" for r in applied)


def test_every_cause_has_a_fix_that_is_automatic_or_says_why_not(sample):
    _, _, _, rows = sample
    causes = [r for r in rows if r["row"] == "cause"]
    assert causes
    for r in causes:
        assert r["pattern"] and r["action"], r
        assert r["automatic"] == "True" or r["reason"].strip(), f"{r['model']} {r['pattern']}: by hand without a reason"
    # the counts on each model row are its cause rows'
    for m in (r for r in rows if r["row"] == "model" and r["status"] == "ok"):
        mine = [c for c in causes if (c["source"], c["model"]) == (m["source"], m["model"])]
        assert int(m["causes"]) == len(mine)
        assert int(m["automatic_verified"]) == sum(c["verified"] == "True" for c in mine)
        assert m["contiguous_hotspots_before"] != "" and m["contiguous_hotspots_after"] != ""
