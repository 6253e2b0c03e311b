"""OneOf, ForwardDeclaration and Metric."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fold as fd


def test_one_of_with_dict_and_block_key():
    block = fd.OneOf(fd.GetItem("key"), {"a": fd.GetItem("x") >> fd.Scalar(),
                                         "b": fd.GetItem("y") >> fd.Scalar() >> fd.Function(jnp.negative)})
    assert float(block.eval({"key": "a", "x": 2})) == 2.0
    assert float(block.eval({"key": "b", "y": 2})) == -2.0
    with pytest.raises(KeyError, match="no case for key 'c'"):
        block.eval({"key": "c"})


def test_one_of_with_sequence_cases_and_negative_index():
    block = fd.OneOf(lambda x: x["i"], [fd.Void() >> fd.FromTensor(np.float32(i)) for i in range(3)])
    assert float(block.eval({"i": -1})) == 2.0
    with pytest.raises(KeyError):
        block.eval({"i": 3})


def test_one_of_cases_may_be_layers():
    # Cases are block-likes: a layer case is wrapped in a Function (it crashed before).
    double = fd.FC(2, activation=None, name="double")
    compiler = fd.Compiler.create(fd.OneOf(lambda x: x[0], [double, fd.Function(jnp.negative)],
                                           pre_block=fd.GetItem(1) >> fd.Vector(2)))
    assert compiler.program.root.output_type == fd.TensorType((2,))
    params = compiler.init(jax.random.key(0))
    out = compiler.apply(params, compiler.build_batch([(0, [1.0, 2.0]), (1, [1.0, 2.0])])).outputs
    w, b = params["double"]["w"], params["double"]["b"]
    np.testing.assert_allclose(out, [np.array([1.0, 2.0]) @ w + b, [-1.0, -2.0]], rtol=1e-6)


def test_one_of_pre_block():
    block = fd.OneOf(lambda x: len(x), {1: fd.Scalar(), 2: fd.Scalar() >> fd.Function(lambda x: 10 * x)},
                     pre_block=fd.InputTransform(sum))
    assert float(block.eval([1, 2])) == 30.0


def test_one_of_case_type_mismatch_and_empty():
    with pytest.raises(TypeError, match="OneOf"):
        fd.OneOf(lambda x: x, {0: fd.Scalar(), 1: fd.Vector(2)})
    with pytest.raises(ValueError):
        fd.OneOf(lambda x: x, {})


def test_forward_declaration_recursion():
    decl = fd.ForwardDeclaration(fd.PyObjectType(), fd.TensorType(()))
    lit = fd.GetItem("val") >> fd.Scalar()
    add = fd.Record({"left": decl(), "right": decl()}) >> fd.Function(jnp.add)
    expr = fd.OneOf(lambda x: x["op"], {"lit": lit, "add": add})
    decl.resolve_to(expr)
    e = {"op": "add", "left": {"op": "lit", "val": 2}, "right": {"op": "add", "left": {"op": "lit", "val": 3},
                                                                  "right": {"op": "lit", "val": 4}}}
    assert float(expr.eval(e)) == 9.0
    assert expr.max_depth(e) == 2


def test_forward_declaration_infers_types_from_target():
    decl = fd.ForwardDeclaration()
    ref = decl()
    decl.resolve_to(fd.Scalar())
    assert ref.output_type == fd.TensorType(()) and ref.input_type == fd.PyObjectType()


def test_unresolved_declaration_and_double_resolve():
    decl = fd.ForwardDeclaration(fd.PyObjectType(), fd.TensorType(()))
    with pytest.raises(TypeError, match="never resolved"):
        fd.Compiler.create(decl())
    decl.resolve_to(fd.Scalar())
    with pytest.raises(ValueError, match="already resolved"):
        decl.resolve_to(fd.Scalar())


def test_metric_values_and_eval():
    block = fd.Map(fd.Scalar() >> fd.Metric("foo")) >> fd.Void()
    out, metrics = block.eval([1, 2])
    assert out is None and [float(v) for v in metrics["foo"]] == [1.0, 2.0]
    compiler = fd.Compiler.create(block)
    result = compiler.apply({}, compiler.build_batch([range(3), range(4)]))
    m = result.metrics["foo"]
    assert result.outputs is None
    n = int(m.count())
    assert n == 7
    np.testing.assert_array_equal(np.asarray(m.values[:n]), [0, 1, 2, 0, 1, 2, 3])
    np.testing.assert_array_equal(np.asarray(m.example[:n]), [0, 0, 0, 1, 1, 1, 1])
    assert not bool(m.mask[n:].any()) and bool((m.example[n:] == -1).all())
    assert float(m.sum()) == 9.0 and float(m.mean()) == pytest.approx(9 / 7)


def test_metric_needs_tensor_and_every_name_is_present():
    with pytest.raises(TypeError, match="Metric"):
        fd.Map(fd.Scalar()) >> fd.Metric("m")
    block = fd.OneOf(lambda x: x > 0, {True: fd.Scalar() >> fd.Metric("pos"),
                                       False: fd.Scalar() >> fd.Metric("neg")})
    compiler = fd.Compiler.create(block)
    result = compiler.apply({}, compiler.build_batch([1.0, 2.0]))
    assert set(result.metrics) == {"neg", "pos"}
    assert int(result.metrics["neg"].count()) == 0 and float(result.metrics["neg"].mean()) == 0.0
    _, metrics = block.eval(3.0)
    assert metrics["neg"] == [] and len(metrics["pos"]) == 1


def test_vector_metric_sum_is_a_vector():
    block = fd.Map(fd.Vector(2) >> fd.Metric("v")) >> fd.Void()
    compiler = fd.Compiler.create(block)
    m = compiler.apply({}, compiler.build_batch([[[1, 2], [3, 4]]])).metrics["v"]
    np.testing.assert_array_equal(np.asarray(m.sum()), [4, 6])
    np.testing.assert_array_equal(np.asarray(m.mean()), [2, 3])


def test_a_declaration_used_as_a_block_is_a_clear_error():
    # It used to fail while the batch was built: "ForwardDeclaration defines no host walk".
    decl = fd.ForwardDeclaration(fd.PyObjectType(), fd.TensorType(()))
    decl.resolve_to(fd.Scalar())
    with pytest.raises(TypeError, match=r"ForwardDeclaration is used as a block.*put a use of it, decl\(\)"):
        fd.Compiler.create(decl)
    other = fd.ForwardDeclaration(fd.PyObjectType(), fd.TensorType(()))
    other.resolve_to(fd.Scalar())
    with pytest.raises(TypeError, match="ForwardDeclaration is used as a block"):
        fd.Compiler.create(fd.Map(other) >> fd.Sum())
    compiler = fd.Compiler.create(fd.Map(decl()) >> fd.Sum())
    assert compiler.apply({}, compiler.build_batch([[1.0, 2.0]])).outputs.tolist() == [3.0]
