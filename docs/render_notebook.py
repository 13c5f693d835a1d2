"""Run notebooks/profile_a_model.ipynb and write it, with its outputs, to docs/guides/ for the site.

The notebook is committed without outputs (tests/test_notebook.py); the site shows a run of it.
tests/test_docs.py checks that the run's code cells are the notebook's, so edit the notebook,
then run this again:

    OMP_NUM_THREADS=1 .venv/bin/python docs/render_notebook.py
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "notebooks" / "profile_a_model.ipynb"
RENDERED = ROOT / "docs" / "guides" / "profile_a_model.ipynb"


def main() -> int:
    os.environ.setdefault("AUDITOR_PROGRESS", "0")
    # the kernel runs in a scratch folder: it imports this checkout's auditor
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    nb = nbformat.read(SOURCE, as_version=4)
    with tempfile.TemporaryDirectory() as scratch:  # the files the notebook writes are not the site's
        NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": scratch}}).execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    if errors:
        print(f"{SOURCE.name}: a cell raised: {errors[0].get('ename')}: {errors[0].get('evalue')}", file=sys.stderr)
        return 1
    for cell in nb.cells:
        cell.get("metadata", {}).pop("execution", None)
    nbformat.write(nb, RENDERED)
    print(f"wrote {RENDERED.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
