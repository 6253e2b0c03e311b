"""The notebooks run top to bottom (with nbclient), and are stored with the outputs of a full run.

Each test clears the stored outputs, executes the notebook and checks what it prints; it also
checks that the stored copy was executed top to bottom as it stands (every code cell has
outputs or runs silently in the fresh run too, in order) and has its picture.
Refresh the stored outputs with ``python -m tests.examples.test_notebooks`` (the sentiment and
tree decoder notebooks train on the full treebank: set ``FOLD_SST_DIR``).
"""

from __future__ import annotations

import copy
import os
import pathlib
import re
import sys

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

NOTEBOOKS = pathlib.Path(__file__).resolve().parents[2] / "examples" / "notebooks"


def _execute(nb: nbformat.NotebookNode, path: pathlib.Path) -> None:
    NotebookClient(nb, timeout=1800, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()


def _figures(nb: nbformat.NotebookNode) -> list:
    return [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if "image/png" in o.get("data", {})]


def _run(name: str) -> tuple[nbformat.NotebookNode, str]:
    """Executes a fresh copy of a notebook; returns it and its printed text, after checking the
    stored copy."""
    path = NOTEBOOKS / name
    stored = nbformat.read(path, as_version=4)
    nb = copy.deepcopy(stored)
    for c in nb.cells:
        if c.cell_type == "code":
            c.outputs, c.execution_count = [], None
    _execute(nb, path)
    code = [(old, new) for old, new in zip(stored.cells, nb.cells) if new.cell_type == "code"]
    assert [old.execution_count for old, _ in code] == list(range(1, len(code) + 1)), \
        f"{name}: the stored outputs are not from one run top to bottom (python -m tests.examples.test_notebooks)"
    for old, new in code:
        assert bool(old.outputs) == bool(new.outputs), f"{name}: stored outputs are stale at {old.source[:60]!r}"
    assert _figures(stored), f"{name}: the stored notebook has no picture"
    text = "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    # tqdm.auto without ipywidgets (a fresh [dev] environment) warned in every notebook with a bar.
    assert "IProgress not found" not in text and "TqdmWarning" not in text
    return nb, text


def test_quick_start_notebook():
    nb, text = _run("quick_start.ipynb")
    assert len(_figures(nb)) == 2, "the schedule and the learning curve are plotted"
    assert "ForwardDeclaration" in text  # print(model)
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
    assert len(_figures(nb)) == 1, "the learning curve is plotted"
    for split in ("dev", "test"):
        line = next(ln for ln in text.splitlines() if ln.startswith(f"{split}: root fine"))
        values = [float(v) for v in re.findall(r"\d+\.\d+", line)]
        assert len(values) == 3 and all(0.0 <= v <= 1.0 for v in values)


@pytest.mark.slow
def test_tree_decoder_notebook_on_the_sst_sample(monkeypatch):
    monkeypatch.setenv("FOLD_NOTEBOOK_QUICK", "1")
    nb, text = _run("tree_decoder.ipynb")
    assert "640 training trees, 100 dev" in text
    losses = [float(line.split()[3]) for line in text.splitlines() if line.startswith("epoch")]
    assert len(losses) == 2 and losses[-1] < losses[0]
    generated = [line for line in text.splitlines() if re.match(r"\[\d\] +\d+ nodes", line)]
    assert len(generated) == 20
    assert len(_figures(nb)) == 2, "generated trees drawn, sizes against the dev trees"
    assert re.search(r"loss per decision: dev trees \d+\.\d+, generated trees \d+\.\d+", text)


def _setup_cells(name: str, cwd: pathlib.Path, extra: str) -> str:
    """Runs a notebook's first two code cells (imports, paths, data) and ``extra`` in a kernel
    started in ``cwd``; returns what they print."""
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    nb.cells = [c for c in nb.cells if c.cell_type == "code"][:2] + [nbformat.v4.new_code_cell(extra)]
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(cwd)}}).execute()
    return "\n".join(o.get("text", "") for c in nb.cells for o in c.outputs)


def test_the_sentiment_notebook_runs_from_the_repository_root(monkeypatch):
    """Its paths came from ``Path.cwd().parents[1]``: started at the root, it looked for the data
    in the clone's parent."""
    monkeypatch.setenv("FOLD_NOTEBOOK_QUICK", "1")
    root = NOTEBOOKS.parents[1]
    text = _setup_cells("sentiment.ipynb", root, "print(ROOT == ROOT.resolve(), DATA_DIR.is_dir(), ROOT.name)")
    assert f"True True {root.name}" in text


def test_offline_the_sentiment_notebook_says_to_set_fold_sst_dir(monkeypatch, tmp_path):
    """With no network and no data, it told a notebook user to pass ``--data-dir``, a CLI flag."""
    for var in ("FOLD_NOTEBOOK_QUICK", "FOLD_SST_DIR"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("FOLD_DATA", str(tmp_path))  # an empty cache
    monkeypatch.setenv("https_proxy", "http://127.0.0.1:9")  # nothing listens there: offline
    with pytest.raises(CellExecutionError, match="set FOLD_SST_DIR to the folder that holds them"):
        _setup_cells("sentiment.ipynb", NOTEBOOKS, "print(DATA_DIR)")


def refresh(names: list[str]) -> None:
    """Executes the notebooks and stores them with their outputs."""
    for name in names:
        path = NOTEBOOKS / name
        nb = nbformat.read(path, as_version=4)
        for c in nb.cells:
            if c.cell_type == "code":
                c.outputs, c.execution_count = [], None
        _execute(nb, path)
        nbformat.write(nb, path)
        print(f"stored {path}")


if __name__ == "__main__":
    names = sys.argv[1:] or ["quick_start.ipynb", "sentiment.ipynb", "tree_decoder.ipynb"]
    if {"sentiment.ipynb", "tree_decoder.ipynb"} & set(names) and not os.environ.get("FOLD_SST_DIR"):
        sys.exit("set FOLD_SST_DIR to the full treebank's folder (the SST notebooks train on it)")
    refresh(names)
