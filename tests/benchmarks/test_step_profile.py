"""``benchmarks.step_profile`` accounts for a step's op time by kind of work."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import fold as fd
from benchmarks import models, step_profile
from examples import sst
from tests.benchmarks.conftest import SAMPLE


@pytest.mark.parametrize(("name", "kind"), [
    ("ynn_fusion.17", "matmul"), ("dot.5", "matmul"), ("wrapped_scatter.7", "scatter"),
    ("gather_bitcast_fusion.28", "gather"), ("select_dynamic-update-slice_fusion", "dynamic slices"),
    ("wrapped_broadcast.3", "filling buffers"), ("cond.13", "switch dispatch"), ("while.51", "loop control"),
    ("copy.102", "copies"), ("add_tanh_fusion.4", step_profile.OTHER)])
def test_kinds_of_xla_op_names(name, kind):
    assert step_profile.kind(name) == kind


def test_exclusive_time_subtracts_nested_ops_per_thread():
    events = [{"ph": "X", "name": "cond.1", "ts": 0, "dur": 10, "tid": 1},
              {"ph": "X", "name": "dot.1", "ts": 2, "dur": 3, "tid": 1},
              {"ph": "X", "name": "dot.1", "ts": 6, "dur": 2, "tid": 1},
              {"ph": "X", "name": "dot.1", "ts": 1, "dur": 4, "tid": 2},
              {"ph": "X", "name": "ThunkExecutor::Execute", "ts": 0, "dur": 50, "tid": 1}]
    assert step_profile.exclusive_times(events) == {"cond.1": 5, "dot.1": 9}
    assert step_profile.calls(events)["dot.1"] == 3


@pytest.mark.slow
def test_quick_profile_adds_up(tmp_path):
    result = step_profile.main(["--quick", "--batch-sizes", "8", "--repeats", "2", "--json", str(tmp_path / "p.json")])
    run = result["runs"][0]
    assert sum(k["ms"] for k in run["kinds"].values()) == pytest.approx(run["op_ms"])
    assert run["kinds"]["matmul"]["ms"] > 0 and run["matmul_need_ms"] > 0 and run["nodes"] > 8
    ops = run["largest_ops"]
    assert len(ops) == 10 and [o["ms"] for o in ops] == sorted((o["ms"] for o in ops), reverse=True)
    for o in ops:  # every op of the step ran at least once a step, and its time is its runs' time
        assert o["calls"] >= 1 and o["us_per_call"] * o["calls"] == pytest.approx(o["ms"] * 1000)
        assert o["kind"] in {k for k, _ in step_profile.KINDS} | {step_profile.OTHER}
    assert sum(o["ms"] for o in ops) <= run["op_ms"] + 1e-9
    # The cells' element-wise work and the loss come on top of the matmuls.
    assert run["cell_need_ms"] > 0 and run["step_vs_cell_need"] == pytest.approx(run["step_ms"] / run["cell_need_ms"])
    assert set(run["products_alone_us"]) == {"x·W", "xᵀ·dY", "dY·Wᵀ"}
    assert all(us > 0 for us in run["products_alone_us"].values())


def test_op_rows_count_every_node_once():
    """The cell need runs each operation on exactly the rows the batch runs it on."""
    trees = sst.load("train", SAMPLE)[:12]
    compiler = fd.Compiler.create(models.sst_model(sst.vocabulary(trees), 6, 4), chunk_size=8)
    batch = compiler.build_batch(trees)
    rows = step_profile.op_rows(compiler, batch)
    assert sum(rows.values()) == batch.stats.num_nodes
    cell = next(o for o, op in enumerate(compiler.executor.ops) if isinstance(op.layer, fd.BinaryTreeLSTMCell))
    assert rows[cell] == sum(map(sst.nodes, trees))  # leaves too run the cell, on zero child states
    total, (param_grads, _) = step_profile.cell_need(compiler, compiler.init(jax.random.key(0)), batch)()
    assert np.isfinite(float(total)) and set(param_grads) == set(compiler.init(jax.random.key(0)))
