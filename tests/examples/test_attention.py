"""The attention example trains in --quick mode and its data follow the problem's rules."""

from __future__ import annotations

import jax
import numpy as np

import fold as fd
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
    report = attention.main(["--quick", "--quiet", "--checkpoint-dir", str(tmp_path),
                             "--json", str(tmp_path / "a.json")])
    (run,) = report["runs"]
    history = run["history"]
    assert history[-1]["train_loss"] < 0.7 * history[0]["train_loss"]
    assert history[-1]["test_mse"] < history[0]["test_mse"]
    # Predicting 0 gives the target's variance, 2/3: the model must do clearly better.
    assert 0.0 <= run["test_accuracy"] <= 1.0 and run["test_mse"] < 0.3


def test_attention_block_matches_numpy():
    block = attention.attention_block(hidden=4, score_scale=10.0)
    seq = np.random.default_rng(1).uniform(-1, 1, (7, 2))
    params = fd.Compiler.create(block).init(jax.random.key(2))
    p = {k: {n: np.asarray(v) for n, v in layer.items()} for k, layer in params.items()}
    h = np.maximum(seq @ p["encode"]["w"] + p["encode"]["b"], 0)
    e = 10.0 * np.tanh(h @ p["score"]["w"] + p["score"]["b"])[:, 0]
    alpha = np.exp(e) / np.exp(e).sum()
    np.testing.assert_allclose(block.eval(seq.tolist(), params), alpha @ h, rtol=1e-5, atol=1e-6)
