"""Types: equality, hashing, repr, shorthand conversion, canonicalisation."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fold as fd
from tests.models import enable_x64


def test_equality_and_hashing():
    assert fd.TensorType((3,)) == fd.TensorType([3], "float32")
    assert fd.TensorType((3,)) != fd.TensorType((3,), "int32")
    assert len({fd.TensorType(()), fd.TensorType(()), fd.TupleType(fd.TensorType(()))}) == 2
    assert fd.SequenceType(fd.TensorType(())) != fd.BroadcastSequenceType(fd.TensorType(()))
    assert fd.VoidType() == fd.VoidType() and fd.PyObjectType() != fd.VoidType()


def test_repr_is_readable_and_round_trips():
    t = fd.TupleType(fd.TensorType((2, 3), "int32"), fd.SequenceType(fd.TensorType(())))
    assert repr(t) == "TupleType(TensorType((2, 3), 'int32'), SequenceType(TensorType((), 'float32')))"
    assert eval(repr(t), {k: getattr(fd, k) for k in dir(fd)}) == t


def test_tensor_type_properties():
    t = fd.TensorType([2, 3], np.int16)
    assert t.shape == (2, 3) and t.dtype == "int16" and t.ndim == 2
    assert np.array(t).shape == (2, 3)
    with pytest.raises(TypeError):
        fd.TensorType(3)
    with pytest.raises(TypeError):
        fd.TensorType((-1,))
    with pytest.raises(TypeError):
        fd.TensorType((2,), "not-a-dtype")


def test_64_bit_dtypes_follow_jax():
    assert fd.TensorType((), "float64").dtype == "float32"
    assert fd.TensorType((), "int64").dtype == "int32"
    with enable_x64():
        assert fd.TensorType((), "float64").dtype == "float64"


def test_tuple_type_protocol():
    t = fd.TupleType(fd.TensorType(()), fd.TensorType((2,)), fd.VoidType())
    assert len(t) == 3
    assert t[1] == fd.TensorType((2,))
    assert t[1:] == fd.TupleType(fd.TensorType((2,)), fd.VoidType())
    assert list(t)[2] == fd.VoidType()


@pytest.mark.parametrize("shorthand, expected", [
    ([], fd.TensorType(())),
    ((), fd.TensorType(())),
    ((3,), fd.TensorType((3,))),
    ([2, 4], fd.TensorType((2, 4))),
    ("int32", fd.TensorType((), "int32")),
    (np.dtype("float32"), fd.TensorType(())),
    (((3,), "int32"), fd.TupleType(fd.TensorType((3,)), fd.TensorType((), "int32"))),
    (fd.VoidType(), fd.VoidType()),
])
def test_convert_to_type(shorthand, expected):
    assert fd.convert_to_type(shorthand) == expected


def test_pyobject_containers_are_canonicalised():
    assert fd.convert_to_type(fd.SequenceType(fd.PyObjectType())) == fd.PyObjectType()
    assert fd.convert_to_type(fd.TupleType(fd.PyObjectType(), fd.PyObjectType())) == fd.PyObjectType()
    assert fd.convert_to_type(fd.TupleType()) == fd.TupleType()
    assert fd.SequenceType(fd.SequenceType(fd.PyObjectType())).element_type == fd.PyObjectType()


def test_convert_rejects_nonsense():
    with pytest.raises(TypeError):
        fd.convert_to_type(3.5)


@pytest.mark.parametrize("dtype", ["str", "float128", "object", "datetime64"])
def test_dtypes_jax_arrays_cannot_hold_are_rejected_at_construction(dtype):
    with pytest.raises(TypeError, match="is not a dtype JAX arrays hold"):
        fd.Scalar(dtype)
    with pytest.raises(TypeError, match="is not a dtype JAX arrays hold"):
        fd.TensorType((2,), dtype)


def test_a_oneof_type_conflict_names_the_case_key():
    with pytest.raises(TypeError, match=r"^OneOf, in the case for key 2: type mismatch: Vector"):
        fd.OneOf(len, {1: fd.Scalar(), 2: fd.Vector(2)})
    inner = fd.OneOf(len, [fd.Scalar(), fd.Scalar()])
    with pytest.raises(TypeError, match=r"OneOf, in the case for key 'b': .*Vector"):
        fd.OneOf(lambda x: x[0], {"a": inner, "b": fd.Vector(3)})


def test_a_fold_whose_combine_returns_another_shape_than_its_state_fails_at_construction():
    with pytest.raises(TypeError, match=r"Function\(FC\) returns TensorType\(\(3,\), 'float32'\) for input "
                                        r"TensorType\(\(6,\), 'float32'\), but its place in the model needs "
                                        r"TensorType\(\(4,\), 'float32'\)"):
        fd.Map(fd.Vector(2)) >> fd.Fold(fd.Concat() >> fd.FC(3), fd.Zeros(fd.TensorType((4,))))


def test_a_fold_whose_combine_cannot_take_the_pair_fails_at_construction():
    # It compiled (the error was taken for a layer whose init draws on the host) and failed in apply
    # with JAX's "tanh() takes 1 positional argument but 2 were given".
    for combine in (fd.Function(jnp.tanh), fd.Function(lambda h: h)):
        with pytest.raises(TypeError, match=r"Fold gives \(accumulator, element\) of type TupleType\(TensorType\(\(\), "
                                            r"'float32'\), TensorType\(\(\), 'float32'\)\) but Function\(.*\) has "
                                            r"\(unknown\) \(Function\(.*\) cannot be applied to input type .*"
                                            r"takes 1 positional argument but 2 were given"):
            fd.Map(fd.Scalar()) >> fd.Fold(combine, fd.Zeros(fd.TensorType(())))


def test_a_layer_whose_init_cannot_be_traced_keeps_the_output_type_its_place_gives_it():
    class HostSeeded(fd.Layer):
        def init(self, key, input_type):
            import numpy
            return {"w": numpy.random.default_rng(int(jax.random.randint(key, (), 0, 9))).normal(size=(4, 2))}

        def apply(self, params, x):
            return x @ params["w"]

    fold = fd.Map(fd.Vector(2)) >> fd.Fold(fd.Concat() >> HostSeeded(), fd.Zeros(fd.TensorType((2,))))
    assert fold.output_type == fd.TensorType((2,))
    # Where nothing fixes its type, the error says why and what to do.
    with pytest.raises(TypeError, match=r"its layer's init reads a traced value on the host "
                                        r"\(ConcretizationTypeError\).*draw with jax.random from init's key"):
        fd.Vector(4) >> HostSeeded()


def test_deep_models_compile_without_recursion_errors():
    """A chain of 1,000 ``>>`` (either way round) and 100 nested ``GetItem``s or ``Record``s raised
    RecursionError: type propagation and pipe fusion recursed once per level."""
    left = fd.Scalar()
    for _ in range(1000):
        left = left >> fd.Function(lambda x: x + 1.0)
    right = fd.Function(lambda x: x + 1.0)
    for _ in range(999):
        right = fd.Function(lambda x: x + 1.0) >> right
    gets, records, nested, keyed = fd.Scalar(), fd.Scalar(), 3.0, 3.0
    for _ in range(100):
        gets, records, nested, keyed = fd.GetItem(0) >> gets, fd.Record({"a": records}), [nested], {"a": keyed}
    for block, example, want in [(left, 1.0, 1001.0), (fd.Scalar() >> right, 1.0, 1001.0), (gets, nested, 3.0),
                                 (records, keyed, 3.0)]:
        compiler = fd.Compiler.create(block)
        out = compiler.apply(compiler.init(jax.random.key(0)), compiler.build_batch([example])).outputs
        assert float(np.asarray(jax.tree.leaves(out)[0]).reshape(-1)[0]) == want
