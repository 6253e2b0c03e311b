"""Stochastic layers: ``Dropout`` and recurrent dropout, seeded by ``apply(..., key=)``."""

from __future__ import annotations

import random

import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
import pytest

import fold as fd
from tests.models import MODELS, enable_x64, random_tree


def _dropout_model(rate: float, size: int = 32):
    compiler = fd.Compiler.create(fd.Vector(size) >> fd.Dropout(rate))
    return compiler, compiler.init(jax.random.key(0))


def test_dropout_is_the_identity_without_a_key():
    compiler, params = _dropout_model(0.5)
    x = np.random.default_rng(0).normal(size=(5, 32)).astype(np.float32)
    out = compiler.apply(params, compiler.build_batch(x.tolist())).outputs
    np.testing.assert_array_equal(out, x)
    assert params == {"dropout": {}}


def test_dropout_zeroes_at_the_rate_and_rescales_the_rest():
    compiler, params = _dropout_model(0.25, size=64)
    batch = compiler.build_batch([[1.0] * 64] * 64)
    apply = jax.jit(compiler.apply)
    out = np.asarray(apply(params, batch, jax.random.key(1)).outputs)
    np.testing.assert_allclose(np.unique(out), [0.0, 1 / 0.75], rtol=1e-6)
    assert abs((out == 0).mean() - 0.25) < 0.03
    # Every row of one batched call draws its own mask.
    assert len({row.tobytes() for row in out}) == 64
    # The draws depend only on the key (and the batch).
    np.testing.assert_array_equal(out, apply(params, batch, jax.random.key(1)).outputs)
    assert not np.array_equal(out, apply(params, batch, jax.random.key(2)).outputs)
    # Raw uint32 keys work too.
    assert np.asarray(apply(params, batch, jax.random.PRNGKey(1)).outputs).shape == (64, 64)


def test_dropout_is_unbiased():
    compiler, params = _dropout_model(0.5, size=8)
    x = np.arange(1.0, 9.0, dtype=np.float32)
    batch = compiler.build_batch([x.tolist()] * 50)
    apply = jax.jit(compiler.apply)
    mean = np.mean([np.asarray(apply(params, batch, jax.random.key(k)).outputs).mean(0) for k in range(40)], 0)
    np.testing.assert_allclose(mean, x, rtol=0.1)


class _Noise(fd.Layer):
    """Adds unit normal noise when it gets a key; says nothing about being stochastic."""

    def init(self, key, input_type):
        return {}

    def apply(self, params, x, *, key=None):
        return x if key is None else x + jax.random.normal(key, x.shape, x.dtype)


class _Attention(fd.Layer):
    """A layer whose second input is named ``key``: an input, not a PRNG key."""

    def init(self, key, input_type):
        return {}

    def apply(self, params, query, key):
        return query * key


def test_a_layer_whose_apply_takes_a_key_gets_one_unless_it_says_otherwise():
    # It once got none: only stochastic = True passed keys, so such a layer silently never drew.
    x = [[1.0, 2.0, 3.0]] * 4

    def outputs(layer, key):
        compiler = fd.Compiler.create(fd.Vector(3) >> layer)
        return np.asarray(compiler.apply(compiler.init(jax.random.key(0)), compiler.build_batch(x), key).outputs)

    np.testing.assert_array_equal(outputs(_Noise(), None), x)
    noisy = outputs(_Noise(), jax.random.key(1))
    assert np.all(noisy != np.asarray(x)) and len({row.tobytes() for row in noisy}) == 4
    np.testing.assert_array_equal(noisy, outputs(_Noise(), jax.random.key(1)))
    quiet = _Noise()
    quiet.stochastic = False
    np.testing.assert_array_equal(outputs(quiet, jax.random.key(1)), x)
    for layer in (fd.Dropout(0.5), fd.FC(3, output_keep_prob=0.5)):
        assert not np.allclose(outputs(layer, jax.random.key(1)), outputs(layer, None))
    assert not fd.FC(3).stochastic
    attention = (fd.Record((fd.Vector(2), fd.Vector(2))) >> _Attention()).eval(([1.0, 2.0], [3.0, 4.0]))
    np.testing.assert_array_equal(attention, [3.0, 8.0])


def test_recurrent_dropout_in_the_loop_has_consistent_gradients():
    """The backward loop must replay the forward loop's masks: compare with finite differences."""
    with enable_x64():
        block, reference, examples = MODELS["tree_lstm"](dtype="float64", n=6)
        cell = next(b.layer for b in _functions(block) if isinstance(b.layer, fd.BinaryTreeLSTMCell))
        cell.recurrent_dropout = 0.4
        compiler = fd.Compiler.create(block, chunk_size=8)
        params = compiler.init(jax.random.key(3))
        batch = compiler.build_batch(examples)
        key = jax.random.key(7)

        def loss(p, k=key):
            return jnp.sum(jnp.sin(compiler.apply(p, batch, k).outputs) ** 2)

        # Without a key the cell is deterministic and matches the dropout-free reference.
        no_key = np.asarray(compiler.apply(params, batch).outputs)
        np.testing.assert_allclose(no_key, [reference(params, e) for e in examples], rtol=1e-9)
        assert not np.allclose(compiler.apply(params, batch, key).outputs, no_key)

        grads = jax.jit(jax.grad(loss))(params)
        flat, unravel = jax.flatten_util.ravel_pytree(params)
        g_flat, _ = jax.flatten_util.ravel_pytree(grads)
        loss_jit = jax.jit(lambda f: loss(unravel(f)))
        eps = 1e-6
        for i in np.random.default_rng(0).choice(flat.size, size=12, replace=False):
            step = jnp.zeros(flat.size).at[i].set(eps)
            fd_grad = (loss_jit(flat + step) - loss_jit(flat - step)) / (2 * eps)
            np.testing.assert_allclose(g_flat[i], fd_grad, rtol=1e-5, atol=1e-8, err_msg=f"coord {i}")


def _check_finite_differences(loss, params, coords: int = 12) -> None:
    """``jax.grad(loss)`` at ``params`` against central differences at random coordinates."""
    grads = jax.jit(jax.grad(loss))(params)
    flat, unravel = jax.flatten_util.ravel_pytree(params)
    g_flat, _ = jax.flatten_util.ravel_pytree(grads)
    loss_jit = jax.jit(lambda f: loss(unravel(f)))
    eps = 1e-6
    for i in np.random.default_rng(0).choice(flat.size, size=coords, replace=False):
        step = jnp.zeros(flat.size).at[i].set(eps)
        fd_grad = (loss_jit(flat + step) - loss_jit(flat - step)) / (2 * eps)
        np.testing.assert_allclose(g_flat[i], fd_grad, rtol=1e-5, atol=1e-8, err_msg=f"coord {i}")


def test_dropout_in_hoisted_and_tail_groups_has_consistent_gradients():
    """Hoisted and tail groups run in pieces, each with its own key; the backward pass must
    replay every piece's masks (finite differences would disagree otherwise)."""
    with enable_x64():
        hidden, words = 5, 30
        h = fd.TensorType((hidden,), "float64")
        decl = fd.ForwardDeclaration(fd.PyObjectType(), h)
        leaf = fd.Scalar("int32") >> fd.Embedding(words, hidden, dtype="float64") >> fd.Dropout(0.4)
        inner = fd.Record((decl(), decl())) >> fd.Concat() >> fd.FC(hidden, activation=jnp.tanh)
        node = fd.Composition()
        with node.scope():
            state = fd.OneOf(lambda t: isinstance(t, tuple), {False: leaf, True: inner}).reads(node.input)
            score = fd.FC(1, activation=jnp.tanh) >> fd.Dropout(0.3)
            fd.Metric("score").reads(score.reads(state))
            node.output.reads(state)
        decl.resolve_to(node)
        compiler = fd.Compiler.create(decl(), chunk_size=8)
        rng = random.Random(2)
        batch = compiler.build_batch([random_tree(rng, rng.randint(4, 12), lambda r: r.randrange(words))
                                      for _ in range(8)])
        layout = batch.layout
        assert layout.hoist_sizes and layout.tail_sizes and max(layout.hoist_sizes + layout.tail_sizes) >= 4 * 8
        params = compiler.init(jax.random.key(1))
        key = jax.random.key(5)

        def loss(p, k=key):
            result = compiler.apply(p, batch, k)
            return jnp.sum(jnp.sin(result.outputs) ** 2) + jnp.sum(result.metrics["score"].sum())

        assert not np.allclose(loss(params), loss(params, None))
        _check_finite_differences(loss, params)


def _functions(block: fd.Block) -> list:
    seen, stack, out = set(), [block], []
    while stack:
        b = stack.pop()
        if id(b) in seen:
            continue
        seen.add(id(b))
        if isinstance(b, fd.Function):
            out.append(b)
        stack.extend(b.children())
    return out


@pytest.mark.parametrize("cell", [fd.LSTMCell(4, recurrent_dropout=0.5),
                                  pytest.param(fd.GRUCell(4, recurrent_dropout=0.5), marks=pytest.mark.slow)])
def test_sequence_cells_with_recurrent_dropout(cell):
    compiler = fd.Compiler.create(fd.Map(fd.Vector(3)) >> fd.RNN(cell) >> fd.GetItem(0) >> fd.Sum())
    params = compiler.init(jax.random.key(0))
    xs = np.random.default_rng(1).normal(size=(4, 5, 3)).tolist()
    batch = compiler.build_batch(xs)
    plain = compiler.apply(params, batch).outputs
    noisy = compiler.apply(params, batch, jax.random.key(0)).outputs
    assert np.all(np.isfinite(noisy)) and not np.allclose(plain, noisy)
    grads = jax.jit(jax.grad(lambda p: compiler.apply(p, batch, jax.random.key(0)).outputs.sum()))(params)
    assert all(np.all(np.isfinite(g)) for g in jax.tree_util.tree_leaves(grads))


def test_bad_rates_and_keys_are_clear_errors():
    with pytest.raises(ValueError, match=r"Dropout needs a dropout rate in \[0, 1\), got 1.0"):
        fd.Dropout(1.0)
    with pytest.raises(ValueError, match="LSTMCell needs a dropout rate"):
        fd.LSTMCell(4, recurrent_dropout=-0.1)
    with pytest.raises(TypeError, match="Dropout.* takes one float tensor"):
        fd.Compiler.create(fd.Scalar("int32") >> fd.Dropout(0.1))
    compiler, params = _dropout_model(0.5)
    batch = compiler.build_batch([[0.0] * 32])
    with pytest.raises(TypeError, match="key must be a PRNG key"):
        compiler.apply(params, batch, key=3)
