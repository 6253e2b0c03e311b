"""Outputs an operation returns more than once share one arena slot (``fold/compiler/outputs.py``)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import fold as fd
from fold.blocks.tensors import OpSpec
from fold.blocks.types import TensorType, TupleType
from fold.compiler.outputs import distinct_fn, output_leaves
from tests.models import enable_x64

T = TensorType((3,))


def _spec(fn, n_out: int) -> OpSpec:
    return OpSpec(("test", id(fn)), "test", T, TupleType(*[T] * n_out), fn)


def test_repeated_values_are_found_in_order_of_first_appearance():
    spec = _spec(lambda p, rng, x: [x * 2, jnp.tanh(x), x * 2, jnp.tanh(x)], 4)
    # Two separate ``x * 2`` are two traced values: only the very same value is shared.
    assert output_leaves(spec) == (0, 1, 2, 3)
    y = lambda x: jnp.tanh(x)  # noqa: E731
    spec = _spec(lambda p, rng, x: (lambda h: [h, x, h, x])(y(x)), 4)
    assert output_leaves(spec) == (0, 1, 0, 1)
    ys = distinct_fn(spec.fn, output_leaves(spec))(None, None, jnp.ones((2, 3)))
    assert len(ys) == 2
    np.testing.assert_allclose(ys[0], np.tanh(np.ones((2, 3))))


def test_values_equal_only_without_a_key_stay_apart():
    def fn(p, rng, x):
        h = jnp.tanh(x)
        dropped = h if rng is None else h * jax.random.bernoulli(rng, 0.5, h.shape)
        return [dropped, h]

    assert output_leaves(_spec(fn, 2)) == (0, 1)


def test_literal_outputs_and_untraceable_functions_stay_apart():
    assert output_leaves(_spec(lambda p, rng, x: [jnp.zeros((2, 3)), jnp.zeros((2, 3))], 2)) == (0, 1)

    def host_only(p, rng, x):
        return [np.asarray(x), np.asarray(x)]  # a tracer has no NumPy value

    assert output_leaves(_spec(host_only, 2)) == (0, 1)


def test_an_lstm_op_writes_h_once():
    model = (fd.Map(fd.Vector(3)) >> fd.RNN(fd.LSTMCell(4), initial_state=fd.Zeros(((4,), (4,))))
             >> fd.AllOf(fd.GetItem(0) >> fd.Sum(), fd.GetItem(1) >> fd.GetItem(1)) >> fd.Concat())
    compiler = fd.Compiler.create(model)
    cell = next(op for op in compiler.program.ops if op.layer is not None)
    assert cell.out_leaves == (0, 1, 0)
    assert len(cell.out_slots) == 2
    # Its output h and its state's h are one row: 40 steps write 80 rows of c and h, not 120 (the
    # sum's 39 additions write rows of the same type).
    batch = compiler.build_batch([np.ones((40, 3), np.float32)])
    assert batch.layout.arena_rows[cell.out_tidx[0]] < 120 + 39


def test_readers_of_either_copy_get_values_and_gradients_as_unshared():
    """Each step's h feeds the next step (as state) and the sum of outputs; the last state's h
    feeds the result too: values and gradients against the same LSTM unrolled in JAX."""
    with enable_x64():
        cell = fd.LSTMCell(4, name="lstm")
        h = fd.TensorType((4,), "float64")
        rnn = fd.RNN(cell, initial_state=fd.Zeros(fd.TupleType(h, h)))
        model = (fd.Map(fd.Vector(3, dtype="float64")) >> rnn
                 >> fd.AllOf(fd.GetItem(0) >> fd.Map(fd.Function(jnp.sin)) >> fd.Sum(),
                             fd.GetItem(1) >> fd.GetItem(1) >> fd.Function(jnp.cos))
                 >> fd.Concat())
        compiler = fd.Compiler.create(model)
        params = compiler.init(jax.random.key(1))
        rng = np.random.default_rng(0)
        examples = [rng.normal(size=(n, 3)) for n in (1, 4, 7)]

        def reference(p, xs):
            c = h = jnp.zeros(4)
            total = jnp.zeros(4)
            for x in xs:
                h_out, (c, h) = cell.apply(p["lstm"], x[None], (c[None], h[None]))
                c, h = c[0], h[0]
                total = total + jnp.sin(h_out[0])
            return jnp.concatenate([total, jnp.cos(h)])

        def loss(p):
            return jnp.sum(compiler.apply(p, compiler.build_batch(examples)).outputs ** 2)

        def ref_loss(p):
            return sum(jnp.sum(reference(p, xs) ** 2) for xs in examples)

        value, grads = jax.value_and_grad(loss)(params)
        ref_value, ref_grads = jax.value_and_grad(ref_loss)(params)
        np.testing.assert_allclose(value, ref_value, rtol=1e-10)
        for a, b in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(ref_grads)):
            np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)


def test_an_input_returned_twice_is_one_row_read_by_both_readers():
    model = (fd.Vector(3) >> fd.FC(3, activation=None, name="fc") >> fd.Function(lambda x: (x, x))
             >> fd.Record((fd.Function(jnp.sin), fd.Function(jnp.cos))) >> fd.Concat())
    compiler = fd.Compiler.create(model)
    # The FC and the lambda are one fused operation, whose two outputs are one value.
    assert [op.out_leaves for op in compiler.program.ops if op.layer is not None] == [(0, 0)]
    params = compiler.init(jax.random.key(0))
    xs = np.random.default_rng(1).normal(size=(4, 3)).astype(np.float32)
    batch = compiler.build_batch(list(xs))

    def reference(p):
        h = jnp.asarray(xs) @ p["fc"]["w"] + p["fc"]["b"]
        return jnp.concatenate([jnp.sin(h), jnp.cos(h)], axis=-1)

    np.testing.assert_allclose(compiler.apply(params, batch).outputs, reference(params), rtol=1e-6)
    grads = jax.grad(lambda p: jnp.sum(compiler.apply(p, batch).outputs ** 2))(params)
    ref_grads = jax.grad(lambda p: jnp.sum(reference(p) ** 2))(params)
    for a, b in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(ref_grads)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_the_weight_pass_share_counts_a_repeated_output_each_time():
    """``Executor.item_share`` was measured with every output the block returns: a GRU cell's
    ``(h, h)`` counted once moved the GGNN example's cell to the weight pass at 8 graphs, 1.07x
    slower."""
    model = fd.Map(fd.Vector(3)) >> fd.RNN(fd.GRUCell(4, name="gru"), initial_state=fd.Zeros(4)) >> fd.GetItem(1)
    compiler = fd.Compiler.create(model)
    o, cell = next((o, op) for o, op in enumerate(compiler.program.ops) if op.layer is not None)
    assert cell.out_leaves == (0, 0) and len(cell.out_slots) == 1
    params = compiler.init(jax.random.key(0))["gru"]
    entries = sum(x.size for x in jax.tree_util.tree_leaves(params))
    # Inputs x (3) and h (4), outputs h and h (4 each).
    assert compiler.executor.item_share(o, params, 16) == 16 * (3 + 4 + 4 + 4) / entries
