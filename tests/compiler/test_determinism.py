"""The same params and examples give the same numbers: bitwise across runs, builds and worker
counts; within 1e-6 when the examples come in another order."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fold as fd
from benchmarks.random_models import random_model


def _outputs_and_grads(compiler: fd.Compiler):
    """``run(params, batch)``: the batch's outputs and the gradients of a loss on them, as NumPy
    arrays, each function compiled once per layout (every call after the first is a run of the
    same executable)."""
    apply = jax.jit(compiler.apply)
    grad = jax.jit(jax.grad(lambda p, b: jnp.sum(jnp.sin(compiler.apply(p, b).outputs))))

    def run(params: dict, batch: fd.Batch) -> list:
        return [np.asarray(x) for x in jax.tree_util.tree_leaves((apply(params, batch).outputs, grad(params, batch)))]

    return run


@pytest.mark.parametrize("seed", [0, pytest.param(3, marks=pytest.mark.slow)])
def test_runs_builds_and_worker_counts_agree_bitwise(seed):
    model = random_model(seed, n=48)
    compiler = fd.Compiler.create(model.block)
    params = compiler.init(jax.random.key(seed))
    run = _outputs_and_grads(compiler)
    reference = run(params, compiler.build_batch(model.examples[:16]))
    again = run(params, compiler.build_batch(model.examples[:16]))
    for workers in (0, 1):
        (batch, *_) = compiler.batches(model.examples, 16, num_workers=workers)
        streamed = run(params, batch)
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
