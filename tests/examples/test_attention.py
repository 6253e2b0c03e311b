"""The attention example trains in --quick mode and its data follow the problem's rules."""

from __future__ import annotations

import numpy as np

from examples import attention


def test_addition_problem_data():
    data = attention.make_data(np.random.default_rng(0), 50, 20)
    for seq, target in data:
        arr = np.asarray(seq)
        assert 20 <= len(arr) <= 22
        marked = np.flatnonzero(arr[:, 1])
        assert len(marked) == 2 and marked[0] < len(arr) // 2 <= marked[1]
        assert np.isclose(arr[marked, 0].sum(), target) and np.all(np.abs(arr[:, 0]) <= 1)


def test_quick_run_learns(tmp_path):
    report = attention.main(["--quick", "--quiet", "--json", str(tmp_path / "a.json")])
    (run,) = report["runs"]
    history = run["history"]
    assert history[-1]["train_loss"] < 0.7 * history[0]["train_loss"]
    assert history[-1]["test_mse"] < history[0]["test_mse"]
    # Predicting 0 gives the target's variance, 2/3: the model must do clearly better.
    assert 0.0 <= run["test_accuracy"] <= 1.0 and run["test_mse"] < 0.3
