"""The PyTorch and JAX peers of sst_throughput compute fold's model: same loss and gradients from the same
parameters (``sst_reference`` in conftest.py)."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks import sst_peers

torch = pytest.importorskip("torch")

def test_flat_numbers_levels_contiguously():
    f = sst_peers.Flat([(1, (2, "a"), (3, (0, "b"), (4, "c"))), (2, "b")], {"a": 0, "b": 1})
    assert f.levels == [(0, 4), (4, 5), (5, 6)]
    assert f.word.tolist() == [0, 1, -1, 1, -1, -1] and f.label.tolist() == [2, 0, 4, 2, 3, 1]
    # Every child sits in a lower level than its parent.
    for n in range(4, 6):
        assert f.left[n] < n and f.right[n] < n
    assert (f.left[5], f.right[5]) == (0, 4) and (f.left[4], f.right[4]) == (1, 2)


@pytest.mark.parametrize("peer", [sst_peers.TorchEager, sst_peers.TorchLevels])
def test_torch_peers_match_fold(sst_reference, peer):
    trees, word_idx, params, want_loss, want_grads = sst_reference
    model = peer(sst_peers.plain_params(params), word_idx)
    loss = model.loss(trees)
    loss.backward()
    np.testing.assert_allclose(float(loss.detach()), want_loss, rtol=1e-5)
    for name, g in want_grads.items():
        np.testing.assert_allclose(model.p[name].grad.numpy(), g, rtol=1e-4, atol=1e-6, err_msg=name)


def test_jax_per_tree_matches_fold(sst_reference):
    trees, word_idx, params, want_loss, want_grads = sst_reference
    model = sst_peers.JaxPerTree(sst_peers.plain_params(params), word_idx)
    loss, grads, nodes = model.loss_and_grads(trees)
    np.testing.assert_allclose(float(loss), want_loss, rtol=1e-5)
    for name, g in want_grads.items():
        np.testing.assert_allclose(np.asarray(grads[name]) / nodes, g, rtol=1e-4, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("peer", [sst_peers.TorchEager, sst_peers.TorchLevels, sst_peers.JaxPerTree])
def test_a_training_step_lowers_the_loss(sst_reference, peer):
    trees, word_idx, params, want_loss, _ = sst_reference
    model = peer(sst_peers.plain_params(params), word_idx, lr=0.5)
    first = model.train_step(trees)
    assert abs(first - want_loss) < 1e-4 * abs(want_loss)
    assert model.train_step(trees) < first
