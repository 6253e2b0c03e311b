"""The DyNet peer of sst_throughput (autobatching) computes fold's model: the same loss, and an SGD
step that moves the parameters by fold's gradients (``sst_reference`` in conftest.py)."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks import sst_peers

pytest.importorskip("dynet")


def test_dynet_autobatch_matches_fold(sst_reference):
    trees, word_idx, params, want_loss, want_grads = sst_reference
    plain = sst_peers.plain_params(params)
    model = sst_peers.DynetAutobatch(plain, word_idx, lr=1.0)
    np.testing.assert_allclose(model.train_step(trees), want_loss, rtol=1e-5)
    after = model.params()
    for name, g in want_grads.items():  # with lr = 1, the step is the gradient
        np.testing.assert_allclose(plain[name] - after[name], g, rtol=1e-4, atol=1e-6, err_msg=name)
    assert model.train_step(trees) < want_loss
