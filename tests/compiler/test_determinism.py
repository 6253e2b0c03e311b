"""The same params and examples give the same numbers: bitwise across runs, builds and worker
counts; within 1e-6 when the examples come in another order."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fold as fd
from benchmarks.random_models import random_model


def _outputs_and_grads(compiler: fd.Compiler, params: dict, batch: fd.Batch) -> list:
    out = jax.jit(compiler.apply)(params, batch).outputs
    grads = jax.jit(jax.grad(lambda p: jnp.sum(jnp.sin(compiler.apply(p, batch).outputs))))(params)
    return [np.asarray(x) for x in jax.tree_util.tree_leaves((out, grads))]


@pytest.mark.parametrize("seed", [0, 3])
def test_runs_builds_and_worker_counts_agree_bitwise(seed):
    model = random_model(seed, n=48)
    compiler = fd.Compiler.create(model.block)
    params = compiler.init(jax.random.key(seed))
    reference = _outputs_and_grads(compiler, params, compiler.build_batch(model.examples[:16]))
    again = _outputs_and_grads(compiler, params, compiler.build_batch(model.examples[:16]))
    for workers in (0, 1):
        (batch, *_) = compiler.batches(model.examples, 16, num_workers=workers)
        streamed = _outputs_and_grads(compiler, params, batch)
        for a, b, c in zip(reference, again, streamed):
            np.testing.assert_array_equal(a, b)
            np.testing.assert_array_equal(a, c)


@pytest.mark.parametrize("seed", [1, 4])
def test_another_example_order_moves_each_output_by_at_most_1e_6(seed):
    model = random_model(seed, n=24)
    compiler = fd.Compiler.create(model.block)
    params = compiler.init(jax.random.key(seed))
    order = np.random.default_rng(seed).permutation(24)
    out = np.asarray(compiler.apply(params, compiler.build_batch(model.examples)).outputs)
    shuffled = np.asarray(compiler.apply(params, compiler.build_batch([model.examples[i] for i in order])).outputs)
    np.testing.assert_allclose(shuffled, out[order], rtol=1e-6, atol=1e-6)
