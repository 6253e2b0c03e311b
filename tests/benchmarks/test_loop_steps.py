"""``benchmarks.loop_steps`` builds the same batches by depths and by steps and times both."""

from __future__ import annotations

import pytest

from benchmarks import loop_steps


@pytest.mark.slow
def test_quick_run_compares_both_ways(tmp_path):
    result = loop_steps.main(["--quick", "--json", str(tmp_path / "s.json")])
    assert [r["workload"] for r in result["runs"]] == ["GGNN, 4 graphs", "tagger, 4 sentences", "random model 0"]
    for r in result["runs"]:
        assert set(r["step_ms"]) == set(r["build_ms"]) == set(loop_steps.WAYS)
        assert min(r["step_ms"].values()) > 0 and min(r["build_ms"].values()) > 0
        assert r["loop_groups"]["steps"] <= r["loop_groups"]["depths"]
        assert r["loss_difference"] < 1e-5  # the same model on the same batch, either way
    ggnn = result["runs"][0]
    assert ggnn["loop_groups"]["steps"] < ggnn["loop_groups"]["depths"]
    assert (tmp_path / "s.json").exists() and (tmp_path / "s.png").exists()
