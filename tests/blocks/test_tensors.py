"""Function and Concat: type inference, results and errors."""

from __future__ import annotations

import operator

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fold as fd


def test_function_infers_output_type_from_batched_input():
    block = fd.Vector(3) >> fd.Function(lambda x: x[:, :2] * 2)
    assert block.output_type == fd.TensorType((2,))
    np.testing.assert_allclose(block.eval([1, 2, 3]), [2, 4])


def test_function_unpacks_top_level_tuple_only():
    def f(a, bc):
        b, c = bc
        return a + b * c

    block = (fd.Scalar(), (fd.Scalar(), fd.Scalar())) >> fd.Function(f)
    assert float(block.eval((1, (2, 3)))) == 7.0


def test_function_tuple_result_is_tuple_type():
    block = fd.Scalar() >> fd.Function(lambda x: (x, jnp.stack([x, x], -1)))
    assert block.output_type == fd.TupleType(fd.TensorType(()), fd.TensorType((2,)))
    a, b = block.eval(2)
    assert float(a) == 2.0 and b.tolist() == [2.0, 2.0]


def test_function_dropping_batch_dimension_is_type_error():
    with pytest.raises(TypeError, match="leading dimension must be the batch"):
        fd.Vector(3) >> fd.Function(lambda x: jnp.sum(x))


def test_function_shape_error_is_type_error():
    with pytest.raises(TypeError, match="cannot be applied"):
        fd.Vector(3) >> fd.Function(lambda x: x @ jnp.ones((4, 2)))


def test_function_calling_numpy_is_type_error_that_says_use_jax_numpy():
    # A NumPy ufunc itself once failed with "cannot create weak reference to 'numpy.ufunc' object".
    for fn in (np.tanh, lambda x: np.tanh(x)):
        with pytest.raises(TypeError, match=r"cannot be applied to input type TensorType\(\(3,\), 'float32'\): it "
                                            r"calls NumPy on its \(traced\) input; .* use jax.numpy"):
            fd.Vector(3) >> fd.Function(fn)


def test_function_of_a_builtin_or_operator():
    np.testing.assert_array_equal((fd.Vector(3) >> fd.Function(abs)).eval([1.0, -2.0, 3.0]), [1.0, 2.0, 3.0])
    both = fd.Record((fd.Vector(2), fd.Vector(2))) >> fd.Function(operator.mul)
    np.testing.assert_array_equal(both.eval(([1.0, -2.0], [3.0, 4.0])), [3.0, -8.0])


def test_function_on_pyobject_is_type_error():
    with pytest.raises(TypeError, match="tensors"):
        fd.Function(jnp.abs).set_input_type(fd.PyObjectType())


def test_concat():
    block = (fd.Vector(2), fd.Vector(3)) >> fd.Concat()
    assert block.output_type == fd.TensorType((5,))
    np.testing.assert_array_equal(block.eval(([1, 2], [3, 4, 5])), [1, 2, 3, 4, 5])
    dim1 = (fd.Tensor((2, 1)), fd.Tensor((2, 2))) >> fd.Concat(concat_dim=1)
    assert dim1.output_type == fd.TensorType((2, 3))
    flat = ((fd.Vector(1), fd.Vector(1)), fd.Vector(1)) >> fd.Concat(flatten=True)
    np.testing.assert_array_equal(flat.eval((([1], [2]), [3])), [1, 2, 3])


def test_concat_negative_dim_counts_from_the_last_as_in_numpy():
    """Concat(-1) was a TypeError ("ranks differ or are too small") where jnp.concatenate takes it."""
    assert ((fd.Tensor((2, 1)), fd.Tensor((2, 2))) >> fd.Concat(-1)).output_type == fd.TensorType((2, 3))
    assert ((fd.Tensor((2, 3)), fd.Tensor((1, 3))) >> fd.Concat(-2)).output_type == fd.TensorType((3, 3))
    assert ((fd.Scalar(), fd.Vector(2)) >> fd.Concat(-1)).output_type == fd.TensorType((3,))
    compiler = fd.Compiler.create(fd.Record((fd.Tensor((2, 3)), fd.Tensor((2, 1)))) >> fd.Concat(-1))
    rng = np.random.default_rng(0)
    examples = [(rng.normal(size=(2, 3)), rng.normal(size=(2, 1))) for _ in range(3)]
    out = compiler.apply(compiler.init(jax.random.key(0)), compiler.build_batch(examples)).outputs
    np.testing.assert_allclose(out, np.stack([np.concatenate(e, axis=-1) for e in examples]), rtol=1e-6)
    with pytest.raises(TypeError, match="along dimension -3"):
        (fd.Tensor((2, 1)), fd.Tensor((2, 2))) >> fd.Concat(-3)


@pytest.mark.parametrize("inputs, kwargs", [
    ((fd.Vector(2), fd.Tensor((2, 2))), {}),
    ((fd.Vector(2), fd.Vector(2, "int32")), {}),
    (((fd.Vector(1), fd.Vector(1)), fd.Vector(1)), {}),
    ((fd.Tensor((2, 1)), fd.Tensor((3, 1))), {"concat_dim": 1}),
])
def test_concat_incompatible_is_type_error(inputs, kwargs):
    with pytest.raises(TypeError, match="Concat"):
        inputs >> fd.Concat(**kwargs)


def test_concat_takes_scalars_as_vectors_of_one():
    """As in Fold: ``(Vector(2), Scalar()) >> Concat()`` is a vector of 3; gradients reach both."""
    model = fd.Record((fd.Vector(2), fd.Scalar(), fd.Scalar())) >> fd.Concat() >> fd.FC(2, activation=None, name="fc")
    assert (fd.Record((fd.Scalar(), fd.Scalar())) >> fd.Concat()).output_type == fd.TensorType((2,))
    compiler = fd.Compiler.create(model)
    params = compiler.init(jax.random.key(0))
    examples = [([1.0, 2.0], 3.0, -1.0), ([0.5, 0.0], 4.0, 2.0)]
    batch = compiler.build_batch(examples)
    x = np.asarray([[*v, a, b] for v, a, b in examples], np.float32)
    w, bias = params["fc"]["w"], params["fc"]["b"]
    np.testing.assert_allclose(compiler.apply(params, batch).outputs, x @ w + bias, rtol=1e-6)
    grads = jax.jit(jax.grad(lambda p: compiler.apply(p, batch).outputs.sum()))(params)
    np.testing.assert_allclose(grads["fc"]["w"], np.repeat(x.sum(0)[:, None], 2, axis=1), rtol=1e-6)
    with pytest.raises(TypeError, match="along dimension 1: ranks differ or are too small"):
        fd.Record((fd.Scalar(), fd.Scalar())) >> fd.Concat(concat_dim=1)
