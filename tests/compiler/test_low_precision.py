"""Models in JAX's low-precision float types (``bfloat16``, ``float16``), alone or mixed with
``float32``, batch and train like ``float32`` ones: outputs and gradients equal an unbatched JAX
evaluation in the same types, parameters and gradients keep their dtype, and ``check_numerics``
looks inside their arenas. ``bfloat16``'s NumPy kind is ``"V"``, not ``"f"``: layers, input
conversion and ``check_numerics`` once refused it or skipped it."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import fold as fd

H = 8
TREES = [3, (1, 4), ((1, 5), 9), (((2, 6), 5), (3, 5)), ((8, 9), (7, (9, 3)))]
# Relative to the largest magnitude compared: a few units in the last place of each type
# (bfloat16 keeps 8 bits of mantissa, float16 11).
TOLERANCE = {"bfloat16": 3e-2, "float16": 4e-3}


def tree_model(dtype: str) -> fd.Block:
    """Word ids embedded in ``dtype``, combined up the tree in ``dtype``, read out in float32."""
    node = fd.ForwardDeclaration(fd.PyObjectType(), fd.TensorType((H,), dtype))
    leaf = fd.Scalar("int32") >> fd.Embedding(10, H, dtype=dtype, name="embed")
    inner = fd.Record((node(), node())) >> fd.Concat() >> fd.FC(H, activation=jnp.tanh, name="combine")
    node.resolve_to(fd.OneOf(lambda t: isinstance(t, tuple), {False: leaf, True: inner}))
    return (node() >> fd.Function(lambda h: h.astype(jnp.float32))
            >> fd.FC(1, activation=None, name="readout") >> fd.Function(lambda y: y[:, 0]))


def reference(params: dict, tree) -> jax.Array:
    """``tree_model``'s output for one tree, in plain JAX."""
    def state(t):
        if not isinstance(t, tuple):
            return params["embed"]["table"][t]
        x = jnp.concatenate([state(t[0]), state(t[1])])
        return jnp.tanh(x @ params["combine"]["w"] + params["combine"]["b"])

    h = state(tree).astype(jnp.float32)
    return (h @ params["readout"]["w"] + params["readout"]["b"])[0]


def loss(outputs: jax.Array) -> jax.Array:
    return jnp.sum(jnp.sin(3.0 * outputs))


def close(actual, expected, dtype: str, where: str) -> None:
    actual, expected = np.asarray(actual, np.float32), np.asarray(expected, np.float32)
    scale = max(1.0, float(np.abs(expected).max()))
    np.testing.assert_allclose(actual, expected, rtol=0, atol=TOLERANCE[dtype] * scale, err_msg=where)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_outputs_and_gradients_equal_an_unbatched_evaluation(dtype):
    compiler = fd.Compiler.create(tree_model(dtype))
    params = compiler.init(jax.random.key(0))
    assert {str(p.dtype) for p in jax.tree_util.tree_leaves(params["embed"])} == {dtype}
    assert {str(p.dtype) for p in jax.tree_util.tree_leaves(params["combine"])} == {dtype}
    assert {str(p.dtype) for p in jax.tree_util.tree_leaves(params["readout"])} == {"float32"}
    batch = compiler.build_batch(TREES)

    def batched(p):
        outputs = compiler.apply(p, batch).outputs
        return loss(outputs), outputs

    def unbatched(p):
        outputs = jnp.stack([reference(p, t) for t in TREES])
        return loss(outputs), outputs

    grads, outputs = jax.jit(jax.grad(batched, has_aux=True))(params)
    expected_grads, expected = jax.grad(unbatched, has_aux=True)(params)
    assert outputs.dtype == jnp.float32
    close(outputs, expected, dtype, "outputs")
    for (path, g), ref in zip(jax.tree_util.tree_leaves_with_path(grads), jax.tree_util.tree_leaves(expected_grads)):
        assert g.dtype == ref.dtype, jax.tree_util.keystr(path)
        close(g, ref, dtype, jax.tree_util.keystr(path))
    # The embedding's gradient is not all zeros: every id of TREES got one.
    assert np.count_nonzero(np.asarray(grads["embed"]["table"], np.float32).any(axis=1)) == 9


def test_a_bfloat16_model_trains_with_optax():
    compiler = fd.Compiler.create(tree_model("bfloat16"))
    params = compiler.init(jax.random.key(1))
    optimizer = optax.adam(3e-2)
    state = optimizer.init(params)
    batch = compiler.build_batch(TREES)
    targets = jnp.asarray([0.5, -0.5, 1.0, -1.0, 0.0])

    @jax.jit
    def step(params, state):
        value, grads = jax.value_and_grad(lambda p: jnp.mean((compiler.apply(p, batch).outputs - targets) ** 2))(params)
        updates, state = optimizer.update(grads, state, params)
        return optax.apply_updates(params, updates), state, value

    losses = []
    for _ in range(40):
        params, state, value = step(params, state)
        losses.append(float(value))
    assert losses[-1] < 0.2 * losses[0], losses
    assert params["combine"]["w"].dtype == jnp.bfloat16


def test_check_numerics_looks_inside_bfloat16_arenas():
    model = fd.Map(fd.Scalar("bfloat16") >> fd.Function(jnp.log)) >> fd.Sum()
    compiler = fd.Compiler.create(model)
    with pytest.raises(FloatingPointError, match=r"^example 1: the output of Function\(log\) .*bfloat16.*not finite"):
        compiler.check_numerics({}, [[1.0, 2.0], [3.0, -1.0]])


def test_bfloat16_arrays_are_inputs_and_constants():
    bf16 = np.dtype("bfloat16")
    constant = fd.Void() >> fd.FromTensor(np.asarray([0.5, 0.25], bf16))
    model = fd.Record((fd.Vector(2, "bfloat16"), constant)) >> fd.Function(
        lambda a, b: (a * b).astype(jnp.float32))
    compiler = fd.Compiler.create(model)
    out = compiler.apply({}, compiler.build_batch([(np.asarray([2.0, 4.0], bf16), None),
                                                   ([1.0, 3.0], None)])).outputs
    np.testing.assert_array_equal(np.asarray(out), [[1.0, 1.0], [0.5, 0.75]])
