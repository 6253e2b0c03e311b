"""Large cases (CI skips them: run with ``pytest -m slow``)."""

from __future__ import annotations

import random

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fold as fd
from tests.models import make_tree_lstm, random_tree

pytestmark = pytest.mark.slow


def test_large_batch_of_large_trees_matches_reference():
    block, reference, _ = make_tree_lstm(n=1, hidden=16)
    rng = random.Random(5)
    trees = [random_tree(rng, rng.randint(1, 128)) for _ in range(256)]
    compiler = fd.Compiler.create(block)
    params = compiler.init(jax.random.key(0))
    out = np.asarray(jax.jit(compiler.apply)(params, compiler.build_batch(trees)).outputs)
    for i in rng.sample(range(len(trees)), 20):
        np.testing.assert_allclose(out[i], reference(params, trees[i]), rtol=1e-4, atol=1e-6)


def test_gradient_through_ten_thousand_levels():
    fc = fd.FC(2, activation=jnp.tanh)
    model = fd.Map(fd.Vector(2)) >> fd.Fold(fd.Concat() >> fd.Function(fc), fd.Zeros((2,)))
    compiler = fd.Compiler.create(model)
    params = compiler.init(jax.random.key(0))
    xs = np.random.default_rng(0).normal(size=(10_000, 2)).tolist()
    batch = compiler.build_batch([xs, xs[:3]])
    grads = jax.jit(jax.grad(lambda p, b: jnp.sum(compiler.apply(p, b).outputs)))(params, batch)
    assert all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree_util.tree_leaves(grads))
    short = jax.grad(lambda p: jnp.sum(compiler.apply(p, compiler.build_batch([xs[:3]])).outputs))(params)
    assert not np.allclose(np.asarray(grads["fc"]["w"]), np.asarray(short["fc"]["w"]))
