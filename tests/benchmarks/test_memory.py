"""The memory benchmark runs in --quick mode and its byte counts are consistent."""

from __future__ import annotations

import json
import pathlib

import jax.numpy as jnp
import numpy as np
import pytest

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


@pytest.mark.slow
@pytest.mark.parametrize("backward", ["auto", "save"])
def test_quick_run(tmp_path, backward):
    out = tmp_path / "memory.json"
    r = memory.main(["--quick", "--data-dir", str(SAMPLE), "--json", str(out), "--backward", backward])
    assert len(r["batches"]) == 2
    for b in r["batches"]:
        assert b["trees"] == 32 and 0 < b["occupancy"] <= 1
        # auto: the quick model's 16-wide cell costs too few FLOPs per saved byte to be worth saving.
        assert b["saves"] == (backward == "save")
        # Real rows fit in the allocated arenas; float rows are part of all rows.
        assert 0 < b["float_activation_bytes"] <= b["activation_bytes"] < b["arena_bytes"]
        assert b["temp_bytes"] > 0 and np.isclose(b["ratio"], b["temp_bytes"] / b["activation_bytes"])
        # Liveness never needs more than the arenas allocated for every row.
        assert 0 < b["ct_peak_bytes"] <= b["ct_arena_bytes"]
        assert b["shared_peak_bytes"] <= b["arena_bytes"] + b["ct_peak_bytes"]
        assert b["shared_floor"] <= b["shared_ratio"] <= b["ct_live_ratio"] <= b["ratio"]
        # Deferring the readout's backward to its cells' stages lowers the peak to the activations.
        assert b["deferred_peak_bytes"] < b["shared_peak_bytes"] and b["deferred_ratio"] < b["shared_ratio"]
    assert r["worst_ratio"] == max(b["ratio"] for b in r["batches"])
    assert json.loads(out.read_text())["goal"] == memory.GOAL
    assert out.with_suffix(".png").stat().st_size > 1000


def test_a_training_step_keeps_no_second_copy_of_tail_inputs():
    # XLA's buffer assignment is exact for the compiled program (no timing
    # noise). The step needs the forward arenas and their cotangents (2x
    # the float arena bytes) plus per-group buffers; it measured 2.65x.
    # Keeping each hoisted/tail group's gathered input rows for its backward
    # (instead of gathering them again) measured 2.94x.
    import jax
    import optax

    from benchmarks import models
    from benchmarks.common import make_train_step
    from examples import sst

    trees = sst.load("train", SAMPLE)
    compiler = fd.Compiler.create(models.sst_model(sst.vocabulary(trees), state_size=150, embed_size=100),
                                  backward="recompute")
    params = compiler.init(jax.random.key(0))
    optimizer = optax.sgd(0.05)
    b = memory.measure(compiler, make_train_step(compiler, optimizer), params, optimizer.init(params), trees[:64])
    assert b["temp_bytes"] < 2.8 * b["float_arena_bytes"]


def test_liveness_of_a_chain_counted_by_hand():
    # One example [1, 2, 3]: constants x1..x3 and the initial state s0, then f1 = cell(s0, x1),
    # f2 = cell(f1, x2), f3 = cell(f2, x3); the loss reads f3. Backward: f3, f2, f1.
    model = (fd.Map(fd.Scalar()) >> fd.Fold(fd.Function(lambda s, x: jnp.tanh(s + x)), fd.FromTensor(np.float32(0)))
             >> fd.Metric("loss") >> fd.Void())
    compiler = fd.Compiler.create(model)
    batch = compiler.build_batch([[1.0, 2.0, 3.0]])
    stages = memory._backward_stages(compiler, batch)
    assert [nodes.tolist() for _, nodes, _ in stages] == [[2], [1], [0]]
    live = memory.liveness(compiler, batch)
    # Cotangents: f3's from the loss to its stage, f2's from f3's stage to its own, f1's likewise;
    # the constants' are never read. At most two at once, of 4 bytes each.
    assert live["ct_peak_bytes"] == 2 * 4
    # At the start all 7 values are live with f3's cotangent: 8 rows (then f3's value is dead).
    assert live["shared_peak_bytes"] == 8 * 4
    # The three cells are tail groups here, of constants: deferred to the start, all 10 at once.
    assert live["deferred_peak_bytes"] == 10 * 4
    assert live["ct_arena_bytes"] == (batch.layout.arena_rows[0] + batch.layout.chunk) * 4


def test_bounds_add_the_other_temporaries():
    live = {"ct_arena_bytes": 40, "ct_peak_bytes": 10, "shared_peak_bytes": 60, "deferred_peak_bytes": 50}
    b = memory.bounds(live, temp=150, arena=50, activation=50)
    assert b["other_bytes"] == 60
    assert b["ct_live_ratio"] == (50 + 10 + 60) / 50 and b["shared_ratio"] == (60 + 60) / 50
    assert b["shared_floor"] == 60 / 50 and b["deferred_ratio"] == (50 + 60) / 50
