"""A stream of differently shaped batches compiles only a handful of times."""

from __future__ import annotations

import random

import jax
import optax
import pytest

import fold as fd
from fold.compiler.compiler import CHUNK_SIZES
from tests.models import make_tree_lstm, random_tree


def _model() -> fd.Block:
    block, _, _ = make_tree_lstm(n=1, hidden=8)
    return block >> fd.Function(lambda h: (h ** 2).sum(-1)) >> fd.Metric("loss")


def _stream() -> list[list]:
    """Thirty batches of 16 random trees, up to 2-48 leaves each: several size classes."""
    rng = random.Random(0)
    stream = []
    for _ in range(30):
        leaves = rng.randint(2, 48)
        stream.append([random_tree(rng, rng.randint(1, leaves)) for _ in range(16)])
    return stream


def test_thirty_batches_of_random_trees_trace_a_handful_of_times():
    compiler = fd.Compiler.create(_model())
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

    sizes = []
    for trees in _stream():
        batch = compiler.build_batch(trees)
        sizes.append(batch.stats.rows)  # what the batch needs: its layout may be a larger one
        params, opt_state, loss = train_step(params, opt_state, batch)
        assert bool(jax.numpy.isfinite(loss))
    assert max(sizes) >= 4 * min(sizes), "the stream should span several size classes"
    # Six size classes A; within them each arena's rows (a power of two per type, for memory)
    # and the hoisted and tail groups' padded rows cross a boundary now and then. These tiny
    # batches save matmul outputs (backward="auto"), in buffers of at least A / 4 rows; a binary
    # tree's loop rows are about half its nodes, so some batches need A / 2: 12 traces.
    assert len(traces) <= 12, [t.size_class for t in traces]
    assert compiler.stats().layouts == len(traces)


@pytest.mark.parametrize("backward, chunk_size, most", [("recompute", (128, 512), 10),
                                                       ("recompute", CHUNK_SIZES, 11), ("save", CHUNK_SIZES, 12)])
def test_the_same_stream_has_a_handful_of_layouts_in_each_backward_mode(backward, chunk_size, most):
    # One compilation per distinct layout (checked above): counting layouts needs no device work.
    # With the default candidates the tiny batches (A <= 1024) take C = 32 where it makes about as
    # many items as 128: one more layout when recomputing (one size class mixes both);
    # saving needs 12 either way.
    compiler = fd.Compiler.create(_model(), backward=backward, chunk_size=chunk_size)
    for trees in _stream():
        compiler.build_batch(trees)
    assert compiler.stats().layouts <= most


_CACHED_RUN = """
import jax, optax
import fold as fd
from tests.models import make_tree_lstm
block, _, _ = make_tree_lstm(n=1, hidden=8)
compiler = fd.Compiler.create(block >> fd.Function(lambda h: (h ** 2).sum(-1)) >> fd.Metric("loss"))
params = compiler.init(jax.random.key(0))
batch = compiler.build_batch([(5, (1, 2)), 3, ((1, 2), (4, 7))])
grads = jax.jit(jax.grad(lambda p: compiler.apply(p, batch).metrics["loss"].sum()))(params)
print(float(jax.tree_util.tree_leaves(grads)[0].sum()))
"""


def test_a_second_process_takes_every_compiled_function_from_jaxs_persistent_cache(tmp_path):
    """fold's jitted functions lower to the same programs in every process, so JAX's persistent
    compilation cache (docs/quickstart.md) serves a rerun of a script: nothing new is compiled."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "JAX_COMPILATION_CACHE_DIR": str(tmp_path / "cache"),
           "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0", "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    runs = []
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", _CACHED_RUN], env=env, cwd=root, capture_output=True, text=True,
                             timeout=300)
        assert out.returncode == 0, out.stderr
        runs.append((out.stdout, sorted(p.name for p in (tmp_path / "cache").iterdir())))
    (first_out, first_entries), (second_out, second_entries) = runs
    assert len(first_entries) > 3  # the gradient's program and the initializers' operations
    assert second_entries == first_entries and second_out == first_out
