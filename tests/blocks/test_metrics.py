"""Metrics, after TensorFlow Fold's metrics_test.py (re-expressed in pytest), plus labels through
recorded examples and the padded form's guard."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fold as fd


def _pos_neg(shape: tuple) -> fd.Composition:
    """Records its input as metric 'positive' or 'negative' (by its first element's sign) and
    outputs it."""
    c = fd.Composition()
    with c.scope():
        fd.OneOf(lambda x: bool(np.asarray(x).ravel()[0] > 0), (fd.Metric("negative"), fd.Metric("positive")),
                 pre_block=fd.Tensor(shape)).reads(c.input)
        c.output.reads(fd.Tensor(shape).reads(c.input))
    return c


@pytest.mark.parametrize("examples, positive, negative", [
    ([[1, 2, 3, 4]], [1, 2, 3, 4], []),
    ([[1, -2, 3, -4, 5, -6]], [1, 3, 5], [-2, -4, -6]),
    ([[-1, -2, 3, -4, -5, -6]], [3], [-1, -2, -4, -5, -6]),
    ([[1, 2, -3, -4], [5, 6, -7, -8, 0]], [1, 2, 5, 6], [-3, -4, -7, -8, 0]),
])
def test_scalar_metrics(examples, positive, negative):
    compiler = fd.Compiler.create(fd.Map(_pos_neg(())) >> fd.Sum())
    result = compiler.apply({}, compiler.build_batch(examples))
    np.testing.assert_array_equal(result.outputs, [sum(e) for e in examples])
    np.testing.assert_array_equal(result.metrics["positive"].values, positive)
    np.testing.assert_array_equal(result.metrics["negative"].values, negative)
    assert int(result.metrics["negative"].count()) == len(negative)


def test_vector_metrics():
    compiler = fd.Compiler.create(fd.Map(_pos_neg((2,))) >> fd.Sum())
    metrics = compiler.apply({}, compiler.build_batch([[[1, 2], [-2, -3], [4, 5]]])).metrics
    np.testing.assert_array_equal(metrics["positive"].values, [[1, 2], [4, 5]])
    np.testing.assert_array_equal(metrics["negative"].values, [[-2, -3]])


def test_one_metric_name_with_two_types_is_an_error():
    with pytest.raises(TypeError, match="metric '(positive|negative)' gets both"):
        fd.Compiler.create(fd.Record({"foo": fd.Map(_pos_neg(())) >> fd.Sum(),
                                      "bar": fd.Map(_pos_neg((2,))) >> fd.Sum()}) >> fd.Concat())


def _labeled_tree() -> fd.Block:
    """Fold's labeled-metrics tree: ``[value, label, *children]``; a leaf has no children."""
    fwd = fd.ForwardDeclaration(fd.PyObjectType(), fd.VoidType())
    leaf = fd.Record((fd.Scalar("int32"), fd.Identity()), ) >> fd.Metric("leaf")
    internal = fd.AllOf(
        fd.Slice(stop=2) >> fd.Record((fd.Scalar("int32"), fd.Identity())) >> fd.Metric("internal"),
        fd.Slice(start=2) >> fd.Map(fwd())) >> fd.Void()
    fwd.resolve_to(fd.OneOf(lambda expr: len(expr) > 2, (leaf, internal)))
    return fwd()


TREES = [[1, "a", [2, "b"], [3, "c"], [4, "d"]], [5, "e", [6, "f", [7, "g"]]]]


def test_labels_come_with_the_batch_walked_or_recorded():
    compiler = fd.Compiler.create(_labeled_tree())
    for batch in (compiler.build_batch(TREES), compiler.build_batch(compiler.record(TREES))):
        assert batch.metric_labels == {"leaf": ["b", "c", "d", "g"], "internal": ["a", "e", "f"]}
        metrics = compiler.apply({}, batch).metrics
        np.testing.assert_array_equal(metrics["leaf"].values, [2, 3, 4, 7])
        np.testing.assert_array_equal(metrics["internal"].values, [1, 5, 6])
    # Recorded examples taken in another order keep each label with its value.
    recorded = compiler.record(TREES)
    batch = compiler.build_batch(recorded[[1, 0]])
    assert batch.metric_labels == {"leaf": ["g", "b", "c", "d"], "internal": ["e", "f", "a"]}
    np.testing.assert_array_equal(compiler.apply({}, batch).metrics["leaf"].values, [7, 2, 3, 4])
    # From worker processes too.
    (batch,) = compiler.batches(TREES, 2, num_workers=1)
    assert batch.metric_labels["leaf"] == ["b", "c", "d", "g"]


def test_a_label_must_be_a_python_object_beside_a_tensor():
    with pytest.raises(TypeError, match=r"takes a tensor or a pair \(tensor, label\)"):
        fd.Record((fd.Scalar(), fd.Scalar())) >> fd.Metric("m")


def test_values_are_the_real_entries_and_refuse_traced_code():
    compiler = fd.Compiler.create(fd.Map(fd.Scalar() >> fd.Metric("m")) >> fd.Void())
    batch = compiler.build_batch([[1.0, 2.0], [3.0]])
    metric = compiler.apply({}, batch).metrics["m"]
    assert metric.padded.shape[0] > 3 and metric.values.tolist() == [1.0, 2.0, 3.0]
    assert float(metric.mean()) == 2.0  # a mean over .padded would count the padding's zeros
    assert repr(metric).startswith("MetricValues(count=3, values=array([1., 2., 3.]")

    @jax.jit
    def bad(params, b):
        return jnp.mean(compiler.apply(params, b).metrics["m"].values)

    with pytest.raises(TypeError, match=r"use \.sum\(\), \.mean\(\) or \.count\(\), or \.padded with \.mask"):
        bad({}, batch)
    assert float(jax.jit(lambda p, b: compiler.apply(p, b).metrics["m"].mean())({}, batch)) == 2.0
