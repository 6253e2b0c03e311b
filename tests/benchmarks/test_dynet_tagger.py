"""``benchmarks.dynet_tagger`` trains the tagger in fold and in DyNet on the same batches."""

from __future__ import annotations

import math

import pytest

from benchmarks import dynet_tagger
from tests.benchmarks.conftest import SAMPLE


@pytest.mark.slow
def test_quick_run_times_both(tmp_path):
    pytest.importorskip("dynet")
    result = dynet_tagger.main(["--quick", "--data-dir", str(SAMPLE), "--json", str(tmp_path / "d.json")])
    (run,) = result["runs"]
    rate = run["sentences_per_s"]
    assert set(rate) == {"fold", "DyNet autobatch"} and min(rate.values()) > 0
    assert run["fold_vs_dynet"] == pytest.approx(rate["fold"] / rate["DyNet autobatch"])
    # Summed per-word cross-entropies of 5 tags over a batch of 8 sentences, from random weights.
    assert all(0 < loss < 8 * 60 * math.log(5) * 2 for loss in run["mean_loss"].values())
    assert (tmp_path / "d.png").exists()
