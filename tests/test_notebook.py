"""The notebook runs headless, end to end, with small inputs."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOK = Path(__file__).resolve().parent.parent / "notebooks" / "profile_a_model.ipynb"


def test_notebook_is_committed_without_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None


@pytest.mark.slow
def test_notebook_runs_headless(tmp_path, monkeypatch):
    """The loop on a real model: its cause shown as an HTML table, the fix applied, the cause
    gone on re-audit, both heatmaps, the timing and a CSV that reads back."""
    monkeypatch.setenv("AUDITOR_NOTEBOOK_SIZE", "32")
    monkeypatch.setenv("AUDITOR_NOTEBOOK_BATCH", "2")
    monkeypatch.setenv("AUDITOR_NOTEBOOK_MODEL", "shufflenet_v2_x0_5")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) == 4  # heatmap, top chart, timeline, heatmap after: each shown exactly once
    audit_html = next(o["data"]["text/html"] for o in outputs if "text/html" in o.get("data", {}))
    assert "<table" in audit_html and "channel_shuffle" in audit_html and "shufflenetv2.py:35" in audit_html
    diff_cell = next(c for c in nb.cells if "auditor.diff(before, after" in c.source)
    assert "vanished" in diff_cell.outputs[0]["data"]["text/plain"]
    applied = next(c for c in nb.cells if "fixes.apply(fixed)" in c.source)
    assert "True" in applied.outputs[0]["data"]["text/plain"]
    timing = next(c for c in nb.cells if c.cell_type == "code" and "time_interleaved" in c.source)
    said = timing.outputs[0]["text"]  # a stated conclusion from paired ratios at one thread, CPU time
    assert "after against before" in said and "1 thread, process CPU time" in said
    assert any(v in said for v in ("faster", "slower", "within noise"))
    assert not re.search(r"-[\d.]+% faster", said)  # never a negative "faster"
    table = timing.outputs[1]["data"]["text/html"]
    assert "after / before" in table and "estimated_saving_us" not in table and "wall_spread" not in table
    shown = [o["data"]["text/html"] for c in nb.cells if c.cell_type == "code" and "styled(before" in c.source
             for o in c.outputs]
    assert len(shown) == 2 and ">torchvision/models/shufflenetv2.py:35<" in shown[0]  # short paths ...
    assert re.search(r">[\d.]+ [µm]?s<", shown[1]) and not re.search(r"\d\.\d{5}", shown[1])  # ... and units
    assert (tmp_path / "shufflenet_audit.csv").stat().st_size > 0
    assert (tmp_path / "shufflenet_trace.json").stat().st_size > 0
    assert nb.cells[-1].outputs[-1]["data"]["text/plain"] == "True"
