"""The table1 benchmark runs in --quick mode, checks fold against the manual model, and its ratios add up."""

from __future__ import annotations

import json
import random

import pytest

from benchmarks import models, table1


def test_relabel_and_leaf_order_round_trip():
    shape = models.random_tree(random.Random(1), 9)
    ids = list(range(100, 109))
    assert table1.leaf_order(table1.relabel(shape, ids)) == ids


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["infer", "train"])
def test_quick_run(tmp_path, mode):
    out = tmp_path / "table1.json"
    r = table1.main(["--quick", "--mode", mode, "--json", str(out)])
    assert r["max_abs_difference_fold_vs_manual"] < 1e-4
    assert [row["batch_size"] for row in r["rows"]] == [8, 1]
    for row in r["rows"]:
        assert row["cost_ratio"] == pytest.approx(row["dynamic"]["seconds"] / row["manual"]["seconds"])
        # 8-leaf trees: 7 pair nodes and 8 leaves each.
        assert row["dynamic"]["nodes"] == row["full_dynamic"]["nodes"] == 15 * row["batch_size"]
    one = r["rows"][1]
    assert one["speedup_ratio"] == pytest.approx(one["manual"]["seconds"] / one["full_dynamic"]["seconds"])
    e = r["efficiency"]
    assert e["internal_nodes"] == 8 * 7 and e["fold_share_of_matmul"] > 0
    assert json.loads(out.read_text())["args"]["mode"] == mode
    assert out.with_suffix(".png").stat().st_size > 1000
