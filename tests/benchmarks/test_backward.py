"""The backward benchmark runs in --quick mode and reports every mode of every batch."""

from __future__ import annotations

import json
import pathlib

import pytest

from benchmarks import backward
from fold.compiler.saving import BACKWARDS

SAMPLE = pathlib.Path(__file__).resolve().parents[1] / "data" / "sst_sample"


@pytest.mark.slow
def test_quick_run(tmp_path):
    out = tmp_path / "backward.json"
    r = backward.main(["--quick", "--data-dir", str(SAMPLE), "--json", str(out)])
    assert set(r["workloads"]) == {"sst", "table1", "weave"}
    for rows in r["workloads"].values():
        (row,) = rows
        assert row["nodes"] > row["examples"] > 0
        assert set(row["step_s"]) == set(row["temp_bytes"]) == set(BACKWARDS)
        assert all(t > 0 for t in row["step_s"].values())
        # Saving keeps more than recomputing, about its buffers' bytes more; auto does not save these
        # tiny models' narrow matmuls (8-16 wide: too few FLOPs per saved byte), so it recomputes.
        assert row["temp_bytes"]["save"] > row["temp_bytes"]["recompute"]
        assert row["saves"] == {"auto": False, "recompute": False, "save": True}
        assert row["temp_bytes"]["auto"] == row["temp_bytes"]["recompute"]
        assert 0 < row["saved_bytes"] <= row["temp_bytes"]["save"]
    assert json.loads(out.read_text())["args"]["modes"] == list(BACKWARDS)
    assert out.with_suffix(".png").stat().st_size > 1000


def test_bad_arguments_are_rejected():
    with pytest.raises(SystemExit):
        backward.parse_args(["--sst-batches", "0"])
