"""Gradients through ``apply`` against finite differences and sums over parts of a batch."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import fold as fd
from tests.models import MODELS, enable_x64


def _loss_from_outputs(out: jax.Array) -> jax.Array:
    return jnp.sum(jnp.sin(out) ** 2)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_grad_matches_finite_differences_and_reference(name):
    with enable_x64():
        block, reference, examples = MODELS[name](dtype="float64", n=10)
        compiler = fd.Compiler.create(block)
        params = compiler.init(jax.random.key(3))
        batch = compiler.build_batch(examples)

        def ref_loss(p):
            return sum(float(np.sum(np.sin(reference(p, e)) ** 2)) for e in examples)

        grad_fn = jax.jit(jax.value_and_grad(lambda p, b: _loss_from_outputs(compiler.apply(p, b).outputs)))
        value, grads = grad_fn(params, batch)
        np.testing.assert_allclose(float(value), ref_loss(params), rtol=1e-9)

        # The gradients of two halves of the batch sum to the batch's. The halves come from
        # ``batches``, which plans one layout for both (batches of one would each get their own
        # exact layout and compile again).
        halves = list(compiler.batches(examples, len(examples) // 2))
        assert [int(i) for b in halves for i in b.example_indices] == list(range(len(examples)))
        assert halves[0].layout == halves[1].layout
        summed = jax.tree_util.tree_map(lambda *g: sum(g), *[grad_fn(params, b)[1] for b in halves])
        for a, b in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(summed)):
            np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)

        # Central differences of the independent NumPy reference, on a few coordinates.
        rng = np.random.default_rng(0)
        flat, unravel = jax.flatten_util.ravel_pytree(params)
        g_flat, _ = jax.flatten_util.ravel_pytree(grads)
        assert np.all(np.isfinite(g_flat))
        assert np.any(g_flat != 0)
        eps = 1e-6
        for i in rng.choice(flat.size, size=min(12, flat.size), replace=False):
            step = np.zeros(flat.size)
            step[i] = eps
            fd_grad = (ref_loss(unravel(flat + step)) - ref_loss(unravel(flat - step))) / (2 * eps)
            np.testing.assert_allclose(g_flat[i], fd_grad, rtol=1e-5, atol=1e-8, err_msg=f"{name} coord {i}")


def test_padding_never_leaks_nan_into_gradients():
    """log and sqrt(|x|) are not finite at 0: padded rows must never reach them."""
    fc = fd.FC(1, activation=None, name="fc")
    elem = (fd.Scalar() >> fd.Function(lambda x: x[:, None]) >> fd.Function(fc)
            >> fd.Function(lambda y: jnp.log(y[:, 0] ** 2) + jnp.sqrt(jnp.abs(y[:, 0]))))
    step = fd.Function(lambda acc, y: acc + jnp.log(jnp.abs(acc) + 1.0) * y)
    model = fd.Map(elem) >> fd.Fold(step, fd.FromTensor(np.float32(1.0)))
    compiler = fd.Compiler.create(model)
    params = {"fc": {"w": jnp.ones((1, 1)), "b": jnp.zeros((1,))}}
    examples = [[1.0, 2.0, 3.0], [0.5], [2.0] * 11, [1.5, 0.25]]
    batch = compiler.build_batch(examples)

    def loss(p, b):
        return jnp.sum(compiler.apply(p, b).outputs)

    grad_fn = jax.jit(jax.grad(loss))
    grads = grad_fn(params, batch)
    leaves = jax.tree_util.tree_leaves(grads)
    assert all(bool(jnp.all(jnp.isfinite(g))) for g in leaves)
    summed = jax.tree_util.tree_map(
        lambda *g: sum(g), *[grad_fn(params, compiler.build_batch([e])) for e in examples])
    for a, b in zip(leaves, jax.tree_util.tree_leaves(summed)):
        np.testing.assert_allclose(a, b, rtol=1e-5)


def test_non_trainable_layer_gets_zero_gradient():
    table = np.arange(12, dtype=np.float32).reshape(4, 3)
    embed = fd.Embedding(4, 3, initializer=table, trainable=False, name="embedding")
    fc = fd.FC(2, name="fc")
    model = fd.Map(fd.Scalar("int32") >> fd.Function(embed) >> fd.Function(fc)) >> fd.Sum()
    compiler = fd.Compiler.create(model)
    params = compiler.init(jax.random.key(0))
    np.testing.assert_array_equal(params["embedding"]["table"], table)
    batch = compiler.build_batch([[0, 1], [3]])
    grads = jax.jit(jax.grad(lambda p: jnp.sum(compiler.apply(p, batch).outputs ** 2)))(params)
    assert not np.any(np.asarray(grads["embedding"]["table"]))
    assert np.any(np.asarray(grads["fc"]["w"]))


def test_training_with_optax_reduces_loss():
    block, _, examples = MODELS["tree_lstm"](n=16)
    model = fd.Record((block >> fd.FC(1, activation=None) >> fd.Function(lambda y: y[:, 0]), fd.Scalar())) \
        >> fd.Function(lambda y, t: (y - t) ** 2) >> fd.Metric("loss")
    compiler = fd.Compiler.create(model)
    params = compiler.init(jax.random.key(0))
    data = [(t, float(len(str(t)) % 3)) for t in examples]
    batch = compiler.build_batch(data)
    optimizer = optax.adam(0.05)
    opt_state = optimizer.init(params)

    @jax.jit
    def train_step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(lambda p: compiler.apply(p, batch).metrics["loss"].mean())(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    losses = []
    for _ in range(30):
        params, opt_state, loss = train_step(params, opt_state, batch)
        losses.append(float(loss))
    assert losses[-1] < 0.5 * losses[0]


def test_integer_values_computed_inside_the_loop():
    """An op with an int output in the loop (argmax -> embedding) has no cotangent but works."""
    embed, fc = fd.Embedding(5, 3, name="embedding"), fd.FC(5, name="fc")
    elem = (fd.Vector(2) >> fd.Function(fc) >> fd.Function(lambda h: jnp.argmax(h, -1).astype(jnp.int32))
            >> fd.Function(embed))
    model = fd.Map(elem) >> fd.Fold(fd.Function(lambda a, x: a * 0.5 + x), fd.Zeros((3,)))
    compiler = fd.Compiler.create(model)
    params = compiler.init(jax.random.key(0))
    examples = [[[1, 2], [3, -4], [0.5, 0.5]], [[1, 1]], [[-1, 0]] * 9]
    batch = compiler.build_batch(examples)
    assert batch.layout.loop_ops, "the embedding should run inside the loop here"
    table = np.asarray(params["embedding"]["table"])
    w, b = np.asarray(params["fc"]["w"]), np.asarray(params["fc"]["b"])
    for row, xs in zip(np.asarray(compiler.apply(params, batch).outputs), examples):
        acc = np.zeros(3)
        for x in xs:
            acc = acc * 0.5 + table[np.argmax(np.maximum(np.asarray(x) @ w + b, 0))]
        np.testing.assert_allclose(row, acc, rtol=1e-5, atol=1e-6)
    grad_fn = jax.jit(jax.grad(lambda p, bt: jnp.sum(compiler.apply(p, bt).outputs ** 2)))
    grads = grad_fn(params, batch)
    assert not np.any(np.asarray(grads["fc"]["w"]))  # argmax blocks the gradient
    summed = sum(np.asarray(grad_fn(params, compiler.build_batch([e]))["embedding"]["table"]) for e in examples)
    np.testing.assert_allclose(np.asarray(grads["embedding"]["table"]), summed, rtol=1e-5)


TREES = [0.5, (0.1, -0.3), ((0.2, 0.4), -0.7), (((0.3, -0.1), 0.9), (0.2, -0.6))]


def _tree_rnn(hidden: int = 3) -> tuple[fd.Block, Callable]:
    """A recursive tree model (its loop runs in ``apply``'s ``while_loop``) and an unbatched JAX
    evaluation of one tree, differentiable to any order."""
    node = fd.ForwardDeclaration(fd.PyObjectType(), fd.TensorType((hidden,), "float64"))
    leaf = (fd.Scalar("float64") >> fd.Function(lambda x: x[:, None] * jnp.ones((1, hidden), x.dtype))
            >> fd.FC(hidden, activation=jnp.tanh, name="leaf"))
    inner = fd.Record((node(), node())) >> fd.Concat() >> fd.FC(hidden, activation=jnp.tanh, name="inner")
    node.resolve_to(fd.OneOf(lambda t: isinstance(t, tuple), {False: leaf, True: inner}))

    def reference(p: dict, tree) -> jax.Array:
        if isinstance(tree, tuple):
            x = jnp.concatenate([reference(p, tree[0]), reference(p, tree[1])])
            return jnp.tanh(x @ p["inner"]["w"] + p["inner"]["b"])
        return jnp.tanh(tree * jnp.ones(hidden) @ p["leaf"]["w"] + p["leaf"]["b"])

    return node() >> fd.Function(lambda h: jnp.sum(h, -1)), reference


# Each backward mode compiles two second-order programs (about 20 s): saving runs under -m slow.
@pytest.mark.parametrize("backward", ["recompute", pytest.param("save", marks=pytest.mark.slow)])
def test_second_order_derivatives_match_an_unbatched_evaluation(backward):
    """``apply`` is a ``custom_vjp`` whose backward pass is plain JAX, so forward over reverse
    (``jvp`` of a ``grad``: Hessian-vector products, and ``jax.hessian``) differentiates it, in
    either backward mode. Forward mode on ``apply`` itself and reverse over reverse (the backward
    loop is a ``while_loop``) are refused with JAX's errors, as docs/errors.md shows."""
    with enable_x64():
        block, reference = _tree_rnn()
        trees = TREES
        derivatives = {
            "jvp of grad": lambda f, p: jax.jvp(jax.grad(f), (p,), (p,))[1],
            "hessian": lambda f, p: jax.hessian(f)(p)["inner"],
        }
        params = fd.Compiler.create(block).init(jax.random.key(0))
        want = {name: jax.jit(lambda p, d=d: d(lambda q: sum(jnp.sin(jnp.sum(reference(q, t))) for t in trees), p))(
            params) for name, d in derivatives.items()}
        compiler = fd.Compiler.create(block, backward=backward)
        batch = compiler.build_batch(trees)

        def batched(p):
            return jnp.sum(jnp.sin(compiler.apply(p, batch).outputs))

        for name, derivative in derivatives.items():
            got = jax.jit(lambda p, d=derivative: d(batched, p))(params)
            assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want[name]), name
            for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want[name])):
                assert np.abs(np.asarray(w)).max() > 1e-3, name  # not a comparison of zeros
                np.testing.assert_allclose(g, w, rtol=1e-9, atol=1e-12, err_msg=name)
        # A tree four pairs deep keeps a loop (shallower calls run after it, as whole groups).
        deep = compiler.build_batch([*trees, ((((0.1, 0.2), 0.3), 0.4), 0.5)])
        assert deep.stats.num_items > 0
        with pytest.raises(ValueError, match="Reverse-mode differentiation does not work for lax.while_loop"):
            jax.grad(lambda q: jnp.sum(jax.grad(lambda r: jnp.sum(jnp.sin(compiler.apply(r, deep).outputs)))(q)
                                       ["inner"]["w"] ** 2))(params)


def test_vmap_over_parameter_sets_equals_each_set_alone():
    """An ensemble: ``jax.vmap`` over stacked parameters runs the batch's loop once per set, and
    its outputs and gradients equal each set's own, and the unbatched evaluation's."""
    with enable_x64():
        block, reference = _tree_rnn()
        trees = TREES
        compiler = fd.Compiler.create(block)
        sets = [compiler.init(jax.random.key(k)) for k in range(3)]
        stacked = jax.tree_util.tree_map(lambda *p: jnp.stack(p), *sets)
        batch = compiler.build_batch(trees)

        def loss(p):
            return jnp.sum(jnp.sin(compiler.apply(p, batch).outputs))

        outputs = jax.jit(jax.vmap(lambda p: compiler.apply(p, batch).outputs))(stacked)
        grads = jax.jit(jax.vmap(jax.grad(loss)))(stacked)
        assert outputs.shape == (3, len(trees)) and outputs.dtype == jnp.float64
        for k, p in enumerate(sets):
            np.testing.assert_allclose(outputs[k], [jnp.sum(reference(p, t)) for t in trees], rtol=1e-12)
            want = jax.grad(lambda q: sum(jnp.sin(jnp.sum(reference(q, t))) for t in trees))(p)
            for g, w in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(want)):
                np.testing.assert_allclose(g[k], w, rtol=1e-10, atol=1e-14)


@pytest.mark.parametrize("backward", ["recompute", "save", "auto"])
def test_mutually_recursive_declarations_with_layers_match_an_unbatched_evaluation(backward):
    """Two declarations that call each other, each with a layer of its own and one shared by
    both (even levels sum their children, odd ones take the max; leaves differ by parity):
    outputs and gradients equal a per-example evaluation in plain ``jax.numpy``, including empty
    lists, in every backward mode."""
    h = 4
    even = fd.ForwardDeclaration(fd.PyObjectType(), fd.TensorType((h,)))
    odd = fd.ForwardDeclaration(fd.PyObjectType(), fd.TensorType((h,)))
    layers = {name: fd.FC(h, name=name) for name in ("even", "odd", "leaf")}
    is_list = lambda t: isinstance(t, list)  # noqa: E731
    even.resolve_to(fd.OneOf(is_list, {
        False: fd.Scalar() >> fd.Function(lambda x: jnp.stack([x, x * x], -1)) >> fd.Function(layers["leaf"]),
        True: fd.Map(odd()) >> fd.Sum() >> fd.Function(layers["even"])}))
    odd.resolve_to(fd.OneOf(is_list, {
        False: fd.Scalar() >> fd.Function(lambda x: jnp.stack([x, -x], -1)) >> fd.Function(layers["leaf"]),
        True: fd.Map(even()) >> fd.Max() >> fd.Function(layers["odd"])}))
    compiler = fd.Compiler.create(even() >> fd.Function(lambda y: jnp.sum(jnp.sin(y), -1)), backward=backward,
                                  chunk_size=8)
    examples = [[1.0, [2.0, [3.0, 0.5]]], 4.0, [[5.0], 6.0, [[7.0, -8.0]]], [], [[]], [0.1, [0.2, [0.3, [0.4]]]]]
    # init's parameters moved off zero biases, so that Max meets no exact ties.
    params = jax.tree_util.tree_map(lambda a: a + 0.1 * jax.random.normal(jax.random.key(1), a.shape),
                                    compiler.init(jax.random.key(0)))

    def fc(p: dict, name: str, x: jax.Array) -> jax.Array:
        return jax.nn.relu(x @ p[name]["w"] + p[name]["b"])

    def reference(p: dict, t, level: int) -> jax.Array:
        if not isinstance(t, list):
            x = jnp.float32(t)
            return fc(p, "leaf", jnp.stack([x, x * x] if level % 2 == 0 else [x, -x]))
        kids = [reference(p, k, level + 1) for k in t]
        if not kids:
            pooled = jnp.zeros(h)
        else:
            pooled = jnp.sum(jnp.stack(kids), 0) if level % 2 == 0 else jnp.max(jnp.stack(kids), 0)
        return fc(p, "even" if level % 2 == 0 else "odd", pooled)

    def expected_loss(p: dict) -> jax.Array:
        return sum(jnp.sum(jnp.sin(reference(p, e, 0))) ** 2 for e in examples)

    batch = compiler.build_batch(examples)
    np.testing.assert_allclose(compiler.apply(params, batch).outputs,
                               [jnp.sum(jnp.sin(reference(params, e, 0))) for e in examples], rtol=1e-5, atol=1e-6)
    value, grads = jax.jit(jax.value_and_grad(lambda p: jnp.sum(compiler.apply(p, batch).outputs ** 2)))(params)
    want_value, want_grads = jax.value_and_grad(expected_loss)(params)
    np.testing.assert_allclose(value, want_value, rtol=1e-5)
    for (path, g), want in zip(jax.tree_util.tree_leaves_with_path(grads), jax.tree_util.tree_leaves(want_grads)):
        np.testing.assert_allclose(g, want, rtol=1e-4, atol=1e-6, err_msg=jax.tree_util.keystr(path))
    assert all(float(jnp.abs(g).max()) > 0 for g in jax.tree_util.tree_leaves(grads))
