"""Layers from elsewhere: Equinox and Flax (NNX, Linen) modules and pure (init, apply) pairs train
inside fold models, their parameters in the params pytree."""

from __future__ import annotations

import pickle

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fold as fd

eqx = pytest.importorskip("equinox")
flax = pytest.importorskip("flax")
from flax import linen, nnx  # noqa: E402


def _tree_rnn(cell: fd.Layer, leaf: fd.Layer) -> fd.Block:
    """A Tree-RNN: a leaf is ``leaf(vector of 2)``, an inner node ``cell(concat(left, right))``."""
    node = fd.ForwardDeclaration(fd.PyObjectType(), fd.TensorType((4,)))
    node.resolve_to(fd.OneOf(lambda t: isinstance(t, tuple), {
        False: fd.Vector(2) >> leaf,
        True: fd.Record((node(), node())) >> fd.Concat() >> cell,
    }))
    return node() >> fd.Function(lambda h: h.sum(-1))


TREES = [[1.0, 2.0], ([0.5, -1.0], [2.0, 0.0]), (([1.0, 1.0], [0.0, 3.0]), [-2.0, 1.0])]


def _check_against(compiler: fd.Compiler, params: dict, reference) -> None:
    """Outputs and gradients equal a per-tree ``reference(params, tree)``, and the gradient agrees
    with a central finite difference along a random direction."""
    batch = compiler.build_batch(TREES)

    def loss(p):
        return jnp.sum(jnp.sin(compiler.apply(p, batch).outputs))

    expected = jnp.stack([reference(params, t) for t in TREES])
    np.testing.assert_allclose(compiler.apply(params, batch).outputs, expected, rtol=1e-5, atol=1e-6)
    grads = jax.jit(jax.grad(loss))(params)
    ref_grads = jax.grad(lambda p: sum(jnp.sin(reference(p, t)) for t in TREES))(params)
    for g, r in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(ref_grads)):
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-5)
    _check_directional_derivative(loss, params, grads)
    # Parameters round-trip through a checkpoint (pickled host arrays) unchanged.
    restored = pickle.loads(pickle.dumps(jax.device_get(params)))
    np.testing.assert_array_equal(compiler.apply(restored, batch).outputs, compiler.apply(params, batch).outputs)


def _check_stochastic(compiler: fd.Compiler, params: dict) -> None:
    """With a key the outputs change and depend only on the key, and the gradient agrees with a
    central finite difference (the backward pass draws what the forward pass drew)."""
    batch = compiler.build_batch(TREES)
    key = jax.random.key(3)

    def loss(p):
        return jnp.sum(jnp.sin(compiler.apply(p, batch, key).outputs))

    drawn = compiler.apply(params, batch, key).outputs
    assert not np.allclose(drawn, compiler.apply(params, batch).outputs)
    np.testing.assert_array_equal(drawn, compiler.apply(params, batch, key).outputs)
    _check_directional_derivative(loss, params, jax.grad(loss)(params))


def _check_directional_derivative(loss, params: dict, grads: dict) -> None:
    """``grads`` agrees with a central finite difference of ``loss`` along a random direction."""
    leaves, tree = jax.tree_util.tree_flatten(params)
    keys = jax.random.split(jax.random.key(7), len(leaves))
    direction = tree.unflatten([jax.random.normal(k, x.shape, x.dtype) for k, x in zip(keys, leaves)])
    eps = 1e-3
    shifted = [jax.tree_util.tree_map(lambda x, d, s=s: x + s * eps * d, params, direction) for s in (1, -1)]
    numeric = (loss(shifted[0]) - loss(shifted[1])) / (2 * eps)
    flat_grads, flat_direction = jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(direction)
    analytic = sum(jnp.vdot(g, d) for g, d in zip(flat_grads, flat_direction))
    np.testing.assert_allclose(numeric, analytic, rtol=2e-2, atol=2e-3)


def _walk(tree, leaf_fn, cell_fn):
    if isinstance(tree, tuple):
        return cell_fn(jnp.concatenate([_walk(tree[0], leaf_fn, cell_fn), _walk(tree[1], leaf_fn, cell_fn)]))
    return leaf_fn(jnp.asarray(tree, jnp.float32))


def test_an_equinox_mlp_as_the_cell_of_a_tree_rnn():
    cell = eqx.nn.MLP(8, 4, 16, 1, activation=jnp.tanh, key=jax.random.key(1))
    leaf = eqx.nn.Linear(2, 4, key=jax.random.key(2))
    compiler = fd.Compiler.create(_tree_rnn(fd.Layer.from_equinox(cell, name="cell"),
                                            fd.Layer.from_equinox(leaf, name="leaf")))
    params = compiler.init(jax.random.key(0))
    assert sorted(params) == ["cell", "leaf"]

    def reference(p, t):
        # The parameters are the modules' floating-point arrays; the rest (activations) is the module's.
        def rebuild(module, arrays):
            return eqx.combine(arrays, eqx.filter(module, eqx.is_inexact_array, inverse=True))
        return _walk(t, rebuild(leaf, p["leaf"]), rebuild(cell, p["cell"])).sum()

    _check_against(compiler, params, reference)


class _DropoutMLP(eqx.Module):
    """An MLP with dropout on its hidden layer: its ``__call__`` takes ``key=``, as Equinox's do."""

    first: eqx.nn.Linear
    second: eqx.nn.Linear
    dropout: eqx.nn.Dropout

    def __init__(self, key):
        k1, k2 = jax.random.split(key)
        self.first, self.second = eqx.nn.Linear(8, 16, key=k1), eqx.nn.Linear(16, 4, key=k2)
        self.dropout = eqx.nn.Dropout(0.5)

    def __call__(self, x, *, key=None):
        return jnp.tanh(self.second(self.dropout(jnp.tanh(self.first(x)), key=key)))


def test_an_equinox_module_with_dropout_draws_with_a_key_and_is_in_inference_mode_without():
    # It once failed at create: "Dropout requires a key when running in non-deterministic mode".
    cell = _DropoutMLP(jax.random.key(1))
    leaf = eqx.nn.Linear(2, 4, key=jax.random.key(2))
    compiler = fd.Compiler.create(_tree_rnn(fd.Layer.from_equinox(cell, name="cell"),
                                            fd.Layer.from_equinox(leaf, name="leaf")))
    params = compiler.init(jax.random.key(0))

    def reference(p, t):
        def rebuild(module, arrays):
            return eqx.combine(arrays, eqx.filter(module, eqx.is_inexact_array, inverse=True))
        return _walk(t, rebuild(leaf, p["leaf"]), eqx.nn.inference_mode(rebuild(cell, p["cell"]))).sum()

    _check_against(compiler, params, reference)
    _check_stochastic(compiler, params)


def test_a_flax_nnx_mlp_as_the_cell_of_a_tree_rnn():
    class MLP(nnx.Module):
        def __init__(self, rngs: nnx.Rngs):
            self.hidden = nnx.Linear(8, 16, rngs=rngs)
            self.out = nnx.Linear(16, 4, rngs=rngs)

        def __call__(self, x):
            return self.out(jnp.tanh(self.hidden(x)))

    layer = fd.Layer.from_flax(MLP(nnx.Rngs(0)), name="cell")
    leaf = fd.Layer.from_flax(nnx.Linear(2, 4, rngs=nnx.Rngs(1)), name="leaf")
    compiler = fd.Compiler.create(_tree_rnn(layer, leaf))
    params = compiler.init(jax.random.key(0))

    def reference(p, t):
        return _walk(t, lambda x: leaf.apply(p["leaf"], x[None])[0], lambda x: layer.apply(p["cell"], x[None])[0]).sum()

    _check_against(compiler, params, reference)


def test_a_flax_linen_module_makes_its_variables_from_the_compilers_key():
    class MLP(linen.Module):
        @linen.compact
        def __call__(self, x):
            return linen.Dense(4)(jnp.tanh(linen.Dense(16)(x)))

    cell, leaf = fd.Layer.from_flax(MLP(), name="cell"), fd.Layer.from_flax(linen.Dense(4), name="leaf")
    compiler = fd.Compiler.create(_tree_rnn(cell, leaf))
    params = compiler.init(jax.random.key(0))
    assert params["cell"]["params"]["Dense_1"]["kernel"].shape == (8, 16)  # Dense(4) was made first
    again = compiler.init(jax.random.key(0))
    np.testing.assert_array_equal(params["leaf"]["params"]["kernel"], again["leaf"]["params"]["kernel"])

    def reference(p, t):
        return _walk(t, lambda x: linen.Dense(4).apply(p["leaf"], x[None])[0],
                     lambda x: MLP().apply(p["cell"], x[None])[0]).sum()

    _check_against(compiler, params, reference)


def _dense(kernel, bias, x):
    return x @ kernel + bias


def _is_variable(x) -> bool:
    return isinstance(x, nnx.Variable)


def test_a_flax_nnx_module_with_dropout_draws_with_a_key_and_is_deterministic_without():
    # It once failed at create: "TraceContextError: Cannot mutate RngCount from a different trace level".
    class DropoutMLP(nnx.Module):
        def __init__(self, rngs: nnx.Rngs):
            self.hidden, self.out = nnx.Linear(8, 16, rngs=rngs), nnx.Linear(16, 4, rngs=rngs)
            self.dropout = nnx.Dropout(0.5, rngs=rngs)

        def __call__(self, x):
            return self.out(self.dropout(jnp.tanh(self.hidden(x))))

    cell = fd.Layer.from_flax(DropoutMLP(nnx.Rngs(0, dropout=1)), name="cell")
    leaf = fd.Layer.from_flax(nnx.Linear(2, 4, rngs=nnx.Rngs(1)), name="leaf")
    assert cell.stochastic and not leaf.stochastic
    compiler = fd.Compiler.create(_tree_rnn(cell, leaf))
    params = compiler.init(jax.random.key(0))

    def reference(p, t):  # without a key, dropout is the identity
        c, lf = jax.tree.map(lambda v: v.get_value(), (p["cell"], p["leaf"]), is_leaf=_is_variable)
        return _walk(t, lambda x: _dense(lf["kernel"], lf["bias"], x),
                     lambda x: _dense(c["out"]["kernel"], c["out"]["bias"],
                                      jnp.tanh(_dense(c["hidden"]["kernel"], c["hidden"]["bias"], x)))).sum()

    _check_against(compiler, params, reference)
    _check_stochastic(compiler, params)
    batch = compiler.build_batch(TREES)
    assert not np.allclose(compiler.apply(params, batch, jax.random.key(3)).outputs,
                           compiler.apply(params, batch, jax.random.key(4)).outputs)
    with pytest.raises(TypeError, match="rngs, train_kwargs and eval_kwargs are for Linen modules"):
        fd.Layer.from_flax(DropoutMLP(nnx.Rngs(0, dropout=1)), rngs=("dropout",))


def test_a_flax_nnx_module_that_updates_its_state_is_refused_and_frozen_statistics_are_kept():
    # With the state copied under the trace, BatchNorm's update ran and was dropped: statistics over
    # a batched call's padded rows, silently.
    class Normed(nnx.Module):
        def __init__(self, frozen: bool, rngs: nnx.Rngs):
            self.lin = nnx.Linear(2, 4, rngs=rngs)
            self.norm = nnx.BatchNorm(4, use_running_average=frozen, rngs=rngs)

        def __call__(self, x):
            return self.norm(self.lin(x))

    with pytest.raises(TypeError, match=r"Normed updates its state \['norm'\]\['mean'\].*, \['norm'\]\['var'\].* as "
                                        r"it runs \(batch statistics\?\).*use_running_average=True"):
        fd.Compiler.create(_tree_rnn(fd.Layer.from_flax(nnx.Linear(8, 4, rngs=nnx.Rngs(0)), name="cell"),
                                     fd.Layer.from_flax(Normed(False, nnx.Rngs(1)), name="leaf")))
    module = Normed(True, nnx.Rngs(1))
    module.norm.mean.set_value(jnp.asarray([0.5, -0.5, 1.0, 0.0]))
    module.norm.var.set_value(jnp.asarray([4.0, 1.0, 0.25, 1.0]))
    leaf = fd.Layer.from_flax(module, name="leaf")
    cell = fd.Layer.from_flax(nnx.Linear(8, 4, rngs=nnx.Rngs(0)), name="cell")
    compiler = fd.Compiler.create(_tree_rnn(cell, leaf))
    params = compiler.init(jax.random.key(0))
    mean, var = np.asarray([0.5, -0.5, 1.0, 0.0]), np.asarray([4.0, 1.0, 0.25, 1.0])

    def reference(p, t):
        c, lf = jax.tree.map(lambda v: v.get_value(), (p["cell"], p["leaf"]), is_leaf=_is_variable)
        return _walk(t, lambda x: ((_dense(lf["lin"]["kernel"], lf["lin"]["bias"], x) - mean) / jnp.sqrt(var + 1e-5)
                                   * lf["norm"]["scale"] + lf["norm"]["bias"]),
                     lambda x: _dense(c["kernel"], c["bias"], x)).sum()

    _check_against(compiler, params, reference)


def test_a_flax_linen_module_with_dropout_draws_from_its_rngs_with_a_key():
    class DropoutMLP(linen.Module):
        @linen.compact
        def __call__(self, x, train: bool = False):
            h = linen.Dropout(0.5, deterministic=not train)(jnp.tanh(linen.Dense(16)(x)))
            return linen.Dense(4)(h)

    cell = fd.Layer.from_flax(DropoutMLP(), name="cell", rngs=("dropout",), train_kwargs={"train": True})
    compiler = fd.Compiler.create(_tree_rnn(cell, fd.Layer.from_flax(linen.Dense(4), name="leaf")))
    params = compiler.init(jax.random.key(0))

    def reference(p, t):
        c, lf = p["cell"]["params"], p["leaf"]["params"]
        return _walk(t, lambda x: _dense(lf["kernel"], lf["bias"], x),
                     lambda x: _dense(c["Dense_1"]["kernel"], c["Dense_1"]["bias"],
                                      jnp.tanh(_dense(c["Dense_0"]["kernel"], c["Dense_0"]["bias"], x)))).sum()

    _check_against(compiler, params, reference)
    _check_stochastic(compiler, params)
    for bad, error, match in [
        (dict(rngs="dropout"), TypeError, "as a tuple of strings"),
        (dict(rngs=("params",)), ValueError, "init's own"),
        (dict(train_kwargs={"train": True}), ValueError, "need rngs="),
    ]:
        with pytest.raises(error, match=match):
            fd.Layer.from_flax(DropoutMLP(), **bad)


def test_a_pure_pair_is_a_layer():
    def init(key, input_type):
        return {"w": jax.random.normal(key, (input_type.shape[0], 4)) * 0.5}

    cell = fd.Layer.from_pure(init, lambda p, x: jnp.tanh(x @ p["w"]), name="cell")
    leaf = fd.Layer.from_pure(init, lambda p, x: x @ p["w"], name="leaf")
    compiler = fd.Compiler.create(_tree_rnn(cell, leaf))
    params = compiler.init(jax.random.key(0))
    _check_against(compiler, params,
                   lambda p, t: _walk(t, lambda x: x @ p["leaf"]["w"], lambda x: jnp.tanh(x @ p["cell"]["w"])).sum())
    with pytest.raises(TypeError, match="two callables"):
        fd.Layer.from_pure(init, None)


def test_a_pure_pair_whose_apply_takes_a_key_draws_with_it():
    # Its key was once never passed: the layer ran deterministically whatever apply got.
    def init(key, input_type):
        return {"w": jax.random.normal(key, (input_type.shape[0], 4)) * 0.5}

    def noisy(p, x, *, key=None):
        h = jnp.tanh(x @ p["w"])
        return h if key is None else h * jax.random.bernoulli(key, 0.5, h.shape) * 2.0

    compiler = fd.Compiler.create(_tree_rnn(fd.Layer.from_pure(init, noisy, name="cell"),
                                            fd.Layer.from_pure(init, lambda p, x: x @ p["w"], name="leaf")))
    params = compiler.init(jax.random.key(0))
    _check_against(compiler, params,
                   lambda p, t: _walk(t, lambda x: x @ p["leaf"]["w"], lambda x: jnp.tanh(x @ p["cell"]["w"])).sum())
    _check_stochastic(compiler, params)


@pytest.mark.parametrize("make", [
    lambda: jax.vmap(eqx.nn.MLP(2, 2, 4, 1, key=jax.random.key(0))),
    lambda: eqx.nn.Linear(2, 2, key=jax.random.key(0)),
    lambda: nnx.Linear(2, 2, rngs=nnx.Rngs(0)),
    lambda: linen.Dense(2),
])
def test_a_function_over_a_module_is_an_error_naming_the_adapter(make):
    """Before, fd.Function(jax.vmap(eqx_mlp)) compiled, ran, and trained nothing (init gave {})."""
    with pytest.raises(TypeError, match=r"holds arrays that would never train.*fd\.Layer\.from_equinox"):
        fd.Function(make())
    assert fd.Function(jnp.tanh).fn is jnp.tanh  # plain functions are fine


def test_a_frozen_module_keeps_its_parameters():
    leaf = fd.Layer.from_equinox(eqx.nn.Linear(2, 4, key=jax.random.key(2)), name="leaf", trainable=False)
    cell = fd.Layer.from_equinox(eqx.nn.Linear(8, 4, key=jax.random.key(3)), name="cell")
    compiler = fd.Compiler.create(_tree_rnn(cell, leaf))
    params = compiler.init(jax.random.key(0))
    batch = compiler.build_batch(TREES)
    grads = jax.jit(jax.grad(lambda p: compiler.apply(p, batch).outputs.sum()))(params)
    assert all(float(jnp.abs(g).max()) == 0 for g in jax.tree_util.tree_leaves(grads["leaf"]))
    assert any(float(jnp.abs(g).max()) > 0 for g in jax.tree_util.tree_leaves(grads["cell"]))
