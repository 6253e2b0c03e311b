"""The schedule_build benchmark runs in --quick mode and writes consistent numbers."""

from __future__ import annotations

import json
import pathlib

import pytest

from benchmarks import models, schedule_build

SAMPLE = pathlib.Path(__file__).resolve().parents[1] / "data" / "sst_sample"


def test_random_tree_has_the_requested_leaves():
    import random

    def leaves(t):
        return 1 if isinstance(t, int) else leaves(t[0]) + leaves(t[1])

    rng = random.Random(0)
    assert [leaves(models.random_tree(rng, n)) for n in (1, 2, 7, 128)] == [1, 2, 7, 128]


@pytest.mark.slow
def test_quick_run(tmp_path):
    out = tmp_path / "schedule_build.json"
    results = schedule_build.main(["--quick", "--data-dir", str(SAMPLE), "--json", str(out)])
    for workload in ("sst", "sst_recorded", "random_trees"):
        r = results[workload]
        assert r["batches"] == 2 and r["nodes"] > 0
        assert abs(r["nodes_per_s"] * r["seconds_per_batch"] * r["batches"] - r["nodes"]) < 1e-6 * r["nodes"]
    # A 16-leaf tree has 15 pair nodes and 16 leaf lookups.
    assert results["random_trees"]["nodes_per_batch"] == 16 * 31
    assert 0 < results["sst"]["host_share_of_step"] < 1
    assert results["sst"]["step_batches"] == 2
    for how in ("in_loop", "with_1_worker"):
        for workload in ("sst", "sst_recorded"):
            r = results[workload]
            assert 0 <= r[f"host_share_{how}"] < 1 and r[f"step_seconds_{how}"] > 0
    # Recorded and walked batches hold the same operation calls.
    assert results["sst_recorded"]["nodes"] == results["sst"]["nodes"]
    assert results["sst_recorded"]["record_seconds"] > 0
    saved = json.loads(out.read_text())
    assert saved["machine"]["cores"] >= 1 and saved["sst"]["nodes"] == results["sst"]["nodes"]
    assert out.with_suffix(".png").stat().st_size > 1000
