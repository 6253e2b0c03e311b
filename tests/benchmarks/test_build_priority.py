"""The build priority benchmark runs in --quick mode and reads its runs' specs strictly."""

from __future__ import annotations

import json
import pathlib

import pytest

from benchmarks import build_priority

SAMPLE = pathlib.Path(__file__).resolve().parents[1] / "data" / "sst_sample"


@pytest.mark.slow
def test_quick_run(tmp_path):
    out = tmp_path / "build_priority.json"
    r = build_priority.main(["--quick", "--data-dir", str(SAMPLE), "--json", str(out)])
    assert [(x["model"], x["batch_size"]) for x in r["runs"]] == [("sst", 4), ("treenn", 4), ("tagger", 4)]
    for run in r["runs"]:
        rate = run["examples_per_s"]
        assert min(rate.values()) > 0 and run["speedup"] == rate["nicer"] / rate["plain"]
        assert [len(s) for s in run["seconds"].values()] == [1, 1]
    assert json.loads(out.read_text())["niceness"] == 10
    assert out.with_suffix(".png").stat().st_size > 1000


@pytest.mark.parametrize("spec", ["sst", "sst:", "sst:0", "lstm:16", "tagger:x"])
def test_a_malformed_run_is_a_usage_error(spec, capsys):
    with pytest.raises(SystemExit):
        build_priority.parse_args(["--runs", spec])
    assert "expected MODEL:BATCH" in capsys.readouterr().err


def test_the_niceness_stays_in_range(capsys):
    for bad in ("0", "20"):
        with pytest.raises(SystemExit):
            build_priority.parse_args(["--niceness", bad])
    assert build_priority.parse_args(["--niceness", "19"]).niceness == 19
