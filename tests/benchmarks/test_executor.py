"""The executor benchmark runs in --quick mode; its arena-copy counter finds copies."""

from __future__ import annotations

import json
import pathlib

from benchmarks import executor

SAMPLE = pathlib.Path(__file__).resolve().parents[1] / "data" / "sst_sample"


def test_arena_copies_matches_whole_arena_shapes_only():
    hlo = """
  %copy.1 = f32[264,150]{1,0} copy(%p)
  %copy.2 = f32[8,150]{1,0} copy(%q)
  %copy.3 = s32[264]{0} copy(%r)
  %add.1 = f32[264,150]{1,0} add(%a, %b)
"""
    assert executor.arena_copies(hlo, 264) == 2
    assert executor.arena_copies(hlo, 8) == 1


def test_quick_run(tmp_path):
    out = tmp_path / "executor.json"
    r = executor.main(["--quick", "--data-dir", str(SAMPLE), "--json", str(out)])
    for name in ("sst", "table1"):
        rows = r["workloads"][name]["rows"]
        assert [row["chunk"] for row in rows] == [8, 64]
        # A larger C cuts the same groups into fewer (or as many) work items.
        assert rows[0]["items"] >= rows[1]["items"] > 0
        assert all(row["step_s"] > 0 and row["arena_copies"] == 0 for row in rows)
    assert json.loads(out.read_text())["workloads"]["sst"]["best_chunk"] in (8, 64)
    assert out.with_suffix(".png").stat().st_size > 1000
