"""The memory benchmark runs in --quick mode and its byte counts are consistent."""

from __future__ import annotations

import json
import pathlib

import numpy as np

import fold as fd
from benchmarks import memory

SAMPLE = pathlib.Path(__file__).resolve().parents[1] / "data" / "sst_sample"


def test_row_bytes():
    assert memory.row_bytes(fd.TensorType((3, 4), "float32")) == 48
    assert memory.row_bytes(fd.TensorType((), "int32")) == 4


def test_type_rows_count_every_arena_row():
    compiler = fd.Compiler.create(fd.Map(fd.Scalar() >> fd.Function(lambda x: 2 * x)) >> fd.Sum())
    stats = compiler.build_batch([[1.0, 2.0, 3.0], [4.0]]).stats
    # One arena type: 4 constants, 4 doubles, 2 sums.
    assert stats.type_rows == (10,) and stats.rows == 10


def test_quick_run(tmp_path):
    out = tmp_path / "memory.json"
    r = memory.main(["--quick", "--data-dir", str(SAMPLE), "--json", str(out)])
    assert len(r["batches"]) == 2
    for b in r["batches"]:
        assert b["trees"] == 32 and 0 < b["occupancy"] <= 1
        # Real rows fit in the allocated arenas; float rows are part of all rows.
        assert 0 < b["float_activation_bytes"] <= b["activation_bytes"] < b["arena_bytes"]
        assert b["temp_bytes"] > 0 and np.isclose(b["ratio"], b["temp_bytes"] / b["activation_bytes"])
    assert r["worst_ratio"] == max(b["ratio"] for b in r["batches"])
    assert json.loads(out.read_text())["goal"] == memory.GOAL
    assert out.with_suffix(".png").stat().st_size > 1000
