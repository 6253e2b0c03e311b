"""``benchmarks.item_ladder`` times both item-size ladders on the same SST batches."""

from __future__ import annotations

import pytest

from benchmarks import item_ladder


@pytest.mark.slow
def test_quick_run_compares_both_ladders(tmp_path):
    result = item_ladder.main(["--quick", "--json", str(tmp_path / "l.json")])
    (run,) = result["runs"]
    assert run["batch_size"] == 8 and set(run["ms"]) == set(item_ladder.LADDERS) and min(run["ms"].values()) > 0
    powers, fine = (run["item_sizes"][name] for name in item_ladder.LADDERS)
    assert all(s & (s - 1) == 0 for s in powers)  # powers of two alone
    assert set(powers) <= set(fine) and all(s in powers or s >= result["fine_item"] for s in fine)
    assert run["largest_param_gap"] < 1e-5  # one SGD step from the same parameters, either way
    assert (tmp_path / "l.json").exists() and (tmp_path / "l.png").exists()


@pytest.mark.slow
@pytest.mark.parametrize("workload", ["tagger", "treenn", "table1"])
def test_quick_run_of_the_other_workloads(tmp_path, workload):
    result = item_ladder.main(["--quick", "--workload", workload, "--json", str(tmp_path / "l.json")])
    (run,) = result["runs"]
    assert result["workload"] == workload and min(run["ms"].values()) > 0
    assert run["largest_param_gap"] < 1e-5


def test_the_ladder_is_restored_after_each_variant():
    kept = item_ladder.schedule.FINE_ITEM
    with pytest.raises(RuntimeError), item_ladder.ladder(item_ladder.LADDERS[0]):
        assert item_ladder.schedule.item_sizes(512, 64) == (8, 16, 32, 64, 128, 256, 512)
        raise RuntimeError
    assert item_ladder.schedule.FINE_ITEM == kept
