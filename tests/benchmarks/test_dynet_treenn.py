"""``benchmarks.dynet_treenn``: the suite's Tree-LSTM in fold against a per-tree reference, and
its DyNet peer computing the same loss from the same parameters."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fold as fd
from benchmarks import dynet_treenn
from examples import sst
from tests.benchmarks.conftest import SAMPLE


@pytest.fixture(scope="module")
def treenn():
    # Short trees keep the unbatched reference (a Python recursion over JAX ops) quick.
    trees = sorted(sst.load("train", SAMPLE), key=lambda t: len(sst.words(t)))[:5]
    word_idx = dynet_treenn.vocabulary(trees[:3])  # the last two trees have unknown words
    compiler = fd.Compiler.create(dynet_treenn.build_model(word_idx, word_size=6, hidden=5))
    return trees, word_idx, compiler, compiler.init(jax.random.key(3))


def reference_loss(params, word_idx, trees):
    """The summed node losses, tree by tree and node by node in plain JAX."""
    p = params

    def node(t):
        if len(t) == 2:
            x = p["treenn_embedding"]["table"][word_idx.get(t[1], 0)]
            i, o, u = jnp.split(x @ p["treenn_leaf"]["w"] + p["treenn_leaf"]["b"], 3)
            c, losses = jax.nn.sigmoid(i) * jnp.tanh(u), []
        else:
            (c_l, h_l, l_l), (c_r, h_r, l_r) = node(t[1]), node(t[2])
            q = p["treenn_pair"]
            i, o, u = jnp.split(jnp.concatenate([h_l, h_r]) @ q["u"] + q["b"], 3)
            f_l = jax.nn.sigmoid(h_l @ q["f_left"] + q["b_f"])
            f_r = jax.nn.sigmoid(h_r @ q["f_right"] + q["b_f"])
            c, losses = jax.nn.sigmoid(i) * jnp.tanh(u) + f_l * c_l + f_r * c_r, l_l + l_r
        h = jax.nn.sigmoid(o) * jnp.tanh(c)
        logits = h @ p["treenn_readout"]["w"]
        return c, h, [*losses, jax.nn.logsumexp(logits) - logits[t[0]]]

    return sum(sum(node(t)[2]) for t in trees)


def test_fold_model_matches_a_per_tree_reference(treenn):
    trees, word_idx, compiler, params = treenn
    batch = compiler.build_batch(trees)
    out = compiler.apply(params, batch)
    assert out.metrics["loss"].values.shape == (sum(sst.nodes(t) for t in trees),)

    def loss(p):
        return compiler.apply(p, batch).metrics["loss"].sum()

    value, grads = jax.jit(jax.value_and_grad(loss))(params)
    want, want_grads = jax.jit(jax.value_and_grad(lambda p: reference_loss(p, word_idx, trees)))(params)
    np.testing.assert_allclose(value, want, rtol=1e-5)
    for got, ref in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(want_grads)):
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-6)
    assert float(jnp.abs(grads["treenn_pair"]["f_left"]).sum()) > 0


def test_vocabulary_puts_the_unknown_word_first():
    word_idx = dynet_treenn.vocabulary([(1, (2, "a"), (3, "b")), (0, "a")])
    assert word_idx == {dynet_treenn.UNKNOWN: 0, "a": 1, "b": 2}


def test_dynet_computes_folds_loss_and_learns(treenn):
    pytest.importorskip("dynet")
    trees, word_idx, compiler, params = treenn
    model = dynet_treenn.DynetTreeNN(params, word_idx, lr=0.05)
    want = float(compiler.apply(params, compiler.build_batch(trees)).metrics["loss"].sum())
    first = model.step(trees)
    np.testing.assert_allclose(first, want, rtol=1e-5)
    assert model.step(trees) < first


@pytest.mark.slow
def test_quick_run_times_both(tmp_path):
    pytest.importorskip("dynet")
    result = dynet_treenn.main(["--quick", "--data-dir", str(SAMPLE), "--json", str(tmp_path / "t.json")])
    (run,) = result["runs"]
    rate = run["sentences_per_s"]
    assert set(rate) == {"fold", "DyNet autobatch"} and min(rate.values()) > 0
    assert run["fold_vs_dynet"] == pytest.approx(rate["fold"] / rate["DyNet autobatch"])
    # Both start from the same parameters and train on the same batches: their losses stay close.
    fold_loss, dynet_loss = run["mean_loss"]["fold"], run["mean_loss"]["DyNet autobatch"]
    assert 0 < fold_loss < 8 * 100 * math.log(5) * 2 and fold_loss == pytest.approx(dynet_loss, rel=0.05)
    assert (tmp_path / "t.png").exists()
