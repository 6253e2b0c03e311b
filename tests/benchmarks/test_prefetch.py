"""The prefetch benchmark runs in --quick mode and reports what the thread hid."""

from __future__ import annotations

import json

import pytest

from benchmarks import prefetch


def test_quick_run(tmp_path):
    out = tmp_path / "prefetch.json"
    r = prefetch.main(["--quick", "--json", str(out)])
    (row,) = r["rows"]
    assert row["step_ms"] == pytest.approx(row["step_ratio"] * row["host_ms"])
    assert row["ideal_ms"] == pytest.approx(max(row["host_ms"], row["step_ms"]))
    assert row["in_caller_ms"] >= row["step_ms"] and row["prefetched_ms"] >= row["step_ms"]  # each step waits
    assert row["hidden"] == pytest.approx((row["in_caller_ms"] - row["prefetched_ms"])
                                          / (row["in_caller_ms"] - row["ideal_ms"]))
    assert json.loads(out.read_text())["rows"] == r["rows"]
    assert out.with_suffix(".png").stat().st_size > 1000
