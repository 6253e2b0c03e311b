"""What a training step allocates: XLA's buffer assignment for the compiled step, against the
arenas the executor needs (``benchmarks.memory`` measures the SST model the same way)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import fold as fd


def _wide_model(width: int) -> fd.Block:
    """A sequence of constant vectors, each through a hoisted ``FC`` into a wide state, a per-element
    readout and metric (a tail group reading every state row), and a loop summing the states:
    hoisted groups, the loop and a tail group all use the wide type's arena."""
    node = fd.Composition()
    with node.scope():
        state = (fd.Vector(width) >> fd.FC(width, activation=jnp.tanh)).reads(node.input)
        fd.Metric("score").reads(fd.Function(fd.FC(1, activation=jnp.tanh)).reads(state))
        node.output.reads(state)
    return fd.Map(node) >> fd.Sum()


def test_training_step_holds_one_forward_and_one_cotangent_arena():
    width, rows = 128, 4096
    compiler = fd.Compiler.create(_wide_model(width))
    params = compiler.init(jax.random.key(0))
    xs = np.random.default_rng(0).normal(size=(4, rows // 4, width)).astype(np.float32)
    batch = compiler.build_batch(xs.tolist())
    layout = batch.layout
    assert layout.hoist_ops and layout.loop_ops and layout.tail_ops
    wide = next(t for t, tt in enumerate(compiler.program.types) if tt.shape == (width,))
    arena_bytes = (layout.arena_rows[wide] + layout.chunk) * width * 4

    def loss(p):
        result = compiler.apply(p, batch)
        return jnp.sum(result.metrics["score"].sum()) + jnp.sum(result.outputs ** 2)

    temp = jax.jit(jax.grad(loss)).lower(params).compile().memory_analysis().temp_size_in_bytes
    # The final arena (the backward's residual) and its cotangent, plus pieces and small arenas.
    # A third arena-sized buffer fails: an arena version kept by a hoisted group whose output
    # type the loop writes again, or a whole group's gathered rows with their cotangents.
    assert 2 * arena_bytes <= temp < 2.5 * arena_bytes, (temp / arena_bytes, arena_bytes)
