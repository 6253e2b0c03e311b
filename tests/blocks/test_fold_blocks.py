"""TensorFlow Fold's blocks_test.py, case by case, in this library's terms (written anew).

``assert_builds`` is Fold's ``assertBuilds``: the block evaluated on one example gives ``desired``,
its schedule has ``max_depth`` levels, and, where the block compiles, a batch of the example twice
gives ``desired`` for both. TensorFlow names become JAX ones (``tf.add`` -> ``jnp.add``) and
``tdl`` layers this library's. Error messages are this library's own; each test checks the error
type Fold raised and the fact the message must state.

Skipped, with the reason: ``test_from_tensor`` (a feed_dict placeholder: arrays are given when
the block is built), ``test_from_tensor_variable`` (TensorFlow variables: parameters live in the
params pytree), the placeholder cases of ``test_from_tensor_raises`` (JAX arrays always have a
shape), ``test_function_otype_inference_raises`` (its cases are TensorFlow shape states: unknown
rank, a missing batch dimension), and ``test_repr`` (reprs are this library's own,
``tests/blocks/test_repr.py``). ``test_composition_backward_type_inference`` and
``test_composition_forward_type_inference`` call Fold's private ``_pipe``; they are re-expressed
with ``Pipe``.
"""

from __future__ import annotations

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fold as fd


def _plain(x):
    """Host values as Python lists, floats and tuples (Fold's ``tolist=True``)."""
    if isinstance(x, np.ndarray | np.generic | jax.Array):
        return np.asarray(x).tolist()
    if isinstance(x, tuple):
        return tuple(_plain(v) for v in x)
    if isinstance(x, list):
        return [_plain(v) for v in x]
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    return x


def assert_builds(desired, block: fd.Block, inp, max_depth: int | None = 1) -> None:
    if max_depth is not None:
        assert block.max_depth(inp) == max_depth
    actual = block.eval(inp)
    if isinstance(desired, itertools.repeat):
        assert isinstance(actual, itertools.repeat)
        actual, desired = next(actual), next(desired)
    assert _plain(actual) == desired
    try:
        compiler = fd.Compiler.create(block)
    except TypeError:
        return  # a root that outputs sequences or PyObjects does not compile, as in Fold
    result = compiler.apply(compiler.init(jax.random.key(0)), compiler.build_batch([inp, inp]))
    if result.metrics:
        desired, metrics = desired
        for name, values in metrics.items():
            assert _plain(result.metrics[name].values) == values + values
    leaves = jax.tree.leaves(result.outputs)
    for out, want in zip(leaves, jax.tree.leaves(_as_tree(desired, block.output_type))):
        assert _plain(out[0]) == _plain(out[1]) == _plain(want)


def _as_tree(value, t: fd.Type):
    """``value`` of type ``t`` with its tensors as leaves (void gives none), as outputs are flattened."""
    if isinstance(t, fd.TupleType):
        return tuple(_as_tree(v, s) for v, s in zip(value, t))
    if isinstance(t, fd.VoidType):
        return ()
    return np.asarray(value)


def assert_builds_const(desired, block: fd.Block, inp) -> None:
    assert_builds(desired, block, inp, max_depth=None)


def times_scalar_block(n: float) -> fd.Function:
    return fd.Function(functools.partial(jnp.multiply, n))


def scalar_all_of(*fns) -> fd.Block:
    return fd.Scalar() >> fd.AllOf(*[fd.Function(f) for f in fns])


def test_scalar():
    assert_builds_const(42.0, fd.Scalar(), 42)


def test_vector():
    assert_builds_const([1.0, 2.0, 3.0], fd.Vector(3), [1, 2, 3])


def test_from_tensor_const():
    assert_builds_const([1, 2, 3], fd.FromTensor(jnp.array([1, 2, 3], "int32")), None)


def test_from_tensor_const_ndarray():
    assert_builds_const([[0, 0], [0, 0]], fd.FromTensor(np.zeros([2, 2], "int32")), None)


def test_from_tensor_raises():
    with pytest.raises(TypeError, match="42"):
        fd.FromTensor(42)


def test_pyobject_composition():
    assert_builds_const(("foo", "foo"), fd.AllOf(fd.Identity(), fd.Identity()), "foo")
    block = fd.AllOf(fd.Identity(), fd.Identity()) >> (fd.Scalar(), fd.Scalar())
    assert_builds((42.0, 42.0), block, 42, max_depth=None)


def test_function_composition():
    assert_builds(42.0, fd.Scalar() >> times_scalar_block(2.0), 21)


def test_function_composition_with_block():
    c = fd.Composition()
    with c.scope():
        scalar = fd.Scalar().reads(c.input)
        c.output.reads(times_scalar_block(2.0).reads(scalar))
    assert_builds(42.0, c, 21)


def test_function_tuple_in_out():
    # f(a, (b, c)) := ((c, a), b)
    b = ((fd.Vector(1), (fd.Vector(2), fd.Vector(3))) >> fd.Function(lambda x, y: ((y[1], x), y[0])))
    assert_builds((([4.0, 5.0, 6.0], [1.0]), [2.0, 3.0]), b, ([1], ([2, 3], [4, 5, 6])))


def test_function_raises():
    with pytest.raises(TypeError, match="Function needs a callable or a fd.Layer, got 42"):
        fd.Function(42)


def test_composition_diamond():
    sc, fn1, fn2, fn3 = fd.Scalar(), times_scalar_block(2.0), times_scalar_block(3.0), fd.Function(jnp.add)
    c = fd.Composition([sc, fn1, fn2, fn3])
    c.connect(c.input, sc)
    c.connect(sc, fn1)
    c.connect(sc, fn2)
    c.connect((fn1, fn2), fn3)
    c.connect(fn3, c.output)
    assert_builds(25.0, c, 5, max_depth=2)


def test_composition_diamond_with_block():
    c = fd.Composition()
    with c.scope():
        scalar = fd.Scalar().reads(c.input)
        fn1 = times_scalar_block(2.0).reads(scalar)
        fn2 = times_scalar_block(3.0).reads(scalar)
        c.output.reads(fd.Function(jnp.add).reads(fn1, fn2))
    assert_builds(25.0, c, 5, max_depth=2)


def test_composition_nested():
    fn1, fn2 = times_scalar_block(2.0), times_scalar_block(3.0)
    c = fd.Composition([fn1, fn2])
    c.connect(c.input, fn1)
    c.connect(c.input, fn2)
    c.connect((fn1, fn2), c.output)
    assert_builds(5.0, fd.Scalar() >> c >> fd.Function(jnp.add), 1.0, max_depth=2)


def test_composition_toposort():
    fn0, fn1, fn2, fn3 = fd.Scalar(), times_scalar_block(2.0), times_scalar_block(3.0), times_scalar_block(1.0)
    fn4 = fd.Function(jnp.add)
    c = fd.Composition([fn4, fn3, fn0, fn2, fn1])
    c.connect(c.input, fn0)
    c.connect(fn0, fn1)
    c.connect(fn0, fn2)
    c.connect(fn2, fn3)
    c.connect((fn1, fn3), fn4)
    c.connect(fn4, c.output)
    assert_builds(5.0, c, 1.0, max_depth=3)


def test_composition_toposort_output():
    block = fd.Composition()
    with block.scope():
        s = fd.Scalar("int32").reads(block.input)
        block.output.reads(s, s)
    assert_builds_const((3, 3), block, 3)


def test_composition_connect_raises():
    with pytest.raises(TypeError):
        fd.Pipe(fd.Scalar(), fd.Concat())


def test_composition_raises_cycle():
    fn1, fn2 = times_scalar_block(2.0), times_scalar_block(3.0)
    c = fd.Composition([fn2, fn1]).set_input_type(fd.VoidType())
    c.connect(fn1, fn2)
    c.connect(fn2, c.output)
    c.connect(fn2, fn1)  # cycle
    with pytest.raises(ValueError, match="cycle"):
        fd.Compiler.create(c)


def test_composition_void():
    c = fd.Composition()
    with c.scope():
        a = fd.Scalar().reads(c.input)
        b = fd.Function(jnp.negative).reads(a)
        fd.Metric("foo").reads(b)
        c.output.reads(a)
    assert_builds((42.0, {"foo": [-42.0]}), c, 42, max_depth=2)


def test_composition_raises_no_output():
    with pytest.raises(TypeError, match="output"):
        fd.Compiler.create(fd.Composition())


def test_composition_no_output_void_type():
    assert_builds_const(42.0, fd.AllOf(fd.Void(), fd.Scalar()) >> fd.GetItem(1), 42)


def test_composition_raises_read_output():
    a = fd.Scalar()
    c = fd.Composition([a])
    with pytest.raises(ValueError, match="output"):
        c.connect(c.output, a)


def test_composition_raises_write_input():
    a = fd.Scalar()
    c = fd.Composition([a])
    with pytest.raises(ValueError, match="input"):
        c.connect(a, c.input)


def test_composition_raises_foreign_io():
    a = fd.Scalar()
    c, c2 = fd.Composition([a]), fd.Composition()
    with pytest.raises(ValueError, match="Composition.input already belongs to Composition"):
        c.connect(c2.input, a)


def test_composition_raises_unused():
    fn0, fn1 = fd.Scalar(), times_scalar_block(2.0)
    c = fd.Composition([fn1, fn0])
    c.connect(c.input, fn0)
    c.connect(fn0, fn1)
    c.connect(fn0, c.output)
    with pytest.raises(TypeError, match="unused|not read|never read"):
        fd.Compiler.create(c)


def test_composition_raises_double_connect():
    a = fd.Scalar()
    c = fd.Composition([a])
    c.connect(c.input, a)
    with pytest.raises(ValueError, match="Scalar already reads from .*; a block's input can be wired once"):
        c.connect(c.input, a)


def test_composition_raises_double_connect_output():
    a, b = fd.Scalar(), fd.Scalar()
    c = fd.Composition([a, b])
    c.connect(a, c.output)
    with pytest.raises(ValueError, match="Composition.output already reads from"):
        c.connect(b, c.output)


def test_composition_nested_with_block():
    c1 = fd.Composition()
    with c1.scope():
        scalar = fd.Scalar().reads(c1.input)
        c2 = fd.Composition().reads(scalar)
        with c2.scope():
            fn1 = times_scalar_block(2.0).reads(c2.input)
            fn2 = times_scalar_block(3.0).reads(c2.input)
            c2.output.reads(fn1, fn2)
        c1.output.reads(fd.Function(jnp.add).reads(c2))
    assert_builds(5.0, c1, 1.0, max_depth=2)


def test_composition_slice():
    c1 = fd.Composition().set_input_type(fd.VoidType())
    with c1.scope():
        t = fd.AllOf(*[np.array(t) for t in range(5)]).reads(c1.input)
        c1.output.reads(fd.Function(jnp.add).reads(t[1:-1:2]))
    assert_builds(4, c1, None, max_depth=1)


def test_composition_backward_type_inference():
    b = fd.Pipe(fd.Map(fd.Identity()), fd.Identity(), fd.Identity())
    with pytest.raises(TypeError, match="Map outputs a sequence, not VoidType"):
        b.set_output_type(fd.VoidType())


def test_composition_forward_type_inference():
    b = fd.Pipe(fd.Identity(), fd.Identity(), fd.Map(fd.Function(jnp.negative)))
    with pytest.raises(TypeError, match="PyObjectType"):
        b.set_input_type(fd.PyObjectType())


def test_map_pyobject_type_inference():
    assert_builds_const([1.0, 2.0], fd.Map(fd.Identity()) >> fd.Vector(2), [1, 2])


def _output_type(fn, *input_types: fd.TensorType) -> fd.Type:
    """The output type ``Function(fn)`` infers from its input type (Fold's
    ``_infer_tf_output_type_from_input_type``)."""
    block = fd.Function(fn)
    block.set_input_type(input_types[0] if len(input_types) == 1 else fd.TupleType(*input_types))
    return block.output_type


def test_function_otype_inference_tensor_to_tensor():
    assert _output_type(jnp.negative, fd.TensorType(())) == fd.TensorType(())
    assert _output_type(jnp.negative, fd.TensorType((2, 3))) == fd.TensorType((2, 3))
    assert _output_type(jnp.negative, fd.TensorType((), "int32")) == fd.TensorType((), "int32")
    assert _output_type(jnp.negative, fd.TensorType((2, 3), "int32")) == fd.TensorType((2, 3), "int32")

    def f(x):
        return x.astype("int32")

    assert _output_type(f, fd.TensorType(())) == fd.TensorType((), "int32")
    assert _output_type(f, fd.TensorType((2, 3), "float32")) == fd.TensorType((2, 3), "int32")


def test_function_otype_inference_tuple_to_tensor():
    assert _output_type(jnp.matmul, fd.TensorType((1, 1)), fd.TensorType((1, 1))) == fd.TensorType((1, 1))
    assert _output_type(jnp.matmul, fd.TensorType((3, 2)), fd.TensorType((2, 5))) == fd.TensorType((3, 5))


def test_function_otype_inference_tuple_to_tuple():
    def f(x, y):
        return jnp.matmul(x, y), jnp.zeros((x.shape[0], 42), "int32")

    want = fd.TupleType(fd.TensorType((3, 5)), fd.TensorType((42,), "int32"))
    assert _output_type(f, fd.TensorType((3, 2)), fd.TensorType((2, 5))) == want


def test_record():
    c = fd.Record([("b", fd.Scalar()), ("a", fd.Scalar())]) >> fd.Function(jnp.subtract)
    assert_builds(4.0, c, {"a": 1.0, "b": 5.0})


def test_record_one_child():
    assert_builds_const((42,), fd.Record({0: fd.Scalar("int32")}), {0: 42})


def test_record_composition():
    d = fd.Record({"a": fd.Scalar(), "b": fd.Scalar()})
    fn1, fn2, fn3 = times_scalar_block(2.0), times_scalar_block(3.0), fd.Function(jnp.add)
    c = fd.Composition([d, fn1, fn2, fn3])
    c.connect(c.input, d)
    c.connect(d["a"], fn1)
    c.connect(d["b"], fn2)
    c.connect((fn1, fn2), fn3)
    c.connect(fn3, c.output)
    assert_builds(17.0, c, {"a": 1.0, "b": 5.0}, max_depth=2)


def test_record_tuple():
    block = (fd.AllOf(fd.Scalar(), fd.OneHot(3, dtype="int32"))
             >> (fd.Function(jnp.square), fd.Function(jnp.negative)))
    assert_builds((4.0, [0, 0, -1]), block, 2)


def test_record_raises():
    # Fold: a RuntimeError about an unordered dict; here the string key cannot index the tuple.
    with pytest.raises(TypeError, match="Record has key 'a', which cannot index a tuple input"):
        fd.Pipe((fd.Scalar(), fd.Scalar()), {"a": fd.Identity(), "b": fd.Identity()})


def test_record_slice_key():
    b = fd.Record([(0, fd.Scalar()), (slice(1, 3), (fd.Scalar(), fd.Scalar()) >> fd.Concat())])
    assert_builds((1.0, [2.0, 3.0]), b, [1, 2, 3])


def test_forward_declarations():
    def nlit(x):
        return {"op": "lit", "val": x}

    def nadd(x, y):
        return {"op": "add", "left": x, "right": y}

    expr_fwd = fd.ForwardDeclaration(fd.PyObjectType(), fd.TensorType((), "float32"))
    lit_case = fd.GetItem("val") >> fd.Scalar()
    add_case = fd.Record({"left": expr_fwd(), "right": expr_fwd()}) >> fd.Function(jnp.add)
    expr = fd.OneOf(lambda x: x["op"], {"lit": lit_case, "add": add_case})
    expr_fwd.resolve_to(expr)
    assert_builds(10.0, expr, nadd(nadd(nlit(3.0), nlit(5.0)), nlit(2.0)), max_depth=2)


def test_forward_declaration_orphaned():
    fwd = fd.ForwardDeclaration(fd.VoidType(), fd.TensorType(()))
    b = fd.AllOf(fwd(), fwd()) >> fd.Sum()
    fwd.resolve_to(fd.FromTensor(jnp.ones(())))
    assert_builds(2.0, b, None)


def test_forward_declaration_orphaned_nested():
    fwd1 = fd.ForwardDeclaration(fd.VoidType(), fd.TensorType(()))
    fwd2 = fd.ForwardDeclaration(fd.SequenceType(fd.TensorType(())), fd.TensorType(()))
    b = fd.Map(fd.Scalar()) >> fwd2() >> fd.Function(jnp.negative)
    fwd2.resolve_to(fd.Fold(fd.Function(jnp.add), fwd1()))
    fwd1.resolve_to(fd.FromTensor(jnp.ones(())))
    assert_builds(-8.0, b, [3, 4], max_depth=3)


def test_map():
    block = fd.Map(fd.Scalar() >> fd.Function(jnp.abs))
    assert_builds([], block, [], max_depth=0)
    assert_builds([1.0], block, [-1])
    assert_builds([1.0, 2.0, 3.0], block, [-1, -2, -3])


def test_map_const():
    block = fd.Map(fd.Scalar())
    assert_builds_const([], block, [])
    assert_builds_const([1.0], block, [1])
    assert_builds_const([1.0, 2.0, 3.0], block, [1, 2, 3])


def test_map_map():
    block = fd.Map(fd.Map(fd.Scalar() >> fd.Function(jnp.abs)))
    assert_builds([[]], block, [[]], max_depth=0)
    assert_builds([[1.0, 2.0, 3.0], [4.0, 5.0], [6.0], []], block, [[-1, -2, -3], [-4, -5], [-6], []])


def test_map_map_const():
    block = fd.Map(fd.Map(fd.Scalar()))
    assert_builds_const([[]], block, [[]])
    assert_builds_const([[1.0, 2.0, 3.0], [4.0, 5.0], [6.0], []], block, [[1, 2, 3], [4, 5], [6], []])


def test_map_tuple():
    assert_builds([-3.0, -4.0], (fd.Scalar(), fd.Scalar()) >> fd.Map(fd.Function(jnp.negative)), (3, 4))


def test_fold():
    ten_plus_sum = fd.Map(fd.Scalar()) >> fd.Fold(fd.Function(jnp.add), np.array(10.0, dtype="float32"))
    assert_builds(16.0, ten_plus_sum, [1.0, 2.0, 3.0], max_depth=3)
    assert_builds(16.0, ten_plus_sum, [3.0, 2.0, 1.0], max_depth=3)
    assert_builds(20.0, ten_plus_sum, [1.0, 2.0, 3.0, 4.0], max_depth=4)
    assert_builds(20.0, ten_plus_sum, [4.0, 3.0, 2.0, 1.0], max_depth=4)


def test_fold_tuple():
    block = (fd.Scalar(), fd.Scalar()) >> fd.Fold(fd.Function(jnp.add), jnp.ones(()))
    assert_builds(6.0, block, (2, 3), max_depth=2)


def test_fold_pyobject():
    block = fd.Fold((fd.Identity(), fd.Scalar()) >> fd.Sum(), fd.Zeros(fd.TensorType(())))
    assert_builds(5.0, block, (2, 3), max_depth=None)


def test_rnn():
    def f(x, st):
        return x * x, st + x[:, None]  # x broadcast over the state, row by row

    block = (fd.Map(fd.Scalar()), fd.Vector(2)) >> fd.RNN(fd.Function(f), initial_state_from_input=True)
    assert_builds(([], [0.0, 0.0]), block, ([], [0.0, 0.0]), max_depth=0)
    assert_builds(([1.0, 4.0, 9.0, 16.0], [10.0, 10.0]), block, ([1.0, 2.0, 3.0, 4.0], [0.0, 0.0]), max_depth=4)


@pytest.mark.parametrize("start", [np.array(10.0, dtype="float32"), None])
def test_reduce(start):
    """Fold's test_reduce (start 10) and test_reduce_default_zero."""
    block = fd.Map(fd.Scalar()) >> (fd.Reduce(fd.Function(jnp.add)) if start is None
                                    else fd.Reduce(fd.Function(jnp.add), start))
    assert_builds(10.0 if start is not None else 0.0, block, [], max_depth=0)
    assert_builds(3.0, block, [1.0, 2.0], max_depth=1)
    assert_builds(20.0, block, [2.0, 4.0, 6.0, 8.0], max_depth=2)
    assert_builds(6.0, block, [1.0, 2.0, 3.0], max_depth=2)
    assert_builds(21.0, block, list(range(7)), max_depth=3)


@pytest.mark.parametrize(("reduction", "want", "depth"), [
    (fd.Sum, [3.0, 12.0], 2), (fd.Min, [0.0, 3.0], 2), (fd.Max, [2.0, 5.0], 2), (fd.Mean, [1.0, 4.0], 3)])
def test_reductions_of_2vectors(reduction, want, depth):
    """Fold's test_sum_2vectors, test_min_2vectors, test_max_2vectors and test_mean_2vector."""
    assert_builds(want, fd.Map(fd.Vector(2)) >> reduction(), [[1.0, 5.0], [2.0, 3.0], [0.0, 4.0]], max_depth=depth)


def test_mean_matrix():
    mean_matrix = fd.Map(fd.Tensor([2, 3])) >> fd.Mean()
    six_range = np.reshape(np.arange(6.0), (2, 3))
    assert_builds([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], mean_matrix, [six_range + 1.0, six_range, six_range + 2.0],
                  max_depth=3)


def test_mean_tuple():
    assert_builds_const(2.0, (fd.Scalar(), fd.Scalar(), fd.Scalar()) >> fd.Mean(), [0, 0, 6])


def test_all_of_0():
    assert_builds(None, scalar_all_of(), -3, max_depth=0)


def test_all_of_1():
    assert_builds((3.0,), scalar_all_of(jnp.negative), -3)


def test_all_of_2():
    assert_builds((-3.0, 3.0), scalar_all_of(lambda x: x, jnp.abs), -3)


def test_all_of_3():
    block = scalar_all_of(lambda x: x, jnp.abs, jnp.negative)
    assert_builds((3.0, 3.0, -3.0), block, 3)
    assert_builds((-3.0, 3.0, 3.0), block, -3)


def test_all_of_different_shapes():
    assert_builds((-3.0, [3.0]), scalar_all_of(jnp.negative, functools.partial(jnp.expand_dims, axis=1)), 3)


def test_seq_of_tuple():
    block = fd.Map(scalar_all_of(lambda x: x, jnp.negative))
    assert_builds([], block, [], max_depth=0)
    assert_builds([(1.0, -1.0), (2.0, -2.0)], block, [1, 2])


def test_tuple_of_seq():
    block = fd.AllOf(fd.Map(fd.Scalar() >> fd.Function(jnp.negative)), fd.Map(fd.Scalar() >> fd.Function(lambda x: x)))
    assert_builds(([], []), block, [], max_depth=0)
    assert_builds(([-1.0, -2.0], [1.0, 2.0]), block, [1, 2])


def test_input_transform():
    block = fd.Map(fd.InputTransform(lambda x: 1 + ord(x) - ord("a")) >> fd.Scalar("int32")
                   >> fd.Function(jnp.negative))
    assert_builds([-1, -2, -3, -4], block, "abcd")


def test_input_transform_const():
    block = fd.Map(fd.InputTransform(lambda x: 1 + ord(x) - ord("a")) >> fd.Scalar("int32"))
    assert_builds_const([1, 2, 3, 4], block, "abcd")


def test_serialized_message_to_tree():
    descriptor_pb2 = pytest.importorskip("google.protobuf.descriptor_pb2")
    # Fold's test messages are its own; a FileDescriptorProto nests messages the same way.
    message = descriptor_pb2.FileDescriptorProto(
        name="x", message_type=[descriptor_pb2.DescriptorProto(name="y")])
    tree = fd.SerializedMessageToTree(descriptor_pb2.FileDescriptorProto).eval(message.SerializeToString())
    assert tree["name"] == "x" and tree["message_type"][0]["name"] == "y"


def test_serialized_message_to_tree_raises():
    pytest.importorskip("google.protobuf")
    with pytest.raises(TypeError, match="42"):
        fd.SerializedMessageToTree(42)


def test_get_item_pyobject():
    assert_builds_const(2.0, fd.GetItem(1) >> fd.Scalar(), [1, 2, 3])


def test_get_item_sequence():
    assert_builds_const(9.0, fd.Map(fd.Scalar()) >> fd.GetItem(-1), list(range(10)))


def test_get_item_tuple():
    assert_builds_const(2.0, (fd.Scalar(), fd.Scalar()) >> fd.GetItem(-1), (1, 2))


def test_length():
    assert_builds(3.0, fd.Map(fd.Scalar("int32")) >> fd.Length(), [1, 2, 3], max_depth=0)
    assert_builds(10.0, fd.Map(fd.Scalar("int32")) >> fd.Length(), list(range(10)), max_depth=0)
    with pytest.warns(UserWarning, match="JAX truncates 64-bit dtypes"):  # Fold's test asks for 64 bits; x64 is off
        block = fd.Map(fd.Scalar(dtype="float64")) >> fd.Length(dtype="int64")
    assert_builds(3, block, [1, 2, 3], max_depth=0)


def test_length_pyobject():
    with pytest.warns(UserWarning, match=r"Length\(dtype='int64'\) holds int32"):
        block = fd.Length(dtype="int64")
    assert_builds(3, block, [0, 1, 2], max_depth=0)
    assert_builds(20, block, list(range(20)), max_depth=0)
    assert_builds(4.0, fd.Length(dtype="float32"), list(range(4)), max_depth=0)


def test_length_tuple():
    assert_builds_const(2, (fd.Scalar(), fd.Scalar()) >> fd.Length(dtype="int32"), (0, 1))


def test_length_empty_tuple():
    assert_builds_const(0, fd.Record([]) >> fd.Length(dtype="int32"), ())


def test_slice_pyobject():
    assert_builds_const("abc", fd.Slice(), "abc")
    assert_builds_const("ab", fd.Slice(stop=2), "abc")
    assert_builds_const("cba", fd.Slice(step=-1), "abc")


def test_slice_sequence():
    assert_builds_const([0.0, 1.0, 2.0], fd.Map(fd.Scalar()) >> fd.Slice(), [0, 1, 2])
    assert_builds_const([0.0, 1.0], fd.Map(fd.Scalar()) >> fd.Slice(stop=2), [0, 1, 2])
    assert_builds_const([2.0, 1.0, 0.0], fd.Map(fd.Scalar()) >> fd.Slice(step=-1), [0, 1, 2])


def test_slice_tuple():
    assert_builds_const((1.0, 2.0), (fd.Scalar(), fd.Scalar()) >> fd.Slice(), (1, 2))
    assert_builds_const((), (fd.Scalar(), fd.Scalar()) >> fd.Slice(stop=0), (1, 2))
    assert_builds_const((1,), (fd.Scalar("int32"), fd.Scalar()) >> fd.Slice(stop=1), (1, 2))
    assert_builds_const((2.0, 1.0), (fd.Scalar(), fd.Scalar()) >> fd.Slice(step=-1), (1, 2))


def test_slice_raises():
    with pytest.raises(TypeError, match="Slice cannot slice BroadcastSequenceType"):
        fd.Pipe(fd.Scalar() >> fd.Broadcast(), fd.Slice(stop=3))


def test_one_of():
    block = fd.OneOf(lambda x: x > 0, {True: fd.Scalar(), False: fd.Scalar() >> fd.Function(jnp.negative)})
    assert_builds_const(3.0, block, 3)
    assert_builds_const(3.0, block, -3)


def test_one_of_pre():
    block = fd.OneOf(lambda x: x["key"], {"a": fd.GetItem("bar") >> fd.Scalar(), "b": fd.GetItem("baz") >> fd.Scalar()},
                     fd.GetItem("val"))
    assert_builds_const(42.0, block, {"key": "a", "val": {"bar": 42, "baz": 0}})
    assert_builds_const(0.0, block, {"key": "b", "val": {"bar": 42, "baz": 0}})


def test_one_of_raises():
    with pytest.raises(TypeError, match="key_fn must be a callable or a block, got 42"):
        fd.OneOf(42, (fd.Scalar(),))
    with pytest.raises(ValueError, match="non-empty|at least one|no case"):
        fd.OneOf(lambda x: x, {})
    with pytest.raises(TypeError, match="TensorType\\(\\(2,\\)"):
        fd.OneOf(lambda x: x, {0: fd.Scalar(), 1: fd.Vector(2)})


def test_one_of_mixed_input_type():
    block = (fd.Identity(), fd.Scalar("int32")) >> fd.OneOf(
        key_fn=fd.GetItem(0), case_blocks=(fd.Function(jnp.square), fd.Function(jnp.negative)),
        pre_block=fd.GetItem(1))
    assert_builds(4, block, (0, 2))
    assert_builds(-2, block, (1, 2))


def test_optional():
    block = fd.Optional(fd.Vector(4))
    assert_builds_const([1.0, 2.0, 3.0, 4.0], block, [1, 2, 3, 4])
    assert_builds_const([0.0, 0.0, 0.0, 0.0], block, None)
    block2 = fd.Optional(fd.Scalar(), np.array(42.0, dtype="float32"))
    assert_builds_const(6.0, block2, 6)
    assert_builds_const(42.0, block2, None)


def test_optional_default_none():
    block = fd.Optional({"a": fd.Map({"b": fd.Scalar(), "c": fd.Scalar()}), "d": fd.Vector(3)})
    assert_builds_const(([(0.0, 1.0)], [2.0, 3.0, 4.0]), block, {"a": [{"b": 0, "c": 1}], "d": [2, 3, 4]})
    assert_builds_const(([], [0.0, 0.0, 0.0]), block, None)


def test_optional_default_none_type_inference():
    child = fd.Scalar() >> fd.Function(jnp.negative)
    block = fd.Optional(child)
    child.set_output_type(fd.TensorType(()))
    assert block.output_type == fd.TensorType(())


def test_concat():
    block = {"a": fd.Vector(1), "b": fd.Vector(4), "c": fd.Vector(1)} >> fd.Concat()
    assert_builds_const([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], block, {"a": [1.0], "b": [2.0, 3.0, 4.0, 5.0], "c": [6.0]})


def test_concat_scalar():
    block = {"a": fd.Scalar(), "b": fd.Vector(4), "c": fd.Scalar()} >> fd.Concat()
    assert_builds_const([1.0, 2.0, 3.0, 4.0, 5.0, 6.0], block, {"a": 1.0, "b": [2.0, 3.0, 4.0, 5.0], "c": 6.0})


def test_concat_dims():
    record = {"a": [[1.0, 2.0, 3.0]], "b": [[4.0, 5.0, 6.0]]}
    block = {"a": fd.Tensor([1, 3]), "b": fd.Tensor([1, 3])} >> fd.Concat(concat_dim=0)
    assert_builds_const([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], block, record)
    block = {"a": fd.Tensor([1, 3]), "b": fd.Tensor([1, 3])} >> fd.Concat(concat_dim=1)
    assert_builds_const([[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]], block, record)


def test_concat_nested():
    block = fd.AllOf(fd.AllOf(fd.Scalar(), fd.Scalar()), fd.AllOf(fd.Scalar(), fd.Scalar())) >> fd.Concat(flatten=True)
    assert_builds_const([42.0] * 4, block, 42.0)


def test_concat_raises():
    with pytest.raises(TypeError, match="concat"):
        fd.Pipe({"a": fd.Scalar(), "b": fd.Vector(4), "c": fd.Tensor([3, 3])}, fd.Concat())
    with pytest.raises(TypeError, match="rank|axis|concat_dim"):
        fd.Pipe({"a": fd.Vector(2), "b": fd.Vector(4)}, fd.Concat(concat_dim=1))
    with pytest.raises(TypeError, match="int32"):
        fd.Pipe({"a": fd.Vector(2, dtype="int32"), "b": fd.Vector(4)}, fd.Concat())
    with pytest.raises(TypeError, match="nested|flatten"):
        fd.Pipe(((fd.Scalar(),), (fd.Scalar(),)), fd.Concat())
    with pytest.raises(TypeError, match="Concat takes a non-empty tuple of tensors"):
        fd.Pipe((), fd.Concat())


def test_broadcast():
    assert_builds_const(itertools.repeat(42.0), fd.Scalar() >> fd.Broadcast(), 42)


def test_broadcast_map():
    assert_builds(itertools.repeat(-42.0), fd.Scalar() >> fd.Broadcast() >> fd.Map(fd.Function(jnp.negative)), 42)


def test_zip():
    block = {"x": fd.Map(fd.Scalar()), "y": fd.Map(fd.Scalar())} >> fd.Zip()
    assert_builds_const([(1.0, 3.0)], block, {"x": [1, 2], "y": [3]})


def test_zip_some_broadcast():
    block = {"x": fd.Map(fd.Scalar()), "y": fd.Scalar() >> fd.Broadcast()} >> fd.Zip()
    assert_builds_const([(1.0, 3.0), (2.0, 3.0)], block, {"x": [1, 2], "y": 3})


def test_zip_all_broadcast():
    block = {"x": fd.Scalar() >> fd.Broadcast(), "y": fd.Scalar() >> fd.Broadcast()} >> fd.Zip()
    assert_builds_const(itertools.repeat((1.0, 2.0)), block, {"x": 1, "y": 2})


def test_broadcast_zip_map():
    block = ({"x": fd.Scalar() >> fd.Broadcast(), "y": fd.Map(fd.Scalar())} >> fd.Zip()
             >> fd.Map(fd.Function(jnp.add)))
    assert_builds([3.0, 4.0, 5.0], block, {"x": 2, "y": [1, 2, 3]})


def test_zip_with():
    block = (fd.Map(fd.Scalar()), fd.Map(fd.Scalar())) >> fd.ZipWith(fd.Function(jnp.add))
    assert_builds([5.0, 7.0, 9.0], block, ([1, 2, 3], [4, 5, 6]))


def test_ngrams_1():
    block = fd.Map(fd.Scalar()) >> fd.NGrams(1)
    assert_builds_const([], block, [])
    assert_builds_const([(1.0,)], block, [1])
    assert_builds_const([(1.0,), (2.0,)], block, [1, 2])


def test_ngrams_2():
    block = fd.Map(fd.Scalar()) >> fd.NGrams(2)
    assert_builds_const([], block, [])
    assert_builds_const([], block, [1.0])
    assert_builds_const([(1.0, 2.0)], block, [1, 2])
    assert_builds_const([(1.0, 2.0), (2.0, 3.0)], block, [1, 2, 3])


def test_ngrams_broadcast():
    assert_builds_const(itertools.repeat((42.0, 42.0)), fd.Scalar() >> fd.Broadcast() >> fd.NGrams(2), 42)


def test_one_hot():
    assert_builds_const([1.0, 0.0], fd.OneHot(2), 0)
    assert_builds_const([0.0, 1.0], fd.OneHot(2), 1)
    assert_builds_const([1.0, 0.0], fd.OneHot(100, 102), 100)
    assert_builds_const([0.0, 1.0, 0.0], fd.OneHot(100, 103), 101)


@pytest.mark.parametrize("strict", [True, False])
def test_one_hot_from_list(strict):
    assert_builds_const([1.0, 0.0], fd.OneHotFromList([37, 23], strict=strict), 37)
    assert_builds_const([0.0, 1.0], fd.OneHotFromList([37, 23], strict=strict), 23)
    assert_builds_const([0.0, 1.0, 0.0], fd.OneHotFromList([5, 9, 6], strict=strict), 9)
    with pytest.raises((AssertionError, ValueError), match="duplicate"):
        fd.OneHotFromList([1, 3, 3], strict=strict)
    if strict:
        with pytest.raises((KeyError, ValueError), match="100"):
            fd.OneHotFromList([37, 23], strict=True).eval(100)
    else:
        assert_builds_const([0.0, 0.0], fd.OneHotFromList([37, 23], strict=False), 100)


def test_output_type_inference():
    assert_builds_const(42.0, fd.Scalar() >> (fd.Identity() >> fd.Identity()), 42)
    block = ({"a": fd.Scalar(), "b": fd.Vector(2) >> fd.Identity()} >> fd.Identity()
             >> (fd.Identity() >> fd.Identity()) >> fd.Identity())
    assert_builds_const((42.0, [5.0, 1.0]), block, {"a": 42, "b": [5, 1]})


def test_output_type_raises():
    """Fold validated a bare ``Identity >> Identity`` with no input type; here a root's input is
    always a PyObject (as Fold's compiler made it), so the block evaluates a PyObject and only
    compiling it, with a root that outputs no tensors, is an error."""
    block = fd.Identity() >> fd.Identity()
    assert block.eval("x") == "x"
    with pytest.raises(TypeError, match="must output tensors"):
        fd.Compiler.create(block)


def test_nth():
    block = (fd.Map(fd.Scalar("int32")), fd.Identity()) >> fd.Nth()
    for n in range(5):
        assert_builds_const(n, block, (list(range(5)), n))


def test_nth_raises():
    with pytest.raises(TypeError, match="2|two"):
        fd.Pipe((fd.Scalar(), fd.Scalar(), fd.Scalar()), fd.Nth())
    with pytest.raises(TypeError, match="sequence"):
        fd.Pipe((fd.Scalar(), fd.Scalar()), fd.Nth())
    with pytest.raises(TypeError, match="Nth takes a Python int index"):
        fd.Pipe((fd.Map(fd.Scalar()), fd.Map(fd.Scalar())), fd.Nth())


def test_zeros_void():
    assert_builds_const((None, 0.0), fd.Zeros(fd.TupleType(fd.VoidType(), fd.TensorType(()))), None)


def test_max_depth():
    assert fd.Scalar().max_depth(42) == 0
    block = fd.Map(fd.Scalar()) >> fd.Fold(fd.Function(jnp.add), jnp.zeros(()))
    for i in range(5):
        assert block.max_depth(list(range(i))) == i


def test_eval_py_object():
    assert_builds_const("42", fd.InputTransform(str), 42)


def test_eval_void():
    assert_builds_const(None, fd.Identity().set_input_type(fd.VoidType()), None)


def test_eval_empty_tuple():
    assert_builds_const((), fd.Record([]), ())


def test_max_depth_metrics():
    elem_block = fd.Composition()
    with elem_block.scope():
        s = fd.Scalar("int32").reads(elem_block.input)
        fd.Metric("foo").reads(s)
        elem_block.output.reads(s)
    block = (fd.Map(elem_block), fd.Identity()) >> fd.Nth()
    assert_builds((31, {"foo": list(range(32))}), block, (list(range(32)), -1), max_depth=None)


def _chars() -> fd.Block:
    return (fd.InputTransform(lambda s: [ord(c) for c in s])
            >> fd.Map(fd.Scalar("int32") >> fd.Function(fd.Embedding(128, 8))))


def test_rnn_with_cells():
    gru1 = _chars() >> fd.RNN(fd.GRUCell(16, name="gru1"))
    gru2 = _chars() >> fd.RNN(fd.GRUCell(16, name="gru2"), initial_state=jnp.ones(16))
    gru3 = _chars() >> fd.RNN(fd.GRUCell(16, name="gru3"), initial_state=fd.FromTensor(jnp.ones(16)))
    lstm = _chars() >> fd.RNN(fd.LSTMCell(16, name="lstm"))
    for block, text in ((gru1, "abcde"), (gru2, "ABCDE"), (gru3, "vghj"), (lstm, "123abc")):
        outputs, state = block.eval(text)
        assert len(outputs) == len(text)
        assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves((outputs, state)))


def test_record_doc_example():
    example_datum = {"id": 8, "name": "Joe Smith", "location": (2.5, 7.0)}
    char_rnn = (fd.InputTransform(lambda s: [ord(c) for c in s])
                >> fd.Map(fd.Scalar("int32") >> fd.Function(fd.Embedding(128, 16)))
                >> fd.Fold(fd.Concat() >> fd.Function(fd.FC(32)), fd.FromTensor(jnp.zeros(32))))
    r = (fd.Record([("id", fd.Scalar("int32") >> fd.Function(fd.Embedding(16, 16))),
                    ("name", char_rnn), ("location", fd.Vector(2))])
         >> fd.Concat() >> fd.Function(fd.FC(256)))
    assert r.eval(example_datum).shape == (256,)


def test_lstm_cell():
    num_hidden = 32
    lstm_cell = fd.Composition()
    with lstm_cell.scope():
        in_state = fd.Identity().reads(lstm_cell.input[1])
        bx = fd.Concat().reads(lstm_cell.input[0], in_state[1])
        bi = fd.Function(fd.FC(num_hidden, jax.nn.sigmoid)).reads(bx)
        bf = fd.Function(fd.FC(num_hidden, jax.nn.sigmoid)).reads(bx)
        bo = fd.Function(fd.FC(num_hidden, jax.nn.sigmoid)).reads(bx)
        bg = fd.Function(fd.FC(num_hidden, jnp.tanh)).reads(bx)
        bc = fd.Function(lambda c, i, f, g: c * f + i * g).reads(in_state[0], bi, bf, bg)
        by = fd.Function(lambda c, o: jnp.tanh(c) * o).reads(bc, bo)
        out_state = fd.Identity().reads(bc, by)
        lstm_cell.output.reads(by, out_state)
    str_lstm = (fd.InputTransform(lambda s: [ord(c) for c in s])
                >> fd.Map(fd.Scalar("int32") >> fd.Function(fd.Embedding(128, 16)))
                >> fd.RNN(lstm_cell, initial_state=fd.AllOf(jnp.zeros(32), jnp.zeros(32))))
    outputs, (c, h) = str_lstm.eval("The quick brown fox.")
    assert len(outputs) == 20 and np.allclose(outputs[-1], h)


def test_hierarchical_rnn():
    char_lstm = _chars() >> fd.RNN(fd.LSTMCell(16, name="char_cell"))
    word_lstm = fd.Map(char_lstm >> fd.GetItem(1) >> fd.Concat()) >> fd.RNN(fd.LSTMCell(32, name="word_cell"))
    outputs, _ = word_lstm.eval(["the", "cat", "sat", "on", "a", "mat"])
    assert len(outputs) == 6 and outputs[0].shape == (32,)


def test_eval_metrics():
    b = fd.Map(fd.Scalar() >> fd.AllOf(fd.Metric("x"), fd.Identity()))
    assert_builds(([(None, 1.0), (None, 2.0)], {"x": [1.0, 2.0]}), b, [1, 2], max_depth=None)


def test_eval_metrics_different_lengths():
    b = fd.Record((fd.Map(fd.Scalar("int32") >> fd.Metric("x")), fd.Map(fd.Scalar() >> fd.Metric("y"))))
    assert_builds((([None, None], [None]), {"x": [1, 2], "y": [3.0]}), b, ([1, 2], [3]), max_depth=None)
