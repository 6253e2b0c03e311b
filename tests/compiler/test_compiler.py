"""Compiler: root checks, params, apply results, batches and eval."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fold as fd


@pytest.mark.parametrize("root", [
    lambda: fd.Map(fd.Scalar()),
    lambda: fd.Identity(),
    lambda: fd.InputTransform(str),
    lambda: fd.AllOf(fd.Void(), fd.Void()) >> fd.GetItem(slice(0, 0)),
    lambda: fd.Void(),
])
def test_roots_that_cannot_compile_are_type_errors(root):
    with pytest.raises(TypeError):
        fd.Compiler.create(root())


def test_tuple_root_with_void_parts():
    block = fd.AllOf(fd.Scalar(), fd.Scalar() >> fd.Metric("m"), fd.Scalar() >> fd.Function(lambda x: x[:, None]))
    compiler = fd.Compiler.create(block)
    result = compiler.apply({}, compiler.build_batch([4.0, 5.0]))
    a, none, c = result.outputs
    assert none is None
    np.testing.assert_array_equal(np.asarray(a), [4, 5])
    assert np.asarray(c).shape == (2, 1)
    np.testing.assert_array_equal(np.asarray(result.metrics["m"].values[:2]), [4, 5])


def test_compiler_needs_create():
    with pytest.raises(TypeError, match="create"):
        fd.Compiler(fd.Scalar())


def test_init_is_deterministic_and_per_name():
    block = fd.Vector(2) >> fd.FC(3, name="a") >> fd.FC(3, name="b")
    p1 = fd.Compiler.create(block).init(jax.random.key(0))
    p2 = fd.Compiler.create(block).init(jax.random.key(0))
    p3 = fd.Compiler.create(block).init(jax.random.key(1))
    np.testing.assert_array_equal(p1["a"]["w"], p2["a"]["w"])
    assert not np.allclose(p1["a"]["w"], p3["a"]["w"])


def test_build_batch_needs_examples_and_apply_needs_a_batch():
    compiler = fd.Compiler.create(fd.Scalar())
    with pytest.raises(ValueError):
        compiler.build_batch([])
    with pytest.raises(TypeError, match="Batch"):
        compiler.apply({}, [1.0])


def test_batches_order_remainder_shuffle_and_workers():
    compiler = fd.Compiler.create(fd.Scalar())
    data = list(range(10))

    def values(batches):
        return [np.asarray(compiler.apply({}, b).outputs).tolist() for b in batches]

    assert values(compiler.batches(data, 4)) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert values(compiler.batches(data, 4, drop_remainder=True)) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    shuffled = values(compiler.batches(data, 4, shuffle=True, seed=3))
    assert sorted(v for b in shuffled for v in b) == data and shuffled != values(compiler.batches(data, 4))
    assert shuffled == values(compiler.batches(data, 4, shuffle=True, seed=3))
    assert values(compiler.batches(data, 3, num_workers=2)) == values(compiler.batches(data, 3))
    with pytest.raises(ValueError):
        list(compiler.batches(data, 0))


def test_batch_is_a_pytree_for_jit():
    compiler = fd.Compiler.create(fd.Map(fd.Scalar() >> fd.Function(lambda x: x * 3)) >> fd.Sum())
    batch = compiler.build_batch([[1, 2], [3]])
    leaves, treedef = jax.tree_util.tree_flatten(batch)
    rebuilt = jax.tree_util.tree_unflatten(treedef, leaves)
    assert rebuilt.layout == batch.layout
    np.testing.assert_array_equal(np.asarray(jax.jit(compiler.apply)({}, rebuilt).outputs), [9, 9])


def test_eval_conversions():
    block = fd.AllOf(fd.Map(fd.Scalar()), fd.Map(fd.Scalar()) >> fd.Length(), fd.Void())
    seq, length, void = block.eval([1, 2])
    assert isinstance(seq, list) and [float(v) for v in seq] == [1, 2]
    assert isinstance(length, np.ndarray) and length.shape == () and float(length) == 2
    assert void is None
    assert fd.InputTransform(lambda x: x + 1).eval(1) == 2


def test_function_batches_across_examples():
    calls = []

    def double(x):
        calls.append(x.shape)
        return 2 * x

    compiler = fd.Compiler.create(fd.Map(fd.Scalar() >> fd.Function(jnp.abs) >> fd.Function(double)) >> fd.Sum())
    examples = [[1, -2], [-3, 4]]
    out = compiler.apply({}, compiler.build_batch(examples))
    np.testing.assert_array_equal(np.asarray(out.outputs), [6, 14])
    assert calls  # traced: once per stage and item size that can run it
    # One group (one batched call) covers the four elements of both examples.
    double_op = next(o for o, op in enumerate(compiler.program.ops) if "double" in op.spec.label)
    groups, _ = fd.schedule_profile(compiler, examples)
    assert [g.rows for g in groups if g.op == double_op] == [4]


def test_apply_refuses_a_batch_built_by_another_compiler():
    """Two compilers of same-shaped models: the other's batch has the same layout, and its rows
    mean the other model's values, so running it would return numbers that look right."""
    ours, theirs = (fd.Compiler.create(fd.Vector(3) >> fd.FC(4)) for _ in range(2))
    params = ours.init(jax.random.key(0))
    foreign = theirs.build_batch([[1.0, 2.0, 3.0]])
    assert foreign.layout == ours.build_batch([[1.0, 2.0, 3.0]]).layout
    for run in (ours.apply, jax.jit(ours.apply)):
        with pytest.raises(ValueError, match="built by another compiler"):
            run(params, foreign)


@pytest.mark.parametrize("examples, message", [
    ({1.0: "a", 2.0: "b"}, r"got a dict; pass list\(d.values\(\)\) for its values, or \[d\] for one example"),
    ({2.0, 1.0}, r"got a set; pass a list \(a set has no order"),
    ("12", r"got a str; for one example, pass \[example\]"),
    (np.float32(1.0), r"got float32 np.float32\(1.0\); for one example, pass \[example\]"),
    (None, r"got NoneType None"),
])
def test_a_collection_that_is_no_list_of_examples_is_refused(examples, message):
    """A dict's keys, a set's arbitrary order or a string's characters were built as the batch's
    examples: outputs of other examples than the caller meant, or in an order it cannot map back."""
    compiler = fd.Compiler.create(fd.Scalar() >> fd.Function(jnp.sin))
    calls = {"build_batch": compiler.build_batch, "record": compiler.record,
             "batches": lambda x: next(compiler.batches(x, 2)),
             "check_numerics": lambda x: compiler.check_numerics({}, x),
             "schedule_profile": lambda x: fd.schedule_profile(compiler, x)}
    for name, call in calls.items():
        with pytest.raises(TypeError, match=f"^{name} takes a list or iterable of examples, {message}"):
            call(examples)
    np.testing.assert_allclose(compiler.apply({}, compiler.build_batch(np.asarray([1.0, 2.0]))).outputs,
                               np.sin([1.0, 2.0]), rtol=1e-6)  # an array is a sequence of examples


def test_a_dataset_with_only_getitem_and_len_is_a_sequence_of_examples():
    """A PyTorch-style dataset (``__getitem__`` and ``__len__``, no ``__iter__``) is iterable by
    Python's sequence protocol; the check that refuses dicts and sets must let it through."""

    class Dataset:
        def __len__(self):
            return 3

        def __getitem__(self, i):
            if i >= 3:
                raise IndexError(i)
            return float(i)

    compiler = fd.Compiler.create(fd.Scalar() >> fd.Function(jnp.sin))
    want = np.sin([0.0, 1.0, 2.0])
    np.testing.assert_allclose(compiler.apply({}, compiler.build_batch(Dataset())).outputs, want, rtol=1e-6)
    got = [compiler.apply({}, b).outputs for b in compiler.batches(Dataset(), 2)]
    np.testing.assert_allclose(np.concatenate(got), want, rtol=1e-6)
    assert len(compiler.record(Dataset())) == 3
    with pytest.raises(TypeError, match="check_numerics walks the examples themselves"):
        compiler.check_numerics({}, compiler.record(Dataset()))


@pytest.mark.parametrize("change, message", [
    (lambda p: dict(p, b=jnp.zeros(1)), r"params\['fc'\]\['b'\] has shape \(1,\) .* needs shape \(4,\)"),
    (lambda p: dict(p, w=p["w"].astype(jnp.float16)), r"params\['fc'\]\['w'\] .* dtype float16.* dtype float32"),
    (lambda p: dict(p, w=p["w"].astype(jnp.int32)), r"dtype int32"),
    (lambda p: dict(p, extra=jnp.zeros(2)), r"params\['fc'\] has structure"),
])
def test_params_of_another_shape_or_dtype_are_refused(change, message):
    compiler = fd.Compiler.create(fd.Vector(3) >> fd.FC(4, name="fc"))
    params = compiler.init(jax.random.key(0))
    batch = compiler.build_batch([[1.0, 2.0, 3.0]])
    with pytest.raises(TypeError, match=message):
        compiler.apply({"fc": change(params["fc"])}, batch)


def test_batches_say_which_examples_they_hold():
    """Shuffled batches' outputs pair with labels kept outside the examples through example_indices."""
    compiler = fd.Compiler.create(fd.Scalar() >> fd.Function(lambda x: 2 * x))
    data = [float(i) for i in range(7)]
    labels = [10 * i for i in range(7)]
    seen = []
    for workers in (0, 1):
        for batch in compiler.batches(data, 3, shuffle=True, seed=4, num_workers=workers):
            out = compiler.apply({}, batch).outputs
            paired = [labels[i] for i in batch.example_indices]
            np.testing.assert_allclose(out, [label / 5 for label in paired])
            seen.extend(batch.example_indices.tolist())
    assert sorted(seen) == sorted(list(range(7)) * 2)
    recorded = compiler.record(data)
    assert compiler.build_batch(recorded[[5, 2]]).example_indices.tolist() == [5, 2]
    assert compiler.build_batch(data[:3]).example_indices.tolist() == [0, 1, 2]


def test_a_compiler_shows_its_model():
    compiler = fd.Compiler.create(fd.Map(fd.Vector(2) >> fd.FC(3, name="dense") >> fd.Metric("m")) >> fd.Void())
    assert repr(compiler) == ("Compiler(root=Pipe: PyObjectType() -> VoidType(), 1 operations, layers=['dense'], "
                              "metrics=['m'], chunk_size=(32, 128, 512), backward='auto')")


def test_summary_lists_layers_operations_metrics_and_types():
    model = fd.Map(fd.Vector(4) >> fd.FC(3, name="dense") >> fd.Dropout(0.5, name="drop")
                   >> fd.Metric("m")) >> fd.Void()
    text = fd.Compiler.create(model).summary()
    assert "layers (15 parameters):" in text
    assert "  dense  FC       takes TensorType((4,), 'float32')  b (3,), w (4, 3)  15" in text
    assert "  drop   Dropout  takes TensorType((3,), 'float32')  no parameters" in text
    assert "metrics: m TensorType((3,), 'float32')" in text
    assert text.splitlines()[0] == "root Pipe: PyObjectType() -> VoidType()"


@pytest.mark.parametrize("key", [0, None, "a", jnp.array([0, 1])])
def test_init_needs_a_prng_key(key):
    """``init(0)`` once failed inside JAX ("JAX encountered invalid PRNG key data: expected key_data
    to have ndim, shape, and dtype attributes")."""
    compiler = fd.Compiler.create(fd.Vector(2) >> fd.FC(3))
    with pytest.raises(TypeError, match=r"^init needs a PRNG key such as jax.random.key\(0\), got "):
        compiler.init(key)
    # Typed and raw (legacy) keys give the same parameters.
    new, legacy = compiler.init(jax.random.key(5)), compiler.init(jax.random.PRNGKey(5))
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree_util.tree_leaves(new), jax.tree_util.tree_leaves(legacy)))


def test_recording_recorded_examples_gives_them_back():
    """``record`` of a recording once walked its arrays as examples and failed deep in NumPy."""
    a, b = fd.Compiler.create(fd.Vector(2)), fd.Compiler.create(fd.Vector(2))
    recorded = a.record([[1.0, 2.0], [3.0, 4.0]])
    assert a.record(recorded) is recorded
    with pytest.raises(ValueError, match="recorded by another compiler"):
        b.record(recorded)


def test_apply_runs_eagerly_under_disable_jit():
    """Under ``jax.disable_jit()`` apply called its jitted copy, which (not jitted) called apply
    again: a RecursionError. It now runs eagerly, with the jitted run's values and gradients."""
    c = fd.Compiler.create(fd.Vector(2) >> fd.FC(3, name="d"))  # depth 1 only: no loop to run eagerly
    params = c.init(jax.random.key(0))
    batch = c.build_batch([[1.0, 2.0], [0.5, -1.0]])

    def loss(p):
        return c.apply(p, batch).outputs.sum()

    with jax.disable_jit():
        eager = jax.value_and_grad(loss)(params)
    jitted = jax.value_and_grad(loss)(params)
    for a, b in zip(jax.tree.leaves(eager), jax.tree.leaves(jitted)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6)
    w, b = np.asarray(params["d"]["w"]), np.asarray(params["d"]["b"])
    x = np.array([[1.0, 2.0], [0.5, -1.0]])
    np.testing.assert_allclose(float(eager[0]), float(np.maximum(x @ w + b, 0).sum()), rtol=1e-6)


def test_copying_a_compiler_says_how_to_make_another():
    """``copy.deepcopy(compiler)`` failed with "cannot pickle '_thread.lock' object"."""
    import copy

    block = fd.Map(fd.Scalar() >> fd.Function(lambda x: 2.0 * x)) >> fd.Sum()
    compiler = fd.Compiler.create(block)
    for how in (copy.copy, copy.deepcopy):
        with pytest.raises(TypeError, match=r"make another with fd.Compiler.create\(block\)"):
            how(compiler)
    other = fd.Compiler.create(copy.deepcopy(fd.Map(fd.Scalar() >> fd.Function(lambda x: 2.0 * x)) >> fd.Sum()))
    assert float(other.apply({}, other.build_batch([[1.0, 2.0]])).outputs[0]) == 6.0

