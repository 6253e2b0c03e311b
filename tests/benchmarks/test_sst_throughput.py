"""The sst_throughput benchmark runs in --quick mode and its numbers hang together."""

from __future__ import annotations

import importlib.util
import json
import pathlib

import pytest

from benchmarks import sst_throughput

SAMPLE = pathlib.Path(__file__).resolve().parents[1] / "data" / "sst_sample"


@pytest.mark.slow
def test_quick_run(tmp_path):
    out = tmp_path / "sst_throughput.json"
    r = sst_throughput.main(["--quick", "--data-dir", str(SAMPLE), "--json", str(out)])
    (run,) = r["runs"]
    f = run["fold"]
    assert f["trees"] == 64 and f["batches"] == 4
    # End to end cannot beat the device alone; the shares are fractions.
    assert 0 < f["trees_per_s"] <= f["device_trees_per_s"] * 1.05
    assert 0 < f["trees_per_s_recorded"] <= f["device_trees_per_s"] * 1.05 and f["record_s"] > 0
    assert all(0 <= f[f"host_share_{how}"] < 1 for how in ("serial", "workers", "recorded"))
    assert abs(f["host_trees_per_s"] * f["host_s_per_batch"] * f["batches"] - f["trees"]) < 1e-6 * f["trees"]
    j = r["jax_per_tree"]["16"]
    assert j["trees"] == 1 and j["distinct_shapes_in_sample"] == 1 and j["compile_s_per_shape"] > 0
    assert j["distinct_shapes_in_train"] > 100  # the sample's 640 trees come in many shapes
    if importlib.util.find_spec("torch") is not None:
        assert run["torch_eager"]["trees"] == 16 and run["torch_levels"]["trees"] == 64
        assert run["speedup"]["vs_torch_eager"] > 0 and run["speedup"]["vs_torch_levels"] > 0
        assert run["torch_levels_prepared"]["trees"] == 64 and run["speedup"]["recorded_vs_torch_levels_prepared"] > 0
    if importlib.util.find_spec("dynet") is not None:
        assert run["dynet_autobatch"]["trees"] == 32 and run["speedup"]["vs_dynet_autobatch"] > 0
    saved = json.loads(out.read_text())
    assert saved["runs"][0]["fold"]["trees"] == 64 and saved["machine"]["cores"] >= 1
    assert out.with_suffix(".png").stat().st_size > 1000
