"""The executor benchmark runs in --quick mode; its arena-copy counter finds copies."""

from __future__ import annotations

import json
import pathlib

from benchmarks import executor

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
    # copy.1 (in a branch the loop body calls) and copy.3; copy.4 runs once, before the loop.
    assert executor.arena_copies(HLO, 264) == 2
    assert executor.arena_copies(HLO, 8) == 1
    assert executor.arena_copies(HLO, {264, 8}) == 3
    assert set(executor.loop_computations(HLO)) == {"body", "branch_0"}


def test_quick_run(tmp_path):
    out = tmp_path / "executor.json"
    r = executor.main(["--quick", "--data-dir", str(SAMPLE), "--json", str(out)])
    for name in ("sst", "table1"):
        rows = r["workloads"][name]["rows"]
        assert [row["chunk"] for row in rows] == [8, 64]
        # A larger C cuts the same groups into fewer (or as many) work items.
        assert rows[0]["items"] >= rows[1]["items"] > 0
        # The loops were found (forward and backward, with their switch branches) and copy no arena.
        assert all(row["step_s"] > 0 and row["loop_computations"] > 4 and row["arena_copies"] == 0 for row in rows)
    assert json.loads(out.read_text())["workloads"]["sst"]["best_chunk"] in (8, 64)
    assert out.with_suffix(".png").stat().st_size > 1000
