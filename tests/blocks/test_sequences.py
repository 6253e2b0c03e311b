"""Sequence blocks: Map, Fold, RNN, Reduce, Sum/Min/Max/Mean, Zip, NGrams, ..."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fold as fd
from tests.models import sigmoid


def floats(values):
    return [float(v) for v in values]


def test_map():
    block = fd.Map(fd.Scalar() >> fd.Function(jnp.abs))
    assert block.output_type == fd.SequenceType(fd.TensorType(()))
    assert floats(block.eval([1, -2, 3])) == [1, 2, 3]
    assert block.eval([]) == []


def test_map_over_a_jax_array_reads_it_once_as_numpy():
    # Each item was a device slice of its own, which made building batches slower than from NumPy.
    seen = []
    block = fd.Map(fd.InputTransform(lambda v: seen.append(type(v)) or v) >> fd.Vector(2)) >> fd.Sum()
    compiler = fd.Compiler.create(block)
    params = compiler.init(jax.random.key(0))
    x = jnp.arange(6.0).reshape(3, 2)
    out = compiler.apply(params, compiler.build_batch([x, x[:1]])).outputs
    np.testing.assert_array_equal(np.asarray(out), [[6.0, 9.0], [0.0, 1.0]])
    assert seen and all(t is np.ndarray for t in seen)
    with pytest.raises(TypeError, match=r"^example 0: at Map: Map expected a sequence, got ndarray"):
        compiler.build_batch([jnp.float32(1.0)])
    with pytest.raises(TypeError, match=r"^example 0: at Map: the example holds a traced JAX value"):
        jax.jit(lambda xs: compiler.build_batch([xs]).arrays)(x)


def test_fold_is_left_fold():
    block = fd.Map(fd.Scalar()) >> fd.Fold(fd.Function(lambda acc, x: 2 * acc + x), fd.FromTensor(np.float32(1)))
    assert float(block.eval([1, 2, 3])) == ((1 * 2 + 1) * 2 + 2) * 2 + 3
    assert float(block.eval([])) == 1.0


def test_rnn_with_gru_matches_manual_loop():
    cell = fd.GRUCell(3, name="gru_cell")
    block = fd.Map(fd.Vector(2)) >> fd.RNN(cell)
    compiler = fd.Compiler.create(block >> fd.GetItem(1))
    params = compiler.init(jax.random.key(0))
    xs = [[1.0, 2.0], [0.5, -1.0], [0.0, 3.0]]
    outs, final = block.eval(xs, params)
    h = jnp.zeros((1, 3))
    for x, o in zip(xs, outs):
        h, _ = cell.apply(params["gru_cell"], jnp.asarray([x]), h)
        np.testing.assert_allclose(o, h[0], rtol=1e-5)
    np.testing.assert_allclose(final, h[0], rtol=1e-5)


def test_rnn_initial_state_from_input_and_given():
    cell = fd.Function(lambda x, s: (x + s, s + 1))
    from_input = (fd.Map(fd.Scalar()), fd.Scalar()) >> fd.RNN(cell, initial_state_from_input=True)
    outs, final = from_input.eval(([1, 2], 10))
    assert floats(outs) == [11, 13] and float(final) == 12
    given = fd.Map(fd.Scalar()) >> fd.RNN(fd.Function(lambda x, s: (x + s, s + 1)),
                                          initial_state=np.float32(5))
    outs, final = given.eval([1, 1])
    assert floats(outs) == [6, 7] and float(final) == 7
    with pytest.raises(ValueError):
        fd.RNN(fd.GRUCell(2), initial_state=np.zeros(2), initial_state_from_input=True)


def test_reduce_sum_min_max_mean():
    xs = [3.0, -1.0, 4.0, 1.5]
    seq = fd.Map(fd.Scalar())
    assert float((fd.Map(fd.Scalar()) >> fd.Sum()).eval(xs)) == sum(xs)
    assert float((fd.Map(fd.Scalar()) >> fd.Min()).eval(xs)) == min(xs)
    assert float((fd.Map(fd.Scalar()) >> fd.Max()).eval(xs)) == max(xs)
    assert float((seq >> fd.Mean()).eval(xs)) == pytest.approx(np.mean(xs))
    vec_mean = fd.Map(fd.Vector(2)) >> fd.Mean()
    np.testing.assert_allclose(vec_mean.eval([[1, 2], [3, 6]]), [2, 4])
    for reducer in (fd.Sum, fd.Min, fd.Max, fd.Mean):
        assert float((fd.Map(fd.Scalar()) >> reducer()).eval([])) == 0.0


def test_max_and_min_split_the_gradient_of_a_tie_pairwise():
    """At an exact tie the gradient is not unique; ``Max``/``Min`` give each pairwise tie of their
    balanced tree half (``jnp.maximum``'s rule), not ``jnp.max``'s equal split: items
    ``[a, b, b]`` tied reduce as ``a`` against ``(b, b)``, so ``a``'s layer gets 1/2, not 1/3."""
    for reducer in (fd.Max, fd.Min):
        item = fd.OneOf(lambda x: x[0], {0: fd.GetItem(1) >> fd.Vector(1) >> fd.FC(1, activation=None, name="a"),
                                         1: fd.GetItem(1) >> fd.Vector(1) >> fd.FC(1, activation=None, name="b")})
        compiler = fd.Compiler.create(fd.Map(item) >> reducer())
        params = compiler.init(jax.random.key(0))
        params["b"] = params["a"]
        batch = compiler.build_batch([[(0, [2.0]), (1, [2.0]), (1, [2.0])]])
        grads = jax.jit(jax.grad(lambda p: compiler.apply(p, batch).outputs.sum()))(params)
        assert float(grads["a"]["b"][0]) == 0.5 and float(grads["b"]["b"][0]) == 0.5, reducer


def test_reduce_default_block():
    block = fd.Map(fd.Scalar()) >> fd.Reduce(fd.Function(jnp.add), fd.FromTensor(np.float32(-7)))
    assert float(block.eval([])) == -7.0
    assert float(block.eval([2])) == 2.0


def test_zip_and_broadcast():
    block = (fd.Map(fd.Scalar()), fd.Scalar() >> fd.Broadcast()) >> fd.Zip() \
        >> fd.Map(fd.Function(jnp.multiply))
    assert floats(block.eval(([1, 2, 3], 10))) == [10, 20, 30]
    shortest = (fd.Map(fd.Scalar()), fd.Map(fd.Scalar())) >> fd.ZipWith(fd.Function(jnp.add))
    assert floats(shortest.eval(([1, 2, 3], [10, 20]))) == [11, 22]
    # Only broadcasts: a broadcast (test_zip_and_ngrams_of_broadcasts_are_broadcasts).
    assert isinstance(((fd.Scalar() >> fd.Broadcast(), fd.Scalar() >> fd.Broadcast()) >> fd.Zip()).output_type,
                      fd.BroadcastSequenceType)


def test_center_sequence_example_from_fold_docs():
    seq = fd.Map(fd.Scalar())
    block = seq >> fd.AllOf(fd.Identity(), fd.Mean() >> fd.Broadcast()) >> fd.Zip() \
        >> fd.Map(fd.Function(jnp.subtract))
    assert floats(block.eval([1, 2, 6])) == [-2, -1, 3]


def test_ngrams_nth_length():
    ngrams = fd.Map(fd.Scalar()) >> fd.NGrams(2)
    assert ngrams.output_type == fd.SequenceType(fd.TupleType(fd.TensorType(()), fd.TensorType(())))
    assert [floats(t) for t in ngrams.eval([1, 2, 3])] == [[1, 2], [2, 3]]
    nth = (fd.Map(fd.Scalar()), fd.Identity()) >> fd.Nth()
    assert float(nth.eval(([4, 5, 6], 1))) == 5.0
    with pytest.raises(KeyError):
        nth.eval(([4], 3))
    length = fd.Length("int32")
    assert int(length.eval([1, 2, 3])) == 3
    with pytest.raises(TypeError, match="Nth"):
        fd.Compiler.create((fd.Map(fd.Scalar()), fd.Identity(), fd.Identity()) >> fd.Nth())
    with pytest.raises(TypeError, match="Length"):
        fd.Void() >> fd.Length()


def test_map_over_non_sequence_type_is_type_error():
    with pytest.raises(TypeError):
        fd.Scalar() >> fd.Map(fd.Identity())


# Tuples of items of one type are sequences to Map, Fold, Reduce and the pools, as in Fold.
@pytest.mark.parametrize("pool, reference", [(fd.Sum, np.sum), (fd.Min, np.min), (fd.Max, np.max),
                                             (fd.Mean, np.mean)])
def test_pools_take_a_tuple_of_one_type(pool, reference):
    model = fd.Record((fd.Vector(2), fd.Vector(2), fd.Vector(2))) >> pool()
    examples = [([1, 5], [3, -2], [0, 4]), ([2, 2], [-1, 7], [6, 0])]
    compiler = fd.Compiler.create(model)
    out = compiler.apply({}, compiler.build_batch(examples)).outputs
    np.testing.assert_allclose(out, [reference(np.asarray(e, np.float32), axis=0) for e in examples], rtol=1e-6)


def test_map_fold_and_reduce_take_a_tuple_and_train():
    fc, cell = fd.FC(3, activation=jnp.tanh, name="fc"), fd.FC(3, activation=jnp.tanh, name="fc_1")
    items = fd.Record((fd.Vector(2), fd.Vector(2), fd.Vector(2)))
    model = items >> fd.AllOf(
        fd.Map(fd.Function(fc)) >> fd.Sum(),
        fd.Fold(fd.Concat() >> fd.Function(cell), fd.Zeros(fd.TensorType((3,)))),
    ) >> fd.Concat()
    compiler = fd.Compiler.create(model)
    params = compiler.init(jax.random.key(0))
    examples = [([1.0, 5.0], [3.0, -2.0], [0.0, 4.0]), ([0.5, 0.0], [1.0, 1.0], [-1.0, 2.0])]
    batch = compiler.build_batch(examples)

    def reference(p: dict, e: tuple) -> jax.Array:
        xs = [jnp.asarray(x) for x in e]
        mapped = sum(jnp.tanh(x @ p["fc"]["w"] + p["fc"]["b"]) for x in xs)
        acc = jnp.zeros(3)
        for x in xs:
            acc = jnp.tanh(jnp.concatenate([acc, x]) @ p["fc_1"]["w"] + p["fc_1"]["b"])
        return jnp.concatenate([mapped, acc])

    np.testing.assert_allclose(compiler.apply(params, batch).outputs,
                               jnp.stack([reference(params, e) for e in examples]), rtol=1e-5, atol=1e-6)
    grads = jax.jit(jax.grad(lambda p: compiler.apply(p, batch).outputs.sum()))(params)
    expected = jax.grad(lambda p: sum(reference(p, e).sum() for e in examples))(params)
    for g, r in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(expected)):
        np.testing.assert_allclose(g, r, rtol=1e-4, atol=1e-6)
    reduced = (fd.Record((fd.Scalar(), fd.Scalar(), fd.Scalar())) >> fd.Reduce(fd.Function(lambda a, b: a - b)))
    assert float(reduced.eval((1, 2, 3))) == 1 - (2 - 3)  # halves: xs[:1] against xs[1:]


def test_a_tuple_of_mixed_types_is_no_sequence():
    with pytest.raises(TypeError, match=r"takes a sequence or a tuple of items of one type, not TupleType"):
        fd.Record((fd.Vector(2), fd.Scalar())) >> fd.Sum()
    with pytest.raises(TypeError, match="takes a sequence or a non-empty tuple"):
        fd.Record(()) >> fd.Map(fd.Identity())


def test_map_of_a_host_function_is_a_python_object():
    """``Map(InputTransform(f))`` maps on the host: a sequence of PyObjects is a PyObject."""
    block = fd.Map(fd.InputTransform(str))
    assert block.output_type == fd.PyObjectType()
    assert block.eval([1, 2]) == ["1", "2"]
    model = fd.Map(fd.InputTransform(lambda x: 2 * x)) >> fd.Map(fd.Scalar()) >> fd.Sum()
    compiler = fd.Compiler.create(model)
    np.testing.assert_allclose(compiler.apply({}, compiler.build_batch([[1, 2], [3]])).outputs, [6.0, 6.0])


def test_zip_and_ngrams_of_broadcasts_are_broadcasts():
    """As in Fold: zipping only broadcast sequences, or n-grams of one, repeats endlessly too."""
    both = fd.Record((fd.Scalar() >> fd.Broadcast(), fd.Vector(2) >> fd.Broadcast())) >> fd.Zip()
    assert both.output_type == fd.BroadcastSequenceType(fd.TupleType(fd.TensorType(()), fd.TensorType((2,))))
    grams = fd.Scalar() >> fd.Broadcast() >> fd.NGrams(3)
    assert grams.output_type == fd.BroadcastSequenceType(fd.TupleType(*[fd.TensorType(())] * 3))
    # Zipped with a finite sequence, they take its length.
    model = (fd.Record((fd.Map(fd.Scalar()), both, grams)) >> fd.Zip()
             >> fd.Map(fd.Function(lambda x, pair, gram: x + pair[0] + pair[1].sum(-1) + gram[0] + gram[2]))
             >> fd.Sum())
    compiler = fd.Compiler.create(model)
    examples = [([1.0, 2.0, 3.0], (10.0, [1.0, 2.0]), 4.0), ([5.0], (0.0, [0.0, 0.0]), -1.0)]
    out = compiler.apply({}, compiler.build_batch(examples)).outputs
    expected = [sum(x + a + sum(v) + 2 * g for x in xs) for xs, (a, v), g in examples]
    np.testing.assert_allclose(out, expected)


def _softmax_reference(xs: np.ndarray) -> np.ndarray:
    e = np.exp(xs - xs.max(axis=0))
    return e / e.sum(axis=0)


def test_softmax_across_a_sequence_matches_numpy_and_trains():
    """Softmax normalises across the sequence, entry by entry of the elements; huge scores do not
    overflow; an empty sequence stays empty; gradients equal jax.nn.softmax's."""
    block = fd.Map(fd.Vector(3)) >> fd.Softmax() >> fd.Map(fd.Function(lambda w: w * jnp.arange(1.0, 4.0))) >> fd.Sum()
    compiler = fd.Compiler.create(block)
    rng = np.random.default_rng(0)
    examples = [rng.normal(size=(n, 3)).astype(np.float32) for n in (1, 2, 5, 8)]
    examples.append(np.array([[1000.0, -1000.0, 0.0], [999.0, 1000.0, 0.0]], np.float32))
    out = jax.jit(compiler.apply)({}, compiler.build_batch([x.tolist() for x in examples])).outputs
    expected = [(_softmax_reference(x.astype(np.float64)) * np.arange(1, 4)).sum(0) for x in examples]
    np.testing.assert_allclose(out, np.stack(expected), rtol=1e-5, atol=1e-6)
    assert np.isfinite(out).all()
    assert (fd.Map(fd.Vector(3)) >> fd.Softmax()).eval([]) == []
    weights = (fd.Map(fd.Vector(1)) >> fd.Softmax()).eval([[0.0], [1.0], [2.0]])
    np.testing.assert_allclose(np.concatenate(weights), _softmax_reference(np.arange(3.0)), rtol=1e-6)

    scores = fd.Map(fd.Vector(2) >> fd.FC(1, activation=None)) >> fd.Softmax()
    trained = fd.Compiler.create(fd.AllOf(scores, fd.Map(fd.Vector(2))) >> fd.ZipWith(fd.Function(jnp.multiply))
                                 >> fd.Sum())
    params = trained.init(jax.random.key(0))
    data = [rng.normal(size=(n, 2)).round(3).tolist() for n in (3, 1, 6)]
    name = next(iter(params))

    def batched(p):
        return jnp.sum(trained.apply(p, trained.build_batch(data)).outputs ** 2)

    def reference(p):
        total = 0.0
        for x in data:
            x = jnp.asarray(x, jnp.float32)
            alpha = jax.nn.softmax((x @ p[name]["w"] + p[name]["b"])[:, 0])
            total += jnp.sum((alpha[:, None] * x).sum(0) ** 2)
        return total

    np.testing.assert_allclose(jax.jit(batched)(params), reference(params), rtol=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
                 jax.jit(jax.grad(batched))(params), jax.grad(reference)(params))


def test_softmax_of_a_non_sequence_is_a_type_error():
    with pytest.raises(TypeError):
        fd.Compiler.create(fd.Vector(3) >> fd.Softmax())


def _lstm_np(p: dict, xs: np.ndarray) -> list[np.ndarray]:
    """Outputs of an LSTMCell (its documented equations, forget bias 1) run over ``xs`` from zeros."""
    H = p["b"].shape[0] // 4
    c, h, outs = np.zeros(H), np.zeros(H), []
    for x in xs:
        i, f, g, o = np.split(np.concatenate([x, h]) @ p["w"] + p["b"], 4)
        c = sigmoid(f + 1.0) * c + sigmoid(i) * np.tanh(g)
        h = sigmoid(o) * np.tanh(c)
        outs.append(h)
    return outs


def test_the_bidirectional_rnn_recipe_of_docs_blocks_matches_numpy():
    """docs/blocks.md's recipe: Slice(step=-1) around a second RNN, outputs paired per element."""
    def bidirectional(forward_cell, backward_cell):
        forward = fd.RNN(forward_cell) >> fd.GetItem(0)
        backward = fd.Slice(step=-1) >> fd.RNN(backward_cell) >> fd.GetItem(0) >> fd.Slice(step=-1)
        return fd.AllOf(forward, backward) >> fd.ZipWith(fd.Concat())

    model = fd.Map(fd.Vector(2)) >> bidirectional(fd.LSTMCell(3, name="fw"), fd.LSTMCell(3, name="bw"))
    compiler = fd.Compiler.create(model >> fd.Map(fd.Metric("h")) >> fd.Void())
    params = compiler.init(jax.random.key(0))
    p = {name: {k: np.asarray(v, np.float64) + 0.05 for k, v in ps.items()} for name, ps in params.items()}
    examples = [[[1.0, 2.0], [3.0, -1.0], [0.5, 0.5]], [[0.0, 1.0]], [[2.0, 0.0], [-1.0, 1.0]]]
    values = compiler.apply(jax.tree.map(jnp.float32, p), compiler.build_batch(examples)).metrics["h"].values
    want = []
    for xs in map(np.asarray, examples):
        fw, bw = _lstm_np(p["fw"], xs), _lstm_np(p["bw"], xs[::-1])[::-1]
        want += [np.concatenate([a, b]) for a, b in zip(fw, bw)]
    np.testing.assert_allclose(np.asarray(values), np.asarray(want), rtol=1e-4, atol=1e-5)
