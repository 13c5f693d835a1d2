"""The notebook runs headless, end to end, with small inputs."""

from __future__ import annotations

import os
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
    monkeypatch.setenv("AUDITOR_NOTEBOOK_SIZE", "32")
    monkeypatch.setenv("AUDITOR_NOTEBOOK_MODEL", "resnet18")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) == 3  # heatmap, timeline, top hotspots: each shown exactly once
    html = [o["data"]["text/html"] for o in outputs if "text/html" in o.get("data", {})]
    assert any("aten._softmax.default" in h for h in html)  # the planted break's hotspot table
    assert (tmp_path / "planted_audit.csv").stat().st_size > 0
    last = nb.cells[-1].outputs[-1]["data"]["text/plain"]
    assert last == "True"
    diff_cell = next(c for c in nb.cells if "auditor.diff(before, after)" in c.source)
    assert "vanished" in diff_cell.outputs[0]["data"]["text/plain"]
    assert os.environ.get("AUDITOR_NOTEBOOK_SIZE") == "32"
