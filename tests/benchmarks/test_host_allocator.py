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
    assert row["batch_size"] == 16 and row["temp_bytes"] > 0
    for what in ("step_seconds", "loop_seconds"):
        assert set(row[what]) == set(host_allocator.VARIANTS) and min(row[what].values()) > 0
    for name in ("kept", "huge_pages", "kept_huge_pages"):
        assert row["step_speedup"][name] == row["step_seconds"]["glibc"] / row["step_seconds"][name]
        assert row["loop_speedup"][name] == row["loop_seconds"]["glibc"] / row["loop_seconds"][name]
    assert min(row["faults_per_step"].values()) >= 0
    assert min(row["max_rss_bytes"].values()) > 100 * 2**20  # an interpreter with JAX loaded
    # Each child started with exactly the variables of its variant.
    for name, env in host_allocator.VARIANTS.items():
        want = {k: env.get(k) for k in host_allocator.ALLOCATOR_VARIABLES}
        assert [x["env"] for x in row["runs"][name]] == [want]
    assert json.loads(out.read_text())["variants"] == host_allocator.VARIANTS
    assert out.with_suffix(".png").stat().st_size > 1000
