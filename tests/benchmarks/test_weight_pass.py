"""``benchmarks.weight_pass`` times both ways of adding loop weight cotangents on the same batches."""

from __future__ import annotations

import pytest

from benchmarks import weight_pass


@pytest.mark.slow
def test_quick_run_compares_both_ways(tmp_path):
    result = weight_pass.main(["--quick", "--json", str(tmp_path / "w.json")])
    assert {(r["model"], r["batch_size"]) for r in result["runs"]} == {
        (m, b) for m in ("SST Tree-LSTM", "BiLSTM tagger", "GGNN") for b in (4, 16)}
    for r in result["runs"]:
        assert set(r["ms"]) == set(weight_pass.WAYS) and min(r["ms"].values()) > 0
        assert r["largest_param_gap"] < 1e-5  # one SGD step from the same parameters, either way
        assert r["item_shares"] and min(r["item_shares"]) > 0
    assert (tmp_path / "w.json").exists() and (tmp_path / "w.png").exists()
