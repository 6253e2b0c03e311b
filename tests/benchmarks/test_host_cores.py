"""The host-cores benchmark runs in --quick mode: each setting in a fresh process, both models."""

from __future__ import annotations

import json

import pytest

from benchmarks import host_cores


def test_quick_run(tmp_path):
    out = tmp_path / "host_cores.json"
    r = host_cores.main(["--quick", "--json", str(out)])
    assert [(row["model"], row["batch_size"]) for row in r["runs"]] == [("tagger", 8), ("sst", 8)]
    for row in r["runs"]:
        for reserved in (0, 1):
            # Times only: how they compare is the benchmark's to say, on a quiet machine (a loop
            # once measured faster than its step alone while another process ran).
            assert row[f"loop_ms_reserved_{reserved}"] > 0 and row[f"step_ms_reserved_{reserved}"] > 0
            assert row[f"build_ms_reserved_{reserved}"] > 0
        assert row["loop_gain"] == pytest.approx(row["loop_ms_reserved_0"] / row["loop_ms_reserved_1"])
        assert row["step_cost"] == pytest.approx(row["step_ms_reserved_1"] / row["step_ms_reserved_0"])
    saved = json.loads(out.read_text())
    assert saved["runs"] == r["runs"] and saved["reserve_cores"] == 0
    assert out.with_suffix(".png").stat().st_size > 1000
