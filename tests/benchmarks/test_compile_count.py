"""The compile_count benchmark runs in --quick mode and its counts agree."""

from __future__ import annotations

import json
import pathlib

import pytest

from benchmarks import compile_count

SAMPLE = pathlib.Path(__file__).resolve().parents[1] / "data" / "sst_sample"


@pytest.mark.slow
def test_quick_run(tmp_path):
    out = tmp_path / "compile_count.json"
    r = compile_count.main(["--quick", "--data-dir", str(SAMPLE), "--json", str(out)])
    assert r["trees"] == 320 and r["batches"] == 5 and len(r["steps"]) == 5
    # Every distinct layout is compiled exactly once by the jitted step.
    assert r["compilations"] == r["layouts"] == sum(s["new_layout"] for s in r["steps"])
    assert sum(int(v) for v in r["size_classes"].values()) == 5
    assert sum(r["chunks"].values()) == 5 and set(r["chunks"]) <= {"32", "128", "512"}
    assert 0 < r["min_occupancy"] <= r["occupancy"] <= 1
    assert r["saving"] == 0  # the quick model's 16-wide matmuls: too few FLOPs per saved byte to save
    assert json.loads(out.read_text())["layouts"] == r["layouts"]
    assert out.with_suffix(".png").stat().st_size > 1000


@pytest.mark.slow
@pytest.mark.parametrize("workload", ["tagger", "rnnlm"])
def test_quick_sequence_model_epoch_compiles_once_for_its_full_batches(workload, tmp_path):
    out = tmp_path / f"compile_count_{workload}.json"
    r = compile_count.main(["--workload", workload, "--quick", "--data-dir", str(SAMPLE), "--batch-size", "32",
                            "--json", str(out)])
    full = [s for s in r["steps"] if s["examples"] == 32]
    assert r["batches"] == len(r["steps"]) >= 9 and len(full) >= 9
    assert sum(s["new_layout"] for s in full) == 1  # the first full batch's planned layout holds the rest
    assert r["compilations"] == r["layouts"] <= r["goal"] == compile_count.SEQUENCE_GOAL
    assert json.loads(out.read_text())["workload"] == workload


@pytest.mark.slow
def test_quick_random_run(tmp_path):
    """A random model: no more compilations than exact-fit layouts, padding at least exact fit's,
    and a device-time ratio."""
    out = tmp_path / "compile_count_random.json"
    r = compile_count.main(["--workload", "random", "--quick", "--json", str(out)])
    assert len(r["models"]) == 1
    for m in r["models"]:
        assert m["batches"] == 4 and 1 <= m["compilations"] == m["layouts"] <= m["exact_layouts"]
        assert m["compile_seconds"] > 0 and m["padding"] >= m["exact_padding"] >= 1
        assert m["device_ratio"] > 0
    assert r["summary"]["max_compilations"] == max(m["compilations"] for m in r["models"])
    assert json.loads(out.read_text())["summary"] == r["summary"]
    assert out.with_suffix(".png").stat().st_size > 1000
