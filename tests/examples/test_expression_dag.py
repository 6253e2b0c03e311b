"""The expression-DAG example: programs share sub-expressions, and a --quick run learns."""

from __future__ import annotations

import json
import random

import numpy as np

from examples import expression_dag
from examples.calculator import LIMIT, value


def test_programs_are_dags_of_bounded_values_whose_tree_expansion_is_larger():
    data = expression_dag.make_data(random.Random(0), 64, 16)
    for k, (e, t) in enumerate(data):
        distinct, tree = expression_dag.sizes(e)
        assert distinct == 1 + k % 16 <= tree
        if tree < 5_000:  # the calculator's value walks the tree: exponential, so small ones only
            assert t == value(e) and abs(t) <= LIMIT
    assert max(expression_dag.sizes(e)[1] for e, _ in data) > 500


def test_quick_run_learns_and_shares(tmp_path):
    out = tmp_path / "expression_dag.json"
    report = expression_dag.main(["--quick", "--quiet", "--checkpoint-dir", str(tmp_path), "--json", str(out)])
    history = report["history"]
    assert history[-1]["train_loss"] < 0.8 * history[0]["train_loss"]
    rows = report["by_operations"]
    assert [r["operations"] for r in rows] == list(range(1, 9))
    assert all(np.isfinite(r["abs_error"]) for r in rows)
    assert rows[0]["abs_error"] < rows[0]["baseline_abs_error"]
    costs = report["test_costs"]
    assert costs["tree"]["nodes"] > 2 * costs["shared"]["nodes"]
    assert json.loads(out.read_text())["example"] == "expression_dag"
