"""The peers of sst_throughput compute fold's model: same loss and gradients from the same parameters."""

from __future__ import annotations

import pathlib

import jax
import numpy as np
import pytest

import fold as fd
from benchmarks import models, sst_peers
from examples import sst

torch = pytest.importorskip("torch")

SAMPLE = pathlib.Path(__file__).resolve().parents[1] / "data" / "sst_sample"


@pytest.fixture(scope="module")
def setup():
    # Small trees keep JaxPerTree's per-shape compilations short.
    trees = sorted(sst.load("train", SAMPLE), key=lambda t: len(sst.words(t)))[:6]
    word_idx = sst.vocabulary(trees[:4])  # trees 4 and 5 have unknown words (zeros as input)
    compiler = fd.Compiler.create(models.sst_model(word_idx, state_size=6, embed_size=4))
    params = compiler.init(jax.random.key(0))
    batch = compiler.build_batch(trees)

    def loss(p):
        return compiler.apply(p, batch).metrics["loss"].mean()

    value, grads = jax.value_and_grad(loss)(params)
    return trees, word_idx, params, float(value), sst_peers.plain_params(grads)


def test_flat_numbers_levels_contiguously():
    f = sst_peers.Flat([(1, (2, "a"), (3, (0, "b"), (4, "c"))), (2, "b")], {"a": 0, "b": 1})
    assert f.levels == [(0, 4), (4, 5), (5, 6)]
    assert f.word.tolist() == [0, 1, -1, 1, -1, -1] and f.label.tolist() == [2, 0, 4, 2, 3, 1]
    # Every child sits in a lower level than its parent.
    for n in range(4, 6):
        assert f.left[n] < n and f.right[n] < n
    assert (f.left[5], f.right[5]) == (0, 4) and (f.left[4], f.right[4]) == (1, 2)


@pytest.mark.parametrize("peer", [sst_peers.TorchEager, sst_peers.TorchLevels])
def test_torch_peers_match_fold(setup, peer):
    trees, word_idx, params, want_loss, want_grads = setup
    model = peer(sst_peers.plain_params(params), word_idx)
    loss = model.loss(trees)
    loss.backward()
    np.testing.assert_allclose(float(loss.detach()), want_loss, rtol=1e-5)
    for name, g in want_grads.items():
        np.testing.assert_allclose(model.p[name].grad.numpy(), g, rtol=1e-4, atol=1e-6, err_msg=name)


def test_jax_per_tree_matches_fold(setup):
    trees, word_idx, params, want_loss, want_grads = setup
    model = sst_peers.JaxPerTree(sst_peers.plain_params(params), word_idx)
    loss, grads, nodes = model.loss_and_grads(trees)
    np.testing.assert_allclose(float(loss), want_loss, rtol=1e-5)
    for name, g in want_grads.items():
        np.testing.assert_allclose(np.asarray(grads[name]) / nodes, g, rtol=1e-4, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("peer", [sst_peers.TorchEager, sst_peers.TorchLevels, sst_peers.JaxPerTree])
def test_a_training_step_lowers_the_loss(setup, peer):
    trees, word_idx, params, want_loss, _ = setup
    model = peer(sst_peers.plain_params(params), word_idx, lr=0.5)
    first = model.train_step(trees)
    assert abs(first - want_loss) < 1e-4 * abs(want_loss)
    assert model.train_step(trees) < first
