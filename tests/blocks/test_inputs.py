"""Input blocks: Scalar, Vector, Tensor, FromTensor, OneHot, Optional, Zeros, ..."""

from __future__ import annotations

import itertools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fold as fd


def test_scalar_vector_tensor():
    s = fd.Scalar("int32")
    assert s.input_type == fd.PyObjectType() and s.output_type == fd.TensorType((), "int32")
    out = s.eval(7)
    assert isinstance(out, np.ndarray) and out.shape == () and out.dtype == np.int32 and out == 7
    np.testing.assert_array_equal(fd.Vector(3).eval([1, 2, 3]), np.array([1, 2, 3], np.float32))
    np.testing.assert_array_equal(fd.Tensor((2, 2)).eval([[1, 2], [3, 4]]), [[1, 2], [3, 4]])


def test_from_tensor_reads_no_input_as_in_fold():
    block = fd.FromTensor(np.array([1.0, 2.0], np.float32))
    assert block.input_type == fd.VoidType() and block.output_type == fd.TensorType((2,))
    np.testing.assert_array_equal(block.eval(None), [1.0, 2.0])
    with pytest.raises(TypeError):
        fd.FromTensor(np.array(["a"]))


def test_from_tensor_where_a_value_arrives_says_to_put_void_before_it():
    hint = r"but FromTensor has VoidType\(\) .* reads no input .* fd\.Void\(\) >> fd\.FromTensor"
    with pytest.raises(TypeError, match=hint):
        fd.AllOf(fd.Scalar(), fd.FromTensor(np.float32(0.5)))
    pair = fd.AllOf(fd.Scalar(), fd.Void() >> fd.FromTensor(np.float32(0.5))) >> fd.Function(jnp.multiply)
    compiler = fd.Compiler.create(pair)
    out = compiler.apply(compiler.init(jax.random.key(0)), compiler.build_batch([2.0, -4.0])).outputs
    np.testing.assert_allclose(out, [1.0, -2.0])


def test_from_tensor_refuses_a_64_bit_value_its_32_bit_type_cannot_hold():
    """``FromTensor(np.array([2**40]))`` held 0 (int64 wrapped to int32 while x64 is off) and
    ``FromTensor(np.array([1e39]))`` inf, both silently."""
    if jax.config.jax_enable_x64:
        pytest.skip("x64 is on: nothing is narrowed")
    with pytest.raises(ValueError, match=r"FromTensor: value array\(\[1099511627776\]\) does not fit in int32 "
                                         r"\(JAX holds int64 as int32"):
        fd.FromTensor(np.array([2**40], np.int64))
    with pytest.raises(ValueError, match="FromTensor: value .* overflows float32"):
        fd.FromTensor(np.array([1e39]))
    np.testing.assert_array_equal(fd.FromTensor(np.array([-(2**31), 7], np.int64)).tensor, [-(2**31), 7])
    assert fd.FromTensor(np.array([0.1])).tensor.dtype == np.float32


@pytest.mark.parametrize("value", [42, 1.5, [1.0, 2.0], (1, 2), None])
def test_from_tensor_refuses_python_values_as_fold_does(value):
    with pytest.raises(TypeError, match="FromTensor needs a NumPy or JAX array.*np.float32"):
        fd.FromTensor(value)
    assert fd.FromTensor(np.float32(42)).output_type == fd.TensorType(())
    assert fd.FromTensor(jnp.ones(2, jnp.int32)).output_type == fd.TensorType((2,), "int32")


def test_input_transform_and_identity_and_void():
    block = fd.InputTransform(lambda s: [ord(c) - 96 for c in s]) >> fd.Map(fd.Scalar()) >> fd.Sum()
    assert float(block.eval("abc")) == 6.0
    assert fd.Identity().eval({"a": 1}) == {"a": 1}
    assert (fd.Scalar() >> fd.Void()).eval(3) is None
    with pytest.raises(TypeError):
        fd.InputTransform(3)


def test_an_input_transform_returning_an_iterator_feeds_every_reader():
    """``map(float, s.split())`` feeding two readers: the second saw it exhausted (3 and 0 for 3 and 6)."""
    both = fd.InputTransform(lambda s: map(float, s.split())) >> fd.AllOf(
        fd.Map(fd.Scalar()) >> fd.Sum(), fd.Map(fd.Scalar() >> fd.Function(lambda x: 2 * x)) >> fd.Sum())
    compiler = fd.Compiler.create(both)
    out = compiler.apply(compiler.init(jax.random.key(0)), compiler.build_batch(["1 2", "3 4 5"])).outputs
    np.testing.assert_allclose(np.asarray(out[0]), [3, 12])
    np.testing.assert_allclose(np.asarray(out[1]), [6, 24])


def test_one_hot():
    np.testing.assert_array_equal(fd.OneHot(3).eval(1), [0, 1, 0])
    np.testing.assert_array_equal(fd.OneHot(2, 5, dtype="int32").eval(4), [0, 0, 1])
    with pytest.raises(KeyError, match="outside"):
        fd.OneHot(3).eval(3)
    with pytest.raises(ValueError):
        fd.OneHot(2, 2)


def test_one_hot_from_list():
    block = fd.OneHotFromList(["a", "b", "c"])
    np.testing.assert_array_equal(block.eval("c"), [0, 0, 1])
    np.testing.assert_array_equal(fd.OneHotFromList(["a", "b"], strict=False).eval("z"), [0, 0])
    with pytest.raises(KeyError):
        block.eval("z")
    with pytest.raises(ValueError, match="duplicate"):
        fd.OneHotFromList(["a", "a"])


def test_optional():
    block = fd.Optional(fd.Vector(2))
    np.testing.assert_array_equal(block.eval([1, 2]), [1, 2])
    np.testing.assert_array_equal(block.eval(None), [0, 0])
    custom = fd.Optional(fd.Scalar(), fd.FromTensor(np.float32(-1)))
    assert float(custom.eval(None)) == -1.0
    assert custom.none_case.input_type == fd.VoidType()
    seq = fd.Optional(fd.Map(fd.Scalar()))
    assert seq.eval(None) == []


def test_zeros():
    t = fd.TupleType(fd.TensorType((2,)), fd.VoidType(), fd.SequenceType(fd.TensorType(())))
    zeros = fd.Zeros(t).eval(None)
    np.testing.assert_array_equal(zeros[0], [0, 0])
    assert zeros[1] is None and zeros[2] == []
    with pytest.raises(TypeError):
        fd.Zeros(fd.PyObjectType())


def test_broadcast_evaluates_to_endless_iterable():
    out = (fd.Scalar() >> fd.Broadcast()).eval(2)
    assert isinstance(out, itertools.repeat)
    assert [float(v) for v in itertools.islice(out, 3)] == [2.0, 2.0, 2.0]


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int8", "uint8", "int64", "bool"])
@pytest.mark.parametrize("x", [0, 3, -1, 300, 2**40, 3.0, 3.5, -0.0, float("nan"), float("inf"), 1e40])
def test_python_scalar_fast_path_agrees_with_the_array_path(x, dtype):
    """Python ints and floats take a shortcut; 0-d arrays take the general path."""
    from fold.blocks.inputs import to_array

    t = fd.TensorType((), dtype)

    def outcome(v):
        try:
            with np.errstate(over="ignore"):
                r = to_array(v, t)
            return ("ok", np.asarray(r).dtype, np.asarray(r).tolist())
        except (TypeError, ValueError) as e:
            return (type(e).__name__,)

    fast, general = outcome(x), outcome(np.asarray(x))
    if fast[0] == "ok" and general[0] == "ok":
        assert fast[1] == general[1]
        assert fast[2] == general[2] or (np.isnan(fast[2]) and np.isnan(general[2]))
    else:
        assert fast[0] == general[0], (fast, general)


def test_out_of_range_integers_are_value_errors_not_wrapped():
    from fold.blocks.inputs import to_array

    for x in (1e40, np.asarray(1e40), np.asarray([1.0, 3e9]), 2**70):
        with pytest.raises(ValueError, match="does not fit in int32"):
            to_array(x, fd.TensorType(np.shape(x), "int32"))
    assert to_array(2**70, fd.TensorType((), "float32")) == np.float32(2.0**70)


@pytest.mark.parametrize("dtype", ["int32", "uint8", "float32", "float64"])
def test_scalar_fast_path_agrees_with_to_array(dtype):
    from fold.blocks.inputs import scalar_converter, to_array

    t = fd.TensorType((), dtype)
    convert = scalar_converter(t)
    for x in [0, 7, -3, 255, 256, 2**31, -(2**31) - 1, 1.0, 2.5, float("nan"), True, np.int64(4), "3", None]:
        try:
            want = to_array(x, t)
        except (TypeError, ValueError) as e:
            with pytest.raises(type(e)):
                convert(x)
            continue
        got = np.asarray(convert(x), t.dtype)  # what the constant table becomes
        np.testing.assert_array_equal(got, want)
        assert got.dtype == want.dtype
    assert scalar_converter(fd.TensorType((2,), dtype)) is None


@pytest.mark.parametrize("make, who, asked, held", [
    (lambda: fd.Vector(2, "float64"), "Tensor", "float64", "float32"),
    (lambda: fd.Scalar("int64"), "Tensor", "int64", "int32"),
    (lambda: fd.OneHot(3, dtype="float64"), "OneHot", "float64", "float32"),
    (lambda: fd.OneHotFromList("ab", dtype="uint64"), "OneHotFromList", "uint64", "uint32"),
    (lambda: fd.Length("float64"), "Length", "float64", "float32"),
    (lambda: fd.Embedding(3, 2, dtype="float64"), "Embedding", "float64", "float32"),
])
def test_a_64_bit_dtype_jax_truncates_warns_at_the_callers_line(make, who, asked, held):
    """``Vector(2, "float64")`` held float32 without a word while x64 is off, where
    ``jnp.asarray(x, jnp.float64)`` warns: the values lost precision and range silently."""
    if jax.config.jax_enable_x64:
        pytest.skip("x64 is on: nothing is truncated")
    with pytest.warns(UserWarning, match=fr"{who}\(dtype='{asked}'\) holds {held}: JAX truncates") as caught:
        make()
    assert caught[0].filename == __file__  # points at the model's line, not inside fold
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fd.Vector(2), fd.Scalar("int32"), fd.OneHot(3), fd.Length(), fd.Embedding(3, 2), fd.FromTensor(np.ones(2))


@pytest.mark.parametrize("value", [bytearray(b"12"), memoryview(b"12"), np.datetime64("2026-11-27"),
                                   np.timedelta64(3, "D"), np.array(["2026-11-27"], "datetime64[D]")])
def test_bytes_like_values_and_dates_are_no_numbers(value):
    """``bytearray(b"12")`` was read as ``[49, 50]`` (bytes were refused) and a ``datetime64``
    became a float."""
    block = fd.Vector(2) if isinstance(value, (bytearray, memoryview)) else fd.Scalar()
    with pytest.raises(ValueError, match="expected"):
        block.eval(value)


def test_an_int_past_floats_range_overflows_as_a_large_float_does():
    """``10**400`` raised Python's OverflowError where ``1e39`` gets the documented ValueError."""
    compiler = fd.Compiler.create(fd.Scalar())
    with pytest.raises(ValueError, match=r"value 1e\+39 overflows float32"):
        compiler.build_batch([1e39])
    with pytest.raises(ValueError, match=r"value an int of 401 digits overflows float32 \(largest 3.40282e\+38\)"):
        compiler.build_batch([10**400])
    with pytest.raises(ValueError, match=r"value an int of 40 digits overflows float32"):
        compiler.build_batch([-(10**39)])
    assert float(compiler.apply({}, compiler.build_batch([10**38])).outputs[0]) == pytest.approx(1e38, rel=1e-6)
