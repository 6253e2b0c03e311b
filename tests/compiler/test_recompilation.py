"""A stream of differently shaped batches compiles only a handful of times."""

from __future__ import annotations

import random

import jax
import optax
import pytest

import fold as fd
from tests.models import make_tree_lstm, random_tree


@pytest.mark.parametrize("backward, most", [("recompute", 10), ("auto", 12)])
def test_thirty_batches_of_random_trees_trace_a_handful_of_times(backward, most):
    block, _, _ = make_tree_lstm(n=1, hidden=8)
    model = block >> fd.Function(lambda h: (h ** 2).sum(-1)) >> fd.Metric("loss")
    compiler = fd.Compiler.create(model, backward=backward)
    params = compiler.init(jax.random.key(0))
    optimizer = optax.sgd(0.01)
    opt_state = optimizer.init(params)
    traces = []

    @jax.jit
    def train_step(params, opt_state, batch):
        traces.append(batch.layout)
        loss, grads = jax.value_and_grad(lambda p: compiler.apply(p, batch).metrics["loss"].mean())(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    rng = random.Random(0)
    sizes = []
    for _ in range(30):
        leaves = rng.randint(2, 48)
        trees = [random_tree(rng, rng.randint(1, leaves)) for _ in range(16)]
        batch = compiler.build_batch(trees)
        sizes.append(len(batch.arrays["in_idx"]))
        params, opt_state, loss = train_step(params, opt_state, batch)
        assert bool(jax.numpy.isfinite(loss))
    assert max(sizes) >= 4 * min(sizes), "the stream should span several size classes"
    # Six size classes A; within them each arena's rows (a power of two per type, for memory)
    # and the hoisted and tail groups' padded rows cross a boundary now and then. With auto, these
    # tiny batches save matmul outputs, in buffers of at least A / 4 rows; a binary tree's loop
    # rows are about half its nodes, so some batches need A / 2: 12 traces against 10.
    assert len(traces) <= most, [t.size_class for t in traces]
