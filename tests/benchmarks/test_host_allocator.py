"""The host allocator benchmark runs in --quick mode, and its children start with the right variables."""

from __future__ import annotations

import json
import pathlib

import pytest

from benchmarks import host_allocator

SAMPLE = pathlib.Path(__file__).resolve().parents[1] / "data" / "sst_sample"


@pytest.mark.slow
def test_quick_run(tmp_path, monkeypatch):
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "123")  # the parent's own setting must not leak
    out = tmp_path / "host_allocator.json"
    r = host_allocator.main(["--quick", "--data-dir", str(SAMPLE), "--json", str(out)])
    (row,) = r["rows"]
    assert row["batch_size"] == 16 and row["backward"] == "recompute"
    assert row["temp_bytes"] > 0 and row["default_s"] > 0 and row["keep_blocks_s"] > 0
    assert row["speedup"] == row["default_s"] / row["keep_blocks_s"]
    assert row["default_faults"] >= 0 and row["keep_blocks_faults"] >= 0
    # Each child started with exactly the variables of its side.
    assert [x["env"] for x in row["runs"]["keep_blocks"]] == [host_allocator.KEEP_BLOCKS]
    assert [x["env"] for x in row["runs"]["default"]] == [{k: None for k in host_allocator.KEEP_BLOCKS}]
    assert json.loads(out.read_text())["keep_blocks_env"] == host_allocator.KEEP_BLOCKS
    assert out.with_suffix(".png").stat().st_size > 1000
