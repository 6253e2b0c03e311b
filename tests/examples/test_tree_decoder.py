"""The top-down Tree-LSTM example: tree shapes, its per-decision losses against plain JAX, generation
from its start states, and a quick run."""

from __future__ import annotations

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fold as fd
from examples import tree_decoder

SAMPLE = pathlib.Path(__file__).resolve().parents[1] / "data" / "sst_sample"


def test_shapes_drop_phrase_labels_and_map_words():
    tree = (3, (2, "The"), (4, (3, "good"), (2, "film")))
    word_idx = {"<unk>": 0, "good": 1, "the": 2}
    assert tree_decoder.shape(tree, word_idx) == (0, (1, 0))
    assert tree_decoder.examples_of([tree], word_idx) == [(3, (0, (1, 0)))]


def _lstm(p, x, c, h):
    z = jnp.concatenate([x, h]) @ p["w"] + p["b"]
    i, f, g, o = jnp.split(z, 4)
    c = jax.nn.sigmoid(f + 1.0) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
    return c, jax.nn.sigmoid(o) * jnp.tanh(c)


def _reference(p, sentiment, tree):
    """Per decision in preorder, its negative log-probability, in plain JAX."""
    c, h = jnp.split(p["start"]["table"][sentiment], 2)
    out = []

    def visit(node, c, h):
        expand = jax.nn.log_softmax(h @ p["expand"]["w"] + p["expand"]["b"])
        if not isinstance(node, tuple):
            out.extend([-expand[0], -jax.nn.log_softmax(h @ p["word"]["w"] + p["word"]["b"])[node]])
            return
        out.append(-expand[1])
        states, sc, sh = [], jnp.zeros_like(c), jnp.zeros_like(h)
        for _ in node:
            sc, sh = _lstm(p["child"], h, sc, sh)
            states.append((sc, sh))
        for kid, (kc, kh) in zip(node, states):
            visit(kid, kc, kh)

    visit(tree, c, h)
    return out


def test_losses_match_plain_jax_and_generation_starts_from_the_sentiment():
    args = tree_decoder.parse_args(["--hidden", "3", "--max-levels", "3", "--max-nodes", "9"])
    decoder = tree_decoder.build_decoder(4, args)
    compiler = fd.Compiler.create(tree_decoder.build_model(decoder, args))
    params = compiler.init(jax.random.key(0))
    examples = [(4, ((1, 2), 3)), (0, 2), (2, (0, (1, (2, 3))))]
    losses = compiler.apply(params, compiler.build_batch(examples)).metrics["loss"].values
    want = [v for s, t in examples for v in _reference(params, s, t)]
    np.testing.assert_allclose(np.asarray(losses), want, rtol=1e-5, atol=1e-6)
    # Generated trees score, through the model, what generation said they would.
    sentiments = np.array([0, 3, 4, 4])
    out = fd.Generator(decoder).generate(params, tree_decoder.start_states(params, sentiments), jax.random.key(1))
    generated = [(int(s), t) for s, t in zip(sentiments, out.trees())]
    result = compiler.apply(params, compiler.build_batch(generated)).metrics["loss"]
    per_example = np.bincount(np.asarray(result.example)[np.asarray(result.mask)], np.asarray(result.values))
    np.testing.assert_allclose(-per_example, out.log_prob, rtol=1e-5, atol=1e-5)


@pytest.mark.slow  # 20-40 s; the test above checks the model in CI
def test_quick_run_trains_and_generates(tmp_path):
    report = tree_decoder.main(["--quick", "--quiet", "--checkpoint-dir", str(tmp_path), "--data-dir", str(SAMPLE),
                                "--json", str(tmp_path / "t.json")])
    history = report["history"]
    assert history[-1]["train_loss"] < history[0]["train_loss"]
    assert report["generated_mean_nodes"] >= 1 and 0 <= report["generated_truncated"] <= 1
    assert len(report["examples"]) == 5 and np.isfinite(report["generated_loss"])


def test_tree_layout_puts_leaves_in_order_and_pairs_over_their_children():
    from examples.tree_decoder import tree_layout

    nodes, edges = tree_layout(((1, 2), 3))
    assert nodes == [(1.25, 0.0, None), (0.5, -1.0, None), (0.0, -2.0, 1), (1.0, -2.0, 2), (2.0, -1.0, 3)]
    assert edges == [(0, 1), (1, 2), (1, 3), (0, 4)]
    assert tree_layout(7) == ([(0.0, 0.0, 7)], [])
    deep = 0
    for _ in range(5000):  # deeper than Python's recursion limit
        deep = (deep, 1)
    nodes, edges = tree_layout(deep)
    assert len(nodes) == 10001 and len(edges) == 10000 and min(y for _, y, _ in nodes) == -5000.0
