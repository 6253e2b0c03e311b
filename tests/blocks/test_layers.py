"""Layers: FC, Embedding, cells against NumPy, naming, sharing, custom layers."""

from __future__ import annotations

import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fold as fd
from fold.blocks.layers import snake_case
from tests.models import sigmoid


def test_fc_matches_numpy_and_accepts_tuples():
    fc = fd.FC(3, activation=jnp.tanh, name="fc")
    block = (fd.Vector(2), fd.Vector(1)) >> fd.Function(fc)
    compiler = fd.Compiler.create(block)
    params = compiler.init(jax.random.key(0))
    assert params["fc"]["w"].shape == (3, 3) and not np.any(np.asarray(params["fc"]["b"]))
    x = np.array([1.0, -2.0, 0.5])
    out = block.eval(([1.0, -2.0], [0.5]), params)
    np.testing.assert_allclose(out, np.tanh(x @ np.asarray(params["fc"]["w"])), rtol=1e-5)
    with pytest.raises(TypeError, match="FC"):
        fd.Scalar() >> fd.FC(2)


def test_embedding_modulo_and_initializer():
    table = np.arange(12, dtype=np.float32).reshape(6, 2)
    block = fd.Scalar("int32") >> fd.Embedding(6, 2, initializer=table)
    np.testing.assert_array_equal(block.eval(-5), table[1])
    np.testing.assert_array_equal(block.eval(8), table[2])
    with pytest.raises(ValueError, match="shape"):
        fd.Embedding(6, 3, initializer=table)
    with pytest.raises(TypeError, match="integer"):
        fd.Scalar() >> fd.Embedding(6, 2)


def test_lstm_cell_matches_numpy():
    cell = fd.LSTMCell(3, forget_bias=0.5, name="lstm_cell")
    block = (fd.Vector(2), (fd.Vector(3), fd.Vector(3))) >> fd.Function(cell)
    compiler = fd.Compiler.create(block >> fd.GetItem(0))
    params = compiler.init(jax.random.key(2))
    w, b = np.asarray(params["lstm_cell"]["w"]), np.asarray(params["lstm_cell"]["b"])
    x, c, h = np.array([0.1, -0.3]), np.array([0.5, 0.2, -0.1]), np.array([0.3, 0.0, 0.9])
    out, (c2, h2) = block.eval((x, (c, h)), params)
    i, f, g, o = np.split(np.concatenate([x, h]) @ w + b, 4)
    c_ref = sigmoid(f + 0.5) * c + sigmoid(i) * np.tanh(g)
    h_ref = sigmoid(o) * np.tanh(c_ref)
    np.testing.assert_allclose(c2, c_ref, rtol=1e-5)
    np.testing.assert_allclose(h2, h_ref, rtol=1e-5)
    np.testing.assert_allclose(out, h_ref, rtol=1e-5)


def test_lstm_cell_loads_pytorch_weights_as_its_docstring_says():
    """PyTorch's nn.LSTM equations, in NumPy, on weights laid out as PyTorch keeps them."""
    rng = np.random.default_rng(0)
    X, H = 2, 3
    weight_ih, weight_hh = rng.normal(size=(4 * H, X)), rng.normal(size=(4 * H, H))
    bias_ih, bias_hh = rng.normal(size=4 * H), rng.normal(size=4 * H)
    cell = fd.LSTMCell(H, forget_bias=0.0, name="lstm")
    block = (fd.Vector(X), (fd.Vector(H), fd.Vector(H))) >> cell
    params = {"lstm": {"w": jnp.asarray(np.concatenate([weight_ih.T, weight_hh.T]), jnp.float32),
                       "b": jnp.asarray(bias_ih + bias_hh, jnp.float32)}}
    x, c, h = rng.normal(size=X), rng.normal(size=H), rng.normal(size=H)
    _, (c2, h2) = block.eval((x, (c, h)), params)
    i, f, g, o = np.split(weight_ih @ x + bias_ih + weight_hh @ h + bias_hh, 4)
    c_ref = sigmoid(f) * c + sigmoid(i) * np.tanh(g)
    np.testing.assert_allclose(c2, c_ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(h2, sigmoid(o) * np.tanh(c_ref), rtol=1e-5, atol=1e-6)


def test_gru_cell_computes_its_documented_equations():
    cell = fd.GRUCell(3, name="gru")
    block = (fd.Vector(2), fd.Vector(3)) >> cell
    params = fd.Compiler.create(block >> fd.GetItem(0)).init(jax.random.key(1))
    p = {k: np.asarray(v, np.float64) + 0.1 for k, v in params["gru"].items()}  # nonzero biases too
    x, h = np.array([0.4, -0.2]), np.array([0.1, 0.5, -0.3])
    out, h2 = block.eval((x, h), {"gru": {k: jnp.asarray(v, jnp.float32) for k, v in p.items()}})
    r, z = np.split(sigmoid(np.concatenate([x, h]) @ p["w_gates"] + p["b_gates"]), 2)
    want = z * h + (1 - z) * np.tanh(np.concatenate([x, r * h]) @ p["w_cand"] + p["b_cand"])
    np.testing.assert_allclose(h2, want, rtol=1e-5)
    np.testing.assert_allclose(out, want, rtol=1e-5)


def test_fc_without_bias_matches_numpy_and_has_no_bias_parameter():
    fc = fd.FC(2, activation=jnp.tanh, use_bias=False, name="nobias")
    compiler = fd.Compiler.create(fd.Vector(3) >> fc)
    params = compiler.init(jax.random.key(0))
    assert sorted(params["nobias"]) == ["w"]
    x = np.array([[1.0, -2.0, 0.5], [0.0, 1.0, 2.0]])
    out = compiler.apply(params, compiler.build_batch(x.tolist())).outputs
    np.testing.assert_allclose(out, np.tanh(x @ np.asarray(params["nobias"]["w"])), rtol=1e-5)
    grads = jax.grad(lambda p: compiler.apply(p, compiler.build_batch(x.tolist())).outputs.sum())(params)
    assert sorted(grads["nobias"]) == ["w"]
    with pytest.raises(ValueError, match="use_bias=False: it has no bias"):
        fc.bias(params)
    with pytest.raises(TypeError, match="use_bias must be True or False"):
        fd.FC(2, use_bias="no")


def test_gru_and_tree_lstm_state_types():
    assert fd.GRUCell(4).state_type == fd.TensorType((4,))
    h = fd.TensorType((4,))
    assert fd.BinaryTreeLSTMCell(4).state_type == fd.TupleType(h, h)
    with pytest.raises(TypeError):
        (fd.Vector(2), fd.Vector(5)) >> fd.GRUCell(4)


def test_default_names_exist_at_construction_and_differ():
    fc1, fc2 = fd.FC(2), fd.FC(2)
    assert fc1.name != fc2.name and fc1.name.startswith("fc") and fc2.name.startswith("fc")  # as in Fold
    assert fc1.has_default_name and not fd.FC(2, name="enc").has_default_name
    compiler = fd.Compiler.create(fd.Vector(2) >> fc1 >> fc2)
    assert sorted(compiler.init(jax.random.key(0))) == sorted([fc1.name, fc2.name])
    assert snake_case("BinaryTreeLSTMCell") == "binary_tree_lstm_cell"
    assert snake_case("GRUCell") == "gru_cell" and snake_case("MyLayer") == "my_layer"


def test_initial_values_do_not_depend_on_the_layers_made_before():
    def model() -> fd.Compiler:
        return fd.Compiler.create(fd.Vector(2) >> fd.FC(3) >> fd.FC(1, name="out"))

    first = model()
    fd.FC(5), fd.Embedding(3, 2)  # shift the default numbers
    second = model()
    assert sorted(first.program.layer_seeds.values()) == sorted(second.program.layer_seeds.values()) == ["fc", "out"]
    a, b = first.init(jax.random.key(0)), second.init(jax.random.key(0))
    assert a.keys() != b.keys()  # the default name differs ...
    in_model_order = [sorted(p, key=c.program.layer_seeds.__getitem__) for p, c in ((a, first), (b, second))]
    for name_a, name_b in zip(*in_model_order):
        for x, y in zip(jax.tree_util.tree_leaves(a[name_a]), jax.tree_util.tree_leaves(b[name_b])):
            np.testing.assert_array_equal(x, y)  # ... the values do not


FRESH_PROCESS_NAMES = """
import fold as fd
a, b, c = fd.FC(2), fd.FC(2, name="fc_2"), fd.Embedding(3, 2)
inner, later = fd.FC(3), fd.FC(1)
sub = fd.Vector(2) >> inner
fd.Compiler.create(sub)  # compiling a sub-model first renames nothing
fd.Compiler.create(fd.Record((sub, fd.Vector(2) >> a >> later)))
print(a.name, b.name, c.name, inner.name, later.name)
"""


def test_default_names_are_the_same_in_every_fresh_process():
    runs = [subprocess.run([sys.executable, "-c", FRESH_PROCESS_NAMES], capture_output=True, text=True, check=True,
                           timeout=120).stdout.split() for _ in range(2)]
    # In order of construction, per class; a name passed explicitly (fc_2) is skipped.
    assert runs[0] == runs[1] == ["fc", "fc_2", "embedding", "fc_1", "fc_3"]


def test_explicit_names_and_duplicates():
    block = fd.Vector(2) >> fd.FC(2, name="enc") >> fd.FC(2, name="enc")
    with pytest.raises(ValueError, match="named 'enc'"):
        fd.Compiler.create(block)


def test_shared_layer_shares_params_across_roots():
    shared = fd.FC(2, name="fc")
    a = fd.Vector(2) >> shared
    b = fd.Record((fd.Vector(3) >> fd.FC(2, name="other"), fd.Vector(2) >> shared)) >> fd.GetItem(1)
    params = fd.Compiler.create(b).init(jax.random.key(0))
    compiler_a = fd.Compiler.create(a)
    out_a = compiler_a.apply(params, compiler_a.build_batch([[1.0, 2.0]])).outputs
    out_b = b.eval(([0, 0, 0], [1.0, 2.0]), params)
    np.testing.assert_allclose(np.asarray(out_a)[0], out_b)
    assert sorted(params) == ["fc", "other"]


def test_a_layer_reads_in_a_composition_as_it_pipes():
    # It raised AttributeError: 'FC' object has no attribute 'reads'.
    fc = fd.FC(2, activation=jnp.tanh, name="fc")
    c = fd.Composition()
    with c.scope():
        x, y = fd.Vector(2).reads(c.input[0]), fd.Vector(2).reads(c.input[1])
        c.output.reads(fd.Function(jnp.add).reads(fc.reads(x), fc.reads(y)))
    compiler = fd.Compiler.create(c)
    params = compiler.init(jax.random.key(0))
    assert sorted(params) == ["fc"]  # both uses share the layer's parameters
    w = np.asarray(params["fc"]["w"])
    out = compiler.apply(params, compiler.build_batch([([1.0, 2.0], [0.5, -1.0])])).outputs
    expected = np.tanh(np.array([1.0, 2.0]) @ w) + np.tanh(np.array([0.5, -1.0]) @ w)
    np.testing.assert_allclose(np.asarray(out)[0], expected, rtol=1e-5)


def test_custom_layer():
    class Scale(fd.Layer):
        def __init__(self, name=None):
            super().__init__(name=name)

        def init(self, key, input_type):
            return {"s": 2.0 * jnp.ones(input_type.shape, input_type.dtype)}

        def apply(self, params, x):
            return params["s"] * x

    block = fd.Vector(2) >> Scale()
    compiler = fd.Compiler.create(block)
    params = compiler.init(jax.random.key(0))
    assert list(params) == ["scale"]
    np.testing.assert_array_equal(block.eval([1, 2], params), [2, 4])


def test_layer_with_two_input_types_is_type_error():
    fc = fd.FC(2)
    block = (fd.Vector(2) >> fc, fd.Vector(3) >> fc) >> fd.Concat()
    with pytest.raises(TypeError, match="input types"):
        fd.Compiler.create(block)


def test_an_init_that_returns_no_arrays_is_named():
    """The error named only JAX's internal lambda ("function <lambda> at tensors.py traced for jit
    returned a value of type str"), not the layer's init."""

    class Labels(fd.Layer):
        def init(self, key, input_type):
            return {"w": "ones"}

        def apply(self, params, x):
            return x

    with pytest.raises(TypeError, match=r"Labels.init\(key, TensorType\(\(\), 'float32'\)\) returned str 'ones' at "
                                        r"params\['w'\]: a layer's parameters are arrays"):
        fd.Scalar() >> Labels()


def test_wrong_params_shape_is_a_clear_error():
    block = fd.Vector(2) >> fd.FC(2, name="fc")
    compiler = fd.Compiler.create(block)
    assert compiler.init(jax.random.key(0))["fc"]["w"].shape == (2, 2)
    bad = {"fc": {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}}
    with pytest.raises(TypeError, match="compiler.init"):
        compiler.apply(bad, compiler.build_batch([[1, 2]]))
    with pytest.raises(KeyError, match="fc"):
        compiler.apply({}, compiler.build_batch([[1, 2]]))


def test_check_constant_inputs_sees_every_constant_call_at_once_and_errors_name_the_example():
    seen = []

    class Positive(fd.Layer):
        def init(self, key, input_type):
            return {}

        def apply(self, params, a, b):
            return a + b

        def check_constant_inputs(self, a, b):
            seen.append((a.copy(), b.copy()))
            if (a <= 0).any():
                raise ValueError(f"not positive: {a[a <= 0][0]}")

    layer = Positive()
    # Calls with two constants are checked; the call with a computed input is not.
    block = fd.Map(fd.Record((fd.Scalar(), fd.Scalar())) >> fd.Function(layer)) >> fd.Fold(
        fd.Function(layer), fd.FromTensor(np.float32(1.0)))
    compiler = fd.Compiler.create(block)
    batch = compiler.build_batch([[(1.0, 2.0), (3.0, 4.0)], [(5.0, 6.0)]])
    assert len(seen) == 1
    a, b = seen[0]
    assert sorted(zip(a.tolist(), b.tolist())) == [(1.0, 2.0), (3.0, 4.0), (5.0, 6.0)]
    np.testing.assert_allclose(compiler.apply(compiler.init(jax.random.key(0)), batch).outputs, [11.0, 12.0])
    with pytest.raises(ValueError, match=r"example 2: at .*Positive.*not positive: -1"):
        compiler.build_batch([[(1.0, 2.0)], [(3.0, 4.0)], [(5.0, 6.0), (-1.0, 0.0)]])


def _ones(key, shape, dtype):
    return jnp.ones(shape, dtype)


def test_fc_keep_probs_drop_out_only_with_a_key():
    """Fold's input_keep_prob and output_keep_prob: inverted dropout before and after the layer."""
    wide_in = fd.Compiler.create(fd.Vector(1000) >> fd.FC(1, activation=None, initializer=_ones, input_keep_prob=0.5))
    params = wide_in.init(jax.random.key(0))
    batch = wide_in.build_batch([[1.0] * 1000])
    assert float(wide_in.apply(params, batch).outputs[0, 0]) == 1000.0  # no key: deterministic
    dropped = float(wide_in.apply(params, batch, key=jax.random.key(1)).outputs[0, 0])
    assert dropped != 1000.0 and abs(dropped - 1000.0) < 200.0 and dropped % 2 == 0  # kept inputs count twice
    wide_out = fd.Compiler.create(fd.Vector(1) >> fd.FC(1000, activation=None, initializer=_ones,
                                                        output_keep_prob=0.25))
    out = wide_out.apply(wide_out.init(jax.random.key(0)), wide_out.build_batch([[1.0]]), key=jax.random.key(2))
    values = np.asarray(out.outputs)
    assert set(np.unique(values).tolist()) == {0.0, 4.0} and 150 < (values > 0).sum() < 350
    for bad in (0.0, 1.5, -0.1):
        with pytest.raises(ValueError, match="input_keep_prob in \\(0, 1\\]"):
            fd.FC(2, input_keep_prob=bad)
    assert not fd.FC(2, input_keep_prob=1.0, output_keep_prob=None).stochastic


def test_fc_normalization_runs_between_the_affine_map_and_the_activation():
    def layer_norm(y):
        return (y - y.mean(-1, keepdims=True)) / jnp.sqrt(y.var(-1, keepdims=True) + 1e-6)

    fc = fd.FC(4, activation=jnp.tanh, normalization_fn=layer_norm, name="dense")
    compiler = fd.Compiler.create(fd.Vector(3) >> fc)
    params = compiler.init(jax.random.key(0))
    x = np.asarray([[1.0, 2.0, -1.0], [0.5, 0.0, 3.0]], np.float32)
    y = x @ np.asarray(fc.weights(params)) + np.asarray(fc.bias(params))
    y = (y - y.mean(-1, keepdims=True)) / np.sqrt(y.var(-1, keepdims=True) + 1e-6)
    np.testing.assert_allclose(compiler.apply(params, compiler.build_batch(x.tolist())).outputs, np.tanh(y),
                               rtol=1e-5, atol=1e-6)
    assert fc.output_size == 4 and fc.weights(params).shape == (3, 4)
    with pytest.raises(KeyError, match="params has no entry 'fc.*' for this FC"):
        fd.FC(2).weights(params)
    with pytest.raises(TypeError, match="normalization_fn must be callable"):
        fd.FC(2, normalization_fn=3)


def test_fc_activation_by_name():
    """A jax.nn name is the same function (and shows as a name in help(fd.FC), not an object address)."""
    assert fd.FC(2).activation is jax.nn.relu and fd.FC(2, activation="tanh").activation is jax.nn.tanh
    assert fd.FC(2, activation=None).activation is None
    with pytest.raises(ValueError, match="jax.nn has no activation 'nope'"):
        fd.FC(2, activation="nope")
    with pytest.raises(TypeError, match="activation must be a callable, a jax.nn name or None"):
        fd.FC(2, activation=3)
    import inspect
    assert inspect.signature(fd.FC).parameters["activation"].default == "relu"


@pytest.mark.parametrize(("make", "message"), [
    (lambda: fd.FC(2.5), "FC's num_units_out must be an int, got 2.5"),
    (lambda: fd.FC(True), "FC's num_units_out must be an int, got True"),
    (lambda: fd.GRUCell(2.5), "GRUCell's num_units must be an int, got 2.5"),
    (lambda: fd.LSTMCell(3.7), "LSTMCell's num_units must be an int, got 3.7"),
    (lambda: fd.BinaryTreeLSTMCell(4.0), "BinaryTreeLSTMCell's num_units must be an int, got 4.0"),
    (lambda: fd.Embedding(10.9, 2), "Embedding's num_buckets must be an int, got 10.9"),
    (lambda: fd.Embedding(10, 2.5), "Embedding's num_units_out must be an int, got 2.5"),
    (lambda: fd.OneHot(0, 3.5), "OneHot's stop must be an int, got 3.5"),
    (lambda: fd.OneHot(2.0), "OneHot's stop must be an int, got 2.0"),
    (lambda: fd.NGrams(2.5), "NGrams's n must be an int, got 2.5"),
    (lambda: fd.Concat(1.5), "Concat's concat_dim must be an int, got 1.5"),
])
def test_a_size_that_is_not_an_int_is_refused_not_truncated(make, message):
    """``FC(2.5)`` made a 2-unit layer without a word; a size must be an int (Python or NumPy)."""
    with pytest.raises(TypeError, match=re.escape(message)):
        make()


def test_numpy_ints_are_sizes():
    assert fd.FC(np.int64(3)).num_units_out == 3 and fd.LSTMCell(np.int32(2)).num_units == 2
    assert fd.Embedding(np.int64(5), np.int16(2)).num_buckets == 5 and fd.OneHot(np.int64(3)).stop == 3


def test_a_compiled_layers_attributes_are_fixed():
    """``fc.activation = jnp.tanh`` after a first apply gave two answers for one example: layouts
    compiled before kept ReLU, later ones took tanh."""
    fc = fd.FC(2, name="dense")
    fc.activation = jnp.tanh  # before compiling: the model is still being written
    compiler = fd.Compiler.create(fd.Vector(2) >> fc)
    params = compiler.init(jax.random.key(0))
    with pytest.raises(AttributeError, match=r"FC\(2, name='dense'\) is part of a compiled model, so its"):
        fc.activation = jax.nn.relu
    x = np.array([[0.5, -2.0]], np.float32)
    w, b = np.asarray(params["dense"]["w"]), np.asarray(params["dense"]["b"])
    np.testing.assert_allclose(np.asarray(compiler.apply(params, compiler.build_batch(list(x))).outputs),
                               np.tanh(x @ w + b), rtol=1e-6)

    class Scale(fd.Layer):
        def __init__(self):
            super().__init__(name="scale")
            self.factor = 2.0

        def init(self, key, input_type):
            return {}

        def apply(self, params, x):
            self._calls = getattr(self, "_calls", 0) + 1  # private state stays writable
            return self.factor * x

    scale = Scale()
    fd.Compiler.create(fd.Vector(2) >> scale)
    with pytest.raises(AttributeError, match=r"Scale\(name='scale'\) is part of a compiled model"):
        scale.factor = 3.0


def test_a_layer_shows_its_sizes_and_given_name():
    """``repr(fd.FC(3))`` was just ``FC``."""
    assert [repr(x) for x in (fd.FC(3), fd.FC(3, name="d"), fd.Embedding(10, 4), fd.Dropout(0.5),
                              fd.LSTMCell(8, name="c"), fd.GRUCell(2), fd.BinaryTreeLSTMCell(5))] == [
        "FC(3)", "FC(3, name='d')", "Embedding(10, 4)", "Dropout(0.5)", "LSTMCell(8, name='c')", "GRUCell(2)",
        "BinaryTreeLSTMCell(5)"]
