"""The sentence decoder example: per-word losses against plain JAX, generation from its start
states, and a quick run."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fold as fd
from examples import sentence_decoder, tree_decoder
from tests.examples.test_tree_decoder import SAMPLE, _lstm


def _reference(p, sentiment, words):
    """Per word and for the end, its negative log-probability, in plain JAX."""
    c, h = jnp.split(p["start"]["table"][sentiment], 2)
    out = []
    for w in [*words, 0]:
        out.append(-jax.nn.log_softmax(h @ p["word"]["w"] + p["word"]["b"])[w])
        c, h = _lstm(p["lstm"], p["embedding"]["table"][w], c, h)
    return out


def test_examples_map_words_and_losses_match_plain_jax():
    tree = (3, (2, "The"), (4, (3, "good"), (2, "film")))
    assert sentence_decoder.examples_of([tree], {"<end>": 0, "<unk>": 1, "good": 2}) == [(3, [1, 2, 1])]
    args = sentence_decoder.parse_args(["--hidden", "3", "--embedding", "2", "--max-length", "6"])
    decoder = sentence_decoder.build_decoder(5, args)
    compiler = fd.Compiler.create(sentence_decoder.build_model(decoder, args))
    params = compiler.init(jax.random.key(0))
    examples = [(4, [1, 2, 3]), (0, []), (2, [4, 4])]
    losses = compiler.apply(params, compiler.build_batch(examples)).metrics["loss"].values
    want = [v for s, words in examples for v in _reference(params, s, words)]
    np.testing.assert_allclose(np.asarray(losses), want, rtol=1e-5, atol=1e-6)
    sentiments = np.array([1, 3, 3])
    out = fd.Generator(decoder).generate(params, tree_decoder.start_states(params, sentiments),
                                         jax.random.key(2))
    kept = np.asarray(out.ended)
    generated = [(int(s), seq) for s, seq, e in zip(sentiments, out.sequences(), kept) if e]
    assert generated
    result = compiler.apply(params, compiler.build_batch(generated)).metrics["loss"]
    per_example = np.bincount(np.asarray(result.example)[np.asarray(result.mask)], np.asarray(result.values))
    np.testing.assert_allclose(-per_example, np.asarray(out.log_prob)[kept], rtol=1e-5, atol=1e-5)


@pytest.mark.slow  # 20-40 s; the test above checks the model in CI
def test_quick_run_trains_and_generates(tmp_path):
    report = sentence_decoder.main(["--quick", "--quiet", "--checkpoint-dir", str(tmp_path), "--data-dir",
                                    str(SAMPLE), "--json", str(tmp_path / "s.json")])
    assert report["history"][-1]["train_loss"] < report["history"][0]["train_loss"]
    assert 0 <= report["generated_cut"] <= 1 and len(report["examples"]) == 5
