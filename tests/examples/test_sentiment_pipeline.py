"""SST loading and the sentiment pipeline in --quick mode (on a committed SST sample)."""

from __future__ import annotations

import pathlib

import pytest

from examples import sentiment_pipeline, sst

SAMPLE = pathlib.Path(__file__).resolve().parents[1] / "data" / "sst_sample"


def test_parse_tree_and_words():
    tree = sst.parse_tree("(3 (2 The) (4 (3 good) (2 film)))")
    assert tree == (3, (2, "The"), (4, (3, "good"), (2, "film")))
    assert sst.words(tree) == ["The", "good", "film"]
    with pytest.raises(ValueError):
        sst.parse_tree("(3 (2 The)")
    # A word with a non-breaking space inside stays one word (SST train line 4342).
    assert sst.parse_tree("(2 8\xa01\\/2)") == (2, "8\xa01\\/2")


def test_load_sample_and_vocabulary():
    trees = sst.load("train", SAMPLE)
    assert len(trees) == 640 and all(0 <= t[0] <= 4 for t in trees)
    vocab = sst.vocabulary(trees)
    assert vocab["the"] < 5 and len(vocab) > 1000
    with pytest.raises(FileNotFoundError):
        sst.load("nope", SAMPLE)


def test_quick_run_learns(tmp_path):
    report = sentiment_pipeline.main(["--quick", "--quiet", "--checkpoint-dir", str(tmp_path),
                                      "--data-dir", str(SAMPLE),
                                      "--json", str(tmp_path / "s.json")])
    history = report["history"]
    assert history[-1]["train_loss"] < history[0]["train_loss"]
    for split in ("dev", "test"):
        assert 0.1 < report["results"][split]["fine"] <= 1.0
        assert 0.3 < report["results"][split]["binary"] <= 1.0
