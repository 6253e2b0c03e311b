"""``Compiler.check_numerics`` names the example (and operation or parameters) that is not finite."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import fold as fd


def _pairs():
    compiler = fd.Compiler.create(fd.Map(fd.Vector(2) >> fd.FC(4)) >> fd.Sum() >> fd.FC(1, activation=None))
    return compiler, compiler.init(jax.random.key(0))


def test_a_nan_input_is_named_with_its_example():
    compiler, params = _pairs()
    examples = [[[1.0, 2.0]], [[3.0, 4.0], [1.0, 1.0]], [[1.0, float("nan")]], [[0.5, float("inf")]]]
    # Batched, the NaN poisons every gradient; check_numerics finds where it came from.
    batch = compiler.build_batch(examples)
    grads = jax.jit(jax.grad(lambda p: compiler.apply(p, batch).outputs[:2].sum()))(params)
    assert not all(bool(jnp.isfinite(g).all()) for g in jax.tree_util.tree_leaves(grads))
    with pytest.raises(FloatingPointError, match=r"^example 12 \(position 2\): an input value of type "
                                                 r"TensorType\(\(2,\), 'float32'\).*not finite: \[1.0, nan\]"):
        compiler.check_numerics(params, examples, dataset_indices=range(10, 14))


def test_an_operation_that_makes_nan_is_named():
    compiler = fd.Compiler.create(fd.Map(fd.Scalar() >> fd.Function(jnp.log) >> fd.Function(jnp.exp)) >> fd.Sum())
    with pytest.raises(FloatingPointError, match=r"^example 1: the output of Function\(log\) .*not finite: nan"):
        compiler.check_numerics({}, [[1.0, 2.0], [3.0, -1.0], [-2.0]])


def test_an_infinite_gradient_is_named_by_its_own_example():
    """sqrt(|FC(0)|) is finite but its gradient is not; batched, it poisons the other examples'
    gradients too, so each example's gradient is taken in a batch of its own."""
    model = fd.Map(fd.Scalar() >> fd.Function(lambda x: x[:, None]) >> fd.FC(1, activation=None, name="fc")
                   >> fd.Function(lambda y: jnp.sqrt(jnp.abs(y[:, 0])))) >> fd.Sum()
    compiler = fd.Compiler.create(model)
    params = compiler.init(jax.random.key(0))
    layouts = compiler.stats().layouts
    with pytest.raises(FloatingPointError, match=r"^example 2: the gradient of its loss is not finite in "
                                                 r"params\['fc'\]\['[bw]'\] \(its values are all finite\)"):
        compiler.check_numerics(params, [[1.0], [2.0, 3.0], [4.0, 0.0]])
    assert compiler.stats().layouts == layouts  # the compiler's own layouts are untouched


def test_finite_examples_pass_with_the_default_or_a_given_loss():
    compiler, params = _pairs()
    examples = [[[1.0, 2.0]], [[3.0, 4.0], [1.0, 1.0]]]
    assert compiler.check_numerics(params, examples) is None
    assert compiler.check_numerics(params, examples, loss=lambda r: (r.outputs[:, 0] - 1.0) ** 2) is None
    with pytest.raises(ValueError, match=r"loss must return one value per example.*got \(\)"):
        compiler.check_numerics(params, examples, loss=lambda r: r.outputs.sum())


def test_a_model_with_only_metrics_is_checked_through_them():
    root = fd.Map(fd.Scalar() >> fd.Function(lambda x: x[:, None]) >> fd.FC(2, activation=None)
                  >> fd.Function(lambda y: jnp.log(jnp.abs(y).sum(-1))) >> fd.Metric("loss")) >> fd.Void()
    compiler = fd.Compiler.create(root)
    params = compiler.init(jax.random.key(0))
    assert compiler.check_numerics(params, [[1.0, 2.0], [3.0]]) is None
    with pytest.raises(FloatingPointError, match=r"^example 1: the output of .* not finite: -inf"):
        compiler.check_numerics(params, [[1.0], [0.0]])


def test_bad_arguments():
    compiler, params = _pairs()
    with pytest.raises(ValueError, match="at least one example"):
        compiler.check_numerics(params, [])
    with pytest.raises(ValueError, match="dataset_indices has 1 entries for 2 examples"):
        compiler.check_numerics(params, [[[1.0, 2.0]], [[1.0, 2.0]]], dataset_indices=[3])
