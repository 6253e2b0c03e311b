"""The BiLSTM tagger with character LSTMs: per-word losses against NumPy, and a quick run."""

from __future__ import annotations

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fold as fd
from examples import tagger
from tests.blocks.test_sequences import _lstm_np

SAMPLE = pathlib.Path(__file__).resolve().parents[1] / "data" / "sst_sample"


def _reference(p: dict, example: dict, word_idx: dict, char_idx: dict) -> list[float]:
    """Per word: the cross-entropy of its tag, from the model's equations in NumPy."""
    vectors = []
    for w in example["words"]:
        if w in word_idx:
            vectors.append(p["word_embedding"]["table"][word_idx[w]])
            continue
        cs = [p["char_embedding"]["table"][char_idx.get(ch, 0)] for ch in w]
        forward, backward = _lstm_np(p["char_forward"], cs)[-1], _lstm_np(p["char_backward"], cs[::-1])[-1]
        vectors.append(np.concatenate([forward, backward]))
    fw, bw = _lstm_np(p["forward"], vectors), _lstm_np(p["backward"], vectors[::-1])[::-1]
    losses = []
    for f, b, tag in zip(fw, bw, example["tags"]):
        z = np.tanh(np.concatenate([f, b]) @ p["mlp_hidden"]["w"]) @ p["mlp_out"]["w"]
        losses.append(float(np.log(np.sum(np.exp(z - z.max()))) + z.max() - z[tag]))
    return losses


def test_tagged_words_pair_each_word_with_its_leaf_label():
    tree = (3, (2, "The"), (4, (3, "good"), (2, "film")))
    assert tagger.tagged_words(tree) == [("The", 2), ("good", 3), ("film", 2)]
    assert tagger.examples_of([tree]) == [{"words": ["The", "good", "film"], "tags": [2, 3, 2]}]


def test_per_word_losses_match_numpy():
    args = tagger.parse_args(["--word-size", "6", "--hidden", "4", "--mlp-size", "3", "--char-size", "2"])
    word_idx = {"the": 0, "film": 1}
    char_idx = {ch: i + 1 for i, ch in enumerate("abcdefghijklmnopqrstuvwxyz")}
    compiler = fd.Compiler.create(tagger.build_model(word_idx, char_idx, args))
    params = compiler.init(jax.random.key(0))
    p = {name: {k: np.asarray(v, np.float64) + 0.05 for k, v in ps.items()} for name, ps in params.items()}
    # Frequent words, rare ones (char LSTMs, with a character the table lacks), sentences of one word.
    examples = [{"words": ["the", "gooD", "film"], "tags": [2, 3, 2]}, {"words": ["x"], "tags": [4]},
                {"words": ["film", "the", "ok!", "the"], "tags": [1, 0, 2, 2]}]
    losses = compiler.apply(jax.tree.map(jnp.float32, p), compiler.build_batch(examples)).metrics["loss"].values
    want = [loss for e in examples for loss in _reference(p, e, word_idx, char_idx)]
    np.testing.assert_allclose(np.asarray(losses), want, rtol=1e-4, atol=1e-5)


@pytest.mark.slow  # 30-55 s; test_per_word_losses_match_numpy checks the model in CI
def test_quick_run_trains(tmp_path):
    report = tagger.main(["--quick", "--quiet", "--checkpoint-dir", str(tmp_path), "--data-dir", str(SAMPLE),
                          "--json", str(tmp_path / "t.json")])
    history = report["history"]
    assert history[-1]["train_loss"] < history[0]["train_loss"]
    assert 0.5 < report["results"]["dev"] <= 1.0 and 0 < report["rare_word_share"] < 1
    assert report["layouts"] >= 1
