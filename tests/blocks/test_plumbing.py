"""Pipe, Record, AllOf, GetItem, Slice and block-like conversion."""

from __future__ import annotations

from collections import OrderedDict

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fold as fd


def test_pipe_and_rshift():
    block = fd.Pipe(fd.Scalar(), fd.Function(lambda x: x + 1), fd.Function(lambda x: 2 * x))
    assert float(block.eval(3)) == 8.0
    assert float((fd.Scalar() >> fd.Function(jnp.negative)).eval(3)) == -3.0


def test_record_dict_keys_are_sorted():
    block = fd.Record({"b": fd.Scalar(), "a": fd.Vector(2)})
    assert block.output_type == fd.TupleType(fd.TensorType((2,)), fd.TensorType(()))
    a, b = block.eval({"a": [1, 2], "b": 3})
    np.testing.assert_array_equal(a, [1, 2])
    assert float(b) == 3.0


def test_record_ordered_dict_keeps_order():
    block = fd.Record(OrderedDict([("b", fd.Scalar()), ("a", fd.Vector(2))]))
    assert block.output_type[0] == fd.TensorType(())


def test_record_sequences_positional_and_keyed():
    keyed = fd.Record([(1, fd.Scalar()), (0, fd.Vector(1))])
    out = keyed.eval(([5], 7))
    assert float(out[0]) == 7.0 and out[1].tolist() == [5.0]
    positional = fd.Record((fd.Scalar(), fd.Scalar()))
    assert [float(v) for v in positional.eval([1, 2])] == [1.0, 2.0]
    nested = fd.convert_to_block([(fd.Scalar(), fd.Scalar()), fd.Scalar()])
    assert nested.output_type == fd.TupleType(fd.TupleType(fd.TensorType(()), fd.TensorType(())),
                                              fd.TensorType(()))


def test_record_with_slice_keys_on_tuples():
    inner = fd.Record([(slice(0, 2), fd.Identity()), (2, fd.Identity())])
    block = (fd.Scalar(), fd.Scalar(), fd.Scalar()) >> inner
    assert block.output_type == fd.TupleType(fd.TupleType(fd.TensorType(()), fd.TensorType(())),
                                             fd.TensorType(()))
    (x, y), z = block.eval((1, 2, 3))
    assert (float(x), float(y), float(z)) == (1.0, 2.0, 3.0)


def test_plain_dict_record_on_tuple_type_is_type_error():
    with pytest.raises(TypeError, match="Record"):
        (fd.Scalar(), fd.Scalar()) >> fd.Record({"a": fd.Identity()})
    with pytest.raises(TypeError, match="example 0"):
        fd.Compiler.create(fd.Record({"a": fd.Scalar()})).build_batch([(1.0,)])


def test_all_of():
    block = fd.Scalar() >> fd.AllOf(fd.Function(jnp.negative), fd.Identity())
    a, b = block.eval(2)
    assert (float(a), float(b)) == (-2.0, 2.0)
    assert fd.AllOf().output_type == fd.VoidType()
    assert fd.AllOf().eval(1) is None


def test_get_item_on_pyobject_tuple_and_sequence():
    assert fd.GetItem("a").eval({"a": 5}) == 5
    assert float(((fd.Scalar(), fd.Vector(2)) >> fd.GetItem(0)).eval((4, [1, 2]))) == 4.0
    assert float((fd.Map(fd.Scalar()) >> fd.GetItem(-1)).eval([1, 2, 3])) == 3.0
    with pytest.raises(KeyError):
        fd.GetItem("zz").eval({"a": 1})
    with pytest.raises(TypeError):
        (fd.Scalar(), fd.Scalar()) >> fd.GetItem(5)


def test_slice():
    block = fd.Map(fd.Scalar()) >> fd.Slice(step=-1)
    assert [float(v) for v in block.eval(range(4))] == [3.0, 2.0, 1.0, 0.0]
    tup = (fd.Scalar(), fd.Vector(1), fd.Scalar()) >> fd.Slice(start=1)
    assert tup.output_type == fd.TupleType(fd.TensorType((1,)), fd.TensorType(()))
    with pytest.raises(TypeError):
        fd.Slice(1)


def test_slice_bounds_are_checked_with_the_model_not_the_first_example():
    """A zero step or a non-int bound of a sequence slice failed only when the first example was
    sliced, as an error in the data; a PyObject may still be sliced by other keys."""
    with pytest.raises(ValueError, match="step cannot be zero"):
        fd.Slice(step=0)
    with pytest.raises(TypeError, match="must be ints or None, got 'a'"):
        fd.Map(fd.Scalar()) >> fd.Slice(start="a")
    with pytest.raises(TypeError, match="must be ints or None"):
        (fd.Scalar(), fd.Scalar()) >> fd.Slice(stop=1.5)

    class Labelled:
        def __getitem__(self, key):
            return float(ord(key.start) - ord("a"))

    assert float((fd.Slice(start="c") >> fd.Scalar()).eval(Labelled())) == 2.0
    assert [float(v) for v in (fd.Map(fd.Scalar()) >> fd.Slice(start=np.int64(1))).eval([1, 2])] == [2.0]


def test_reading_a_field_of_an_object_hints_at_converting_it():
    """A namedtuple or dataclass given to a Record failed with Python's "tuple indices must be
    integers" or "not subscriptable" and no word on what to do."""
    from collections import namedtuple

    point = namedtuple("Point", "x y")
    compiler = fd.Compiler.create(fd.Record({"x": fd.Scalar(), "y": fd.Scalar()}))
    with pytest.raises(TypeError, match=r"it has an attribute 'x', but blocks read items \(x\[key\]\): convert it "
                                        r"first with fd.InputTransform\(lambda e: e._asdict\(\)\)"):
        compiler.build_batch([point(1.0, 2.0)])
    record = fd.Record({"x": fd.Scalar(), "y": fd.Scalar()})
    fixed = fd.Compiler.create(fd.InputTransform(lambda e: e._asdict()) >> record)
    assert [float(v[0]) for v in fixed.apply({}, fixed.build_batch([point(1.0, 2.0)])).outputs] == [1.0, 2.0]


def test_block_used_twice_is_rejected():
    s = fd.Scalar()
    fd.Map(s)
    with pytest.raises(ValueError, match="already used"):
        fd.Map(s)


def test_type_mismatch_names_both_blocks_and_types():
    with pytest.raises(TypeError) as info:
        fd.Vector(3) >> fd.Map(fd.Scalar())
    msg = str(info.value)
    assert "Vector" in msg and "Map" in msg and "TensorType((3,), 'float32')" in msg
    with pytest.raises(TypeError) as info:
        (fd.Vector(3), fd.Vector(4, "int32")) >> fd.Concat()
    msg = str(info.value)
    assert "Record" in msg and "Concat" in msg and "int32" in msg


def test_set_types_return_block_and_conflict():
    block = fd.Identity()
    assert block.set_input_type(fd.TensorType(())) is block
    assert block.output_type == fd.TensorType(())
    with pytest.raises(TypeError):
        block.set_output_type(fd.TensorType((2,)))


def test_convert_to_block():
    assert isinstance(fd.convert_to_block({"a": fd.Scalar()}), fd.Record)
    assert isinstance(fd.convert_to_block(np.zeros(2)), fd.FromTensor)
    assert isinstance(fd.convert_to_block(jnp.zeros(2)), fd.FromTensor)
    assert isinstance(fd.convert_to_block(fd.FC(2)), fd.Function)
    with pytest.raises(TypeError):
        fd.convert_to_block(3)


def test_types_flow_backwards_through_pipes_and_tuples():
    pipe = fd.Identity() >> fd.Identity()
    pipe.set_output_type(fd.TensorType((2,)))
    assert pipe.input_type == fd.TensorType((2,))
    assert pipe.children()[0].output_type == fd.TensorType((2,))
    mapped = fd.Map(fd.Identity())
    mapped.set_output_type(fd.SequenceType(fd.TensorType(())))
    assert mapped.element_block.output_type == fd.TensorType(())
    fold = fd.Fold(fd.Function(jnp.add), fd.Zeros(fd.TensorType(())))
    assert fold.output_type == fd.TensorType(())
    fold.set_input_type(fd.SequenceType(fd.TensorType(())))
    assert fold.combine_block.input_type == fd.TupleType(fd.TensorType(()), fd.TensorType(()))


def test_a_pipe_of_leaves_is_a_leaf_and_errors_name_the_failing_child():
    chain = fd.InputTransform(lambda x: x["a"]) >> fd.Scalar() >> fd.Function(lambda x: 2 * x)
    assert chain._leaf  # nested pipes of leaves fold into one leaf: no generator per call
    assert not (fd.Map(fd.Scalar()) >> fd.Sum())._leaf
    compiler = fd.Compiler.create(chain)
    batch = compiler.build_batch([{"a": 1.0}, {"a": 3}])
    np.testing.assert_allclose(compiler.apply(compiler.init(jax.random.key(0)), batch).outputs, [2.0, 6.0])
    # The walk runs the root pipe as a leaf; the error still names the child, not the pipe.
    with pytest.raises(KeyError, match=r"example 1: at InputTransform"):
        compiler.build_batch([{"a": 1.0}, {"b": 2.0}])
    with pytest.raises(ValueError, match=r"example 0: at Scalar: expected a number"):
        compiler.build_batch([{"a": "x"}])


def test_an_empty_pipe_is_the_identity():
    """As in Fold: ``Pipe()`` passes its input through."""
    assert fd.Pipe().eval("anything") == "anything"
    compiler = fd.Compiler.create(fd.Vector(2) >> fd.Pipe())
    assert compiler.apply({}, compiler.build_batch([[1.0, 2.0]])).outputs.tolist() == [[1.0, 2.0]]


def test_print_shows_the_block_tree_with_types():
    node = fd.ForwardDeclaration(fd.PyObjectType(), fd.TensorType((2,)))
    node.resolve_to(fd.OneOf(lambda t: isinstance(t, list), {False: fd.Vector(2),
                                                             True: fd.Map(node()) >> fd.Mean()}))
    text = str(node() >> fd.FC(1, name="out"))
    lines = text.splitlines()
    assert lines[0] == "Pipe: PyObjectType() -> TensorType((1,), 'float32')"
    assert "    Mean: SequenceType(TensorType((2,), 'float32')) -> TensorType((2,), 'float32')" in text
    assert lines[-1] == "  Function(FC): TensorType((2,), 'float32') -> TensorType((1,), 'float32')"
    assert text.count("(shown above)") == 1  # the recursion is shown once
    assert str(fd.Map(fd.Function(jnp.sin))).startswith("Map: ? -> ?")


def test_a_key_in_another_unicode_form_is_named_in_the_error():
    """NFC and NFD forms of one key print identically: the KeyError read "no key 'é' in {'é': 1.0}"."""
    import unicodedata

    composed, decomposed = unicodedata.normalize("NFC", "café"), unicodedata.normalize("NFD", "café")
    for block in (fd.GetItem(composed) >> fd.Scalar(), fd.Record({composed: fd.Scalar()})):
        with pytest.raises(KeyError, match="which prints the same but is another Unicode form"):
            fd.Compiler.create(block).build_batch([{decomposed: 1.0}])
    with pytest.raises(KeyError) as e:
        fd.Compiler.create(fd.GetItem("tea") >> fd.Scalar()).build_batch([{"café": 1.0}])
    assert "Unicode" not in str(e.value)
