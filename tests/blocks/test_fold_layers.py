"""TensorFlow Fold's layers_test.py, case by case, in this library's terms (written anew).

Skipped, with the reason: ``test_get_local_args``, ``test_create_variable_scope``,
``test_create_variable_scope2`` (TensorFlow variable scopes: layers here keep their parameters in
the params pytree), ``test_fc_linear_weight_norm`` (``FC`` has no ``weight_norm``),
``test_fractalnet_smoketest*`` (no ``FractalNet``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fold as fd


def _const(value: float):
    return lambda key, shape, dtype: jnp.full(shape, value, dtype)


def _run(layer: fd.Layer, leaf: fd.Block, examples: list, key=None) -> np.ndarray:
    compiler = fd.Compiler.create(leaf >> layer)
    out = compiler.apply(compiler.init(jax.random.key(0)), compiler.build_batch(examples), key=key).outputs
    return np.asarray(out)


def test_fc_linear():
    np.testing.assert_array_equal(_run(fd.FC(1, None, _const(2.0)), fd.Vector(2), [[0, 0], [1, 0], [1, 1]]),
                                  [[0], [2], [4]])


def test_fc_relu():
    np.testing.assert_array_equal(_run(fd.FC(2, initializer=_const(3.0)), fd.Vector(1), [[-1], [1]]),
                                  [[0, 0], [3, 3]])


def test_fc_normalization():
    fc = fd.FC(2, normalization_fn=lambda y: y / 2.0, initializer=_const(4.0))
    np.testing.assert_array_equal(_run(fc, fd.Vector(1), [[-1], [1]]), [[0, 0], [2, 2]])


def test_dropout():
    key = jax.random.key(123)
    np.testing.assert_array_equal(
        _run(fd.FC(1, None, _const(2.0), input_keep_prob=1.0, output_keep_prob=1.0), fd.Vector(1), [[1]], key), [[2]])
    # A keep probability of nearly 0 drops everything (the kept values would be scaled by 1e10).
    np.testing.assert_array_equal(_run(fd.FC(1, None, _const(2.0), input_keep_prob=1e-10), fd.Vector(1), [[1]], key),
                                  [[0]])
    np.testing.assert_array_equal(_run(fd.FC(1, None, _const(2.0), output_keep_prob=1e-10), fd.Vector(1), [[1]], key),
                                  [[0]])


def test_fc_raises():
    with pytest.raises(TypeError, match=r"FC\(1\) takes float vectors"), pytest.warns(UserWarning, match="holds int32"):
        fd.Scalar("int64") >> fd.Function(lambda x: x[:, None]) >> fd.FC(1)
    with pytest.raises(TypeError, match=r"FC\(\d+\) takes float vectors"):
        fd.Scalar() >> fd.FC(1)
    fc = fd.FC(1)
    fd.Compiler.create(fd.Vector(1) >> fc)
    with pytest.raises(TypeError, match="is used with input types"):
        fd.Compiler.create(fd.Record((fd.Vector(1) >> fc, fd.Vector(2) >> fc)) >> fd.Concat())


WEIGHTS = np.array([[1, 2], [3, 4]], dtype="float32")


@pytest.mark.parametrize("dtype, ids", [("int32", [0, 1, 7, -5]), ("int8", [0, 1, 7, -5]), ("uint8", [0, 1, 3])])
def test_embedding_takes_ids_modulo_its_size(dtype, ids):
    out = _run(fd.Embedding(2, 2, initializer=WEIGHTS), fd.Scalar(dtype), ids)
    np.testing.assert_array_equal(out, [WEIGHTS[i % 2] for i in ids])


def test_embedding_nomod():
    embedding = fd.Embedding(2, 2, initializer=WEIGHTS, mod_inputs=False)
    np.testing.assert_array_equal(_run(embedding, fd.Scalar("int32"), [0, 1]), WEIGHTS)
    with pytest.raises(ValueError, match="id 2 is outside"):
        _run(fd.Embedding(2, 2, initializer=WEIGHTS, mod_inputs=False), fd.Scalar("int32"), [2])


def test_embedding_initializer():
    out = _run(fd.Embedding(2, 2, initializer=_const(1.0)), fd.Scalar("int32"), [0, 1, 7])
    np.testing.assert_array_equal(out, np.ones((3, 2)))


def test_embedding_raises():
    with pytest.raises(ValueError, match="initializer has shape"):
        fd.Embedding(2, 2, np.zeros([3, 3]))
    with pytest.raises(TypeError):
        fd.Vector(2, "int32") >> fd.Embedding(2, 2)
    with pytest.raises(TypeError):
        fd.Scalar() >> fd.Embedding(2, 2)


def test_rshift():
    block = fd.FC(1, None, _const(2.0)) >> fd.FC(1, None, _const(3.0))
    assert (fd.Vector(1) >> block).eval([1.0]).tolist() == [6.0]


def test_rrshift():
    block = np.array([3.0], np.float32) >> fd.FC(1, None, _const(2.0))
    assert block.eval(None).tolist() == [6.0]
