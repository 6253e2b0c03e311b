"""``Compiler.create(..., backward="save")``: the loop's backward pass from saved matmul outputs.

The reference is ``backward="recompute"``, which ``test_gradients`` checks against NumPy
references and finite differences.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fold as fd
from fold.scheduler.schedule import item_sizes, padded_rows
from tests.compiler.test_randomness import _functions
from tests.models import MODELS, enable_x64


def _grads(block: fd.Block, backward: str, examples: list, key: jax.Array | None = None, **create: int) -> dict:
    compiler = fd.Compiler.create(block, backward=backward, **create)
    params = compiler.init(jax.random.key(3))
    batch = compiler.build_batch(examples)
    return jax.jit(jax.grad(lambda p: jnp.sum(jnp.sin(compiler.apply(p, batch, key).outputs) ** 2)))(params)


def _assert_same(a: dict, b: dict) -> None:
    assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_allclose(x, y, rtol=1e-10, atol=1e-13)


@pytest.mark.parametrize("chunk", [(128, 512), 8])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_saved_backward_gives_the_recomputed_gradients(name, chunk):
    # C = 8 cuts depths into several items, with padded remainders, per operation.
    with enable_x64():
        block, _, examples = MODELS[name](dtype="float64", n=8)
        _assert_same(_grads(block, "save", examples, chunk_size=chunk),
                     _grads(block, "recompute", examples, chunk_size=chunk))


def test_saved_buffers_hold_one_row_per_loop_row():
    """Each loop operation's saved buffers have as many rows as its items' padded rows (rounded up
    to a power of two), one item after another: not a row per row of its output's arena."""
    block, _, examples = MODELS["tree_lstm"](n=20)
    for backward in ("recompute", "save"):
        batch = fd.Compiler.create(block, backward=backward, chunk_size=8).build_batch(examples)
        layout, arrays = batch.layout, batch.arrays
        if backward == "recompute":
            assert layout.saved_rows == ()
            continue
        sizes = item_sizes(layout.chunk)
        n = int(arrays["n_items"])
        branch = arrays["items_branch"][:n]
        rows = np.array([sizes[b % len(sizes)] for b in branch])
        for q in range(len(layout.loop_ops)):
            mine = branch // len(sizes) == q
            np.testing.assert_array_equal(arrays["items_saved"][:n][mine], np.cumsum(rows[mine]) - rows[mine])
            assert layout.saved_rows[q] == padded_rows(int(rows[mine].sum()))
        assert sum(layout.saved_rows) < max(layout.arena_rows)


def test_saved_backward_replays_dropout_masks():
    with enable_x64():
        block, _, examples = MODELS["tree_lstm"](dtype="float64", n=6)
        cell = next(b.layer for b in _functions(block) if isinstance(b.layer, fd.BinaryTreeLSTMCell))
        cell.recurrent_dropout = 0.4
        key = jax.random.key(7)
        _assert_same(_grads(block, "save", examples, key, chunk_size=8),
                     _grads(block, "recompute", examples, key, chunk_size=8))


def test_saved_backward_does_less_work():
    """The forward pass of every loop item is not run again: the compiled gradient has fewer FLOPs."""
    block, _, examples = MODELS["tree_lstm"](n=8)
    flops = {}
    for backward in ("recompute", "save"):
        compiler = fd.Compiler.create(block, backward=backward)
        params = compiler.init(jax.random.key(3))
        batch = compiler.build_batch(examples)
        grad = jax.jit(jax.grad(lambda p: jnp.sum(compiler.apply(p, batch).outputs ** 2)))
        cost = grad.lower(params).compile().cost_analysis()
        flops[backward] = (cost[0] if isinstance(cost, list) else cost)["flops"]
    assert flops["save"] < 0.95 * flops["recompute"], flops


def test_padded_rows_stay_finite_with_saved_rows():
    """Padded rows of an item reuse its first row, also for the saved matmul outputs: with
    ``log(y ** 2)`` (infinite derivative at 0) after the FC's matmul the gradients stay finite
    and equal the recomputing backward's."""
    fc = fd.FC(1, activation=lambda y: jnp.log(y ** 2))
    model = fd.Map(fd.Vector(1)) >> fd.Fold(fd.Function(fc), fd.FromTensor(np.ones(1, np.float32))) \
        >> fd.Function(lambda y: y[:, 0])
    examples = [[[3.0]] * n for n in (1, 3, 6, 2)]
    grads = {}
    for backward in ("recompute", "save"):
        compiler = fd.Compiler.create(model, backward=backward)
        params = {"fc": {"w": jnp.ones((2, 1)), "b": jnp.zeros((1,))}}
        batch = compiler.build_batch(examples)
        grads[backward] = jax.grad(lambda p: jnp.sum(compiler.apply(p, batch).outputs))(params)
        assert all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree_util.tree_leaves(grads[backward]))
    for a, b in zip(jax.tree_util.tree_leaves(grads["save"]), jax.tree_util.tree_leaves(grads["recompute"])):
        np.testing.assert_allclose(a, b, rtol=1e-5)


def test_unknown_backward_is_a_clear_error():
    with pytest.raises(ValueError, match=r"backward must be one of \('recompute', 'save'\), got 'keep'"):
        fd.Compiler.create(fd.Scalar() >> fd.Function(jnp.sin), backward="keep")
