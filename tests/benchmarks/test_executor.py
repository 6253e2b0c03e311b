"""The executor benchmark runs in --quick mode; its arena-copy counter finds copies."""

from __future__ import annotations

import json
import pathlib
import random

import jax
import numpy as np
import pytest

import fold as fd
from benchmarks import executor, models

SAMPLE = pathlib.Path(__file__).resolve().parents[1] / "data" / "sst_sample"


HLO = """
%branch_0 (p: f32[264,150]) -> f32[264,150] {
  %copy.1 = f32[264,150]{1,0} copy(%p)
  ROOT %copy.2 = f32[8,150]{1,0} copy(%q)
}

%body (t: (s32[], f32[264,150])) -> (s32[], f32[264,150]) {
  %copy.3 = s32[264]{0} copy(%r)
  %c = f32[264,150]{1,0} conditional(%i, %a), branch_computations={%branch_0}
  %add.1 = f32[264,150]{1,0} add(%a, %b)
}

ENTRY %main (a: f32[264,150]) -> f32[264,150] {
  %copy.4 = f32[264,150]{1,0} copy(%zeros)
  %w = (s32[], f32[264,150]) while(%t), condition=%cond, body=%body
}
"""


def test_arena_copies_counts_whole_arena_copies_inside_loops_only():
    # copy.1 (in a branch the loop body calls); copy.4 runs once, before the loop.
    assert executor.arena_copies(HLO, {(264, 150)}) == 1
    assert executor.arena_copies(HLO, {(8, 150)}) == 1
    assert executor.arena_copies(HLO, {(264, 150), (8, 150), (264,)}) == 3
    # Shapes match whole: an s32[264] buffer is not a [264, 150] arena, nor is f32[264, 150] a
    # scalar arena of 264 rows (counting leading rows alone took per-item buffers for arenas).
    assert executor.arena_copies(HLO, {(264,)}) == 1
    assert executor.arena_copies(HLO, {(264, 15)}) == 0
    assert executor.arena_copies(HLO, {(26, 150), (64, 150)}) == 0
    assert set(executor.loop_computations(HLO)) == {"body", "branch_0"}


@pytest.mark.slow
def test_quick_run(tmp_path):
    out = tmp_path / "executor.json"
    r = executor.main(["--quick", "--data-dir", str(SAMPLE), "--json", str(out)])
    for name in ("sst", "table1", "weave"):
        rows = r["workloads"][name]["rows"]
        assert [row["chunk"] for row in rows] == [8, 64]
        # A larger C cuts the same groups into fewer (or as many) work items.
        assert rows[0]["items"] >= rows[1]["items"] > 0
        # The loops were found (forward and backward, with their switch branches) and copy no arena.
        assert all(row["step_s"] > 0 and row["loop_computations"] > 4 and row["arena_copies"] == 0 for row in rows)
    saved = json.loads(out.read_text())["workloads"]["sst"]
    assert saved["best_chunk"] in (8, 64)
    # An 8-tree SST batch is past the tiny size classes: 128 (CHUNK_SIZES = (32, 128, 512)).
    assert saved["default_chunk"] == 128
    assert out.with_suffix(".png").stat().st_size > 1000


def test_inference_steps_take_turns_and_compute_the_forward_pass():
    block = models.table1_model(8, 16)
    rng = random.Random(0)
    trees = [models.random_tree(rng, 16) for _ in range(3)]
    rows = executor.measure(block, trees, [8, 16], "infer", repeats=2)
    assert [r["chunk"] for r in rows] == [8, 16]
    assert rows[0]["items"] >= rows[1]["items"] > 0
    assert all(r["step_s"] > 0 and r["arena_copies"] == 0 and r["loop_computations"] >= 2 for r in rows)
    compiler = fd.Compiler.create(block, chunk_size=8)
    batch = compiler.build_batch(trees)
    _, run = executor.compile_step(block, trees, 8, "infer")
    np.testing.assert_allclose(run().outputs, compiler.apply(compiler.init(jax.random.key(0)), batch).outputs,
                               rtol=1e-6)
