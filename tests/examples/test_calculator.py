"""The calculator example trains in --quick mode: loss goes down, errors are sane."""

from __future__ import annotations

import json
import random

import numpy as np

from examples import calculator


def test_generator_respects_depth_and_limits():
    rng = random.Random(0)
    data = calculator.make_data(rng, 60, 6)
    assert [calculator.depth(e) for e, _ in data[:6]] == [1, 2, 3, 4, 5, 6]
    for e, t in data:
        assert abs(t) <= calculator.LIMIT and t == calculator.value(e)


def test_quick_run_learns(tmp_path):
    out = tmp_path / "calculator.json"
    report = calculator.main(["--quick", "--quiet", "--checkpoint-dir", str(tmp_path), "--json", str(out)])
    history = report["history"]
    assert history[-1]["train_loss"] < 0.7 * history[0]["train_loss"]
    assert history[-1]["test_abs_error"] < history[0]["test_abs_error"]
    rows = report["by_depth"]
    assert [r["depth"] for r in rows] == list(range(1, 7))
    for r in rows:
        assert np.isfinite(r["abs_error"]) and 0 <= r["abs_error"] < 100
    # Shallow expressions beat the constant baseline after a few epochs.
    assert rows[0]["abs_error"] < rows[0]["baseline_abs_error"]
    assert json.loads(out.read_text())["example"] == "calculator"


def test_donate_trains_the_same_run(tmp_path):
    args = ["--quick", "--quiet", "--epochs", "2", "--checkpoint-dir", str(tmp_path)]
    plain = calculator.main([*args, "--json", str(tmp_path / "plain.json")])
    donated = calculator.main([*args, "--donate", "--json", str(tmp_path / "donated.json")])
    assert [r["train_loss"] for r in donated["history"]] == [r["train_loss"] for r in plain["history"]]
    assert donated["by_depth"] == plain["by_depth"]
