"""``benchmarks.chain`` trains the same RNN in fold and as a ``lax.scan`` and times both."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fold as fd
from benchmarks import chain


def test_scan_reference_is_the_fold_model():
    compiler = fd.Compiler.create(chain.fold_model(8))
    params = compiler.init(jax.random.key(1))
    chains = [[0.5, -0.25, 1.0], [0.1, 0.2, -0.3]]
    fold_loss = compiler.apply(params, compiler.build_batch(chains)).metrics["loss"].mean()
    scan_loss = chain.scan_loss(params, jnp.asarray(np.array(chains, np.float32).T))
    np.testing.assert_allclose(fold_loss, scan_loss, rtol=1e-6)


@pytest.mark.slow
def test_quick_run_times_both_on_equal_steps(tmp_path):
    result = chain.main(["--quick", "--json", str(tmp_path / "c.json")])
    assert [(r["hidden"], r["batch_size"]) for r in result["runs"]] == [(16, 1), (16, 16)]
    for r in result["runs"]:
        assert r["largest_gap"] < 1e-5  # same loss and updated parameters
        assert r["loop_items"] == result["lengths"]  # one item per element: a chain's depth
        assert set(r["ms"]) == {"fold", "scan"} and min(min(t) for t in r["ms"].values()) > 0
    assert (tmp_path / "c.json").exists() and (tmp_path / "c.png").exists()
