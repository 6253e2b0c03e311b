"""The notebooks run top to bottom (with nbclient) and are stored without outputs."""

from __future__ import annotations

import pathlib

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = pathlib.Path(__file__).resolve().parents[2] / "examples" / "notebooks"


@pytest.mark.parametrize("name", ["quick_start.ipynb"])
def test_notebook_runs_and_is_stored_clean(name):
    path = NOTEBOOKS / name
    nb = nbformat.read(path, as_version=4)
    assert all(not c.get("outputs") and c.get("execution_count") is None
               for c in nb.cells if c.cell_type == "code"), "store notebooks without outputs"
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
    text = "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert "type mismatch" in text
    losses = [float(line.split("loss")[1]) for line in text.splitlines() if line.startswith("epoch")]
    assert len(losses) == 8 and losses[-1] < 0.5 * losses[0]
