"""The notebooks run top to bottom (with nbclient) and are stored without outputs."""

from __future__ import annotations

import pathlib
import re

import nbformat
from nbclient import NotebookClient

NOTEBOOKS = pathlib.Path(__file__).resolve().parents[2] / "examples" / "notebooks"


def _run(name: str) -> tuple[nbformat.NotebookNode, str]:
    """Executes a notebook that is stored without outputs; returns it and its printed text."""
    path = NOTEBOOKS / name
    nb = nbformat.read(path, as_version=4)
    assert all(not c.get("outputs") and c.get("execution_count") is None
               for c in nb.cells if c.cell_type == "code"), "store notebooks without outputs"
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}).execute()
    text = "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    return nb, text


def test_quick_start_notebook():
    _, text = _run("quick_start.ipynb")
    assert "type mismatch" in text
    losses = [float(line.split("loss")[1]) for line in text.splitlines() if line.startswith("epoch")]
    assert len(losses) == 8 and losses[-1] < 0.5 * losses[0]


def test_sentiment_notebook_on_the_sst_sample(monkeypatch):
    monkeypatch.setenv("FOLD_NOTEBOOK_QUICK", "1")  # the kernel inherits it: train on the committed sample
    nb, text = _run("sentiment.ipynb")
    assert "640 training trees, 200 dev, 200 test" in text
    epochs = [line.split() for line in text.splitlines() if line.startswith("epoch")]
    losses = [float(e[e.index("loss") + 1]) for e in epochs]
    assert len(losses) == 4 and losses[-1] < losses[0]
    figures = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if "image/png" in o.get("data", {})]
    assert len(figures) == 1, "the learning curve is plotted"
    for split in ("dev", "test"):
        line = next(ln for ln in text.splitlines() if ln.startswith(f"{split}: root fine"))
        values = [float(v) for v in re.findall(r"\d+\.\d+", line)]
        assert len(values) == 3 and all(0.0 <= v <= 1.0 for v in values)
