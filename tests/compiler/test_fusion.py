"""Runs of operations in a pipe fused into one: fewer nodes and depths, the same numbers."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fold as fd


def _two_ways(make, examples):
    """Outputs, gradients, ops and batch stats of ``make()`` compiled with and without fusion."""
    out = {}
    for fuse in (True, False):
        compiler = fd.Compiler.create(make(), fuse=fuse)
        params = compiler.init(jax.random.key(0))
        batch = compiler.build_batch(examples)
        grads = jax.jit(jax.grad(lambda p: jnp.sum(jnp.sin(compiler.apply(p, batch).outputs))))(params)
        # Each make() makes new layers, with new names: compare them by their place in the model.
        grads = {compiler.program.layer_seeds[name]: g for name, g in grads.items()}
        labels = [op.spec.label for op in compiler.program.ops]
        out[fuse] = (compiler.apply(params, batch).outputs, grads, labels, batch.stats)
    for a, b in zip(jax.tree_util.tree_leaves(out[True][:2]), jax.tree_util.tree_leaves(out[False][:2])):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    return out[True], out[False]


def test_a_fold_cell_runs_as_one_operation_per_step():
    def make():
        cell = fd.Concat() >> fd.FC(6, activation=jnp.tanh)
        return fd.Map(fd.Vector(2)) >> fd.Fold(cell, fd.Zeros(fd.TensorType((6,))))

    rng = np.random.default_rng(0)
    examples = [rng.normal(size=(n, 2)).tolist() for n in (1, 4, 9)]
    fused, plain = _two_ways(make, examples)
    assert fused[2] == ["Concat >> Function(FC)"] and plain[2] == ["Concat", "Function(FC)"]
    assert fused[3].num_nodes == plain[3].num_nodes // 2 == 14
    assert fused[3].max_depth == 9 and plain[3].max_depth == 18


def test_runs_span_nested_pipes_and_hold_one_layer_each():
    def make():
        head = fd.Scalar() >> fd.Function(lambda x: jnp.stack([x, x * x / 2], -1)) >> fd.FC(3)
        return fd.Map(head >> fd.FC(2) >> fd.Function(jnp.tanh)) >> fd.Sum()

    fused, plain = _two_ways(make, [[1.0, 2.0], [0.5], [3.0, -1.0, 2.0]])
    assert fused[2][:2] == ["Function(<lambda>) >> Function(FC)", "Function(FC) >> Function(tanh)"]
    assert len(plain[2]) == len(fused[2]) + 2


def test_a_layer_used_fused_and_alone_keeps_one_parameter_set():
    fc = fd.FC(3, name="fc")

    def make():
        return fd.Record((fd.Vector(2) >> fc, (fd.Record((fd.Vector(1), fd.Vector(1))) >> fd.Concat() >> fc))) \
            >> fd.Concat()

    compiler = fd.Compiler.create(make())
    assert sorted(compiler.init(jax.random.key(0))) == ["fc"]
    _two_ways(make, [([1.0, 2.0], ([3.0], [4.0])), ([0.0, 1.0], ([1.0], [-1.0]))])


def test_a_layer_first_in_a_run_checks_its_constants_and_a_later_one_does_not():
    first = fd.Scalar("int32") >> fd.Embedding(4, 2, mod_inputs=False) >> fd.Function(jnp.tanh)
    with pytest.raises(ValueError, match=r"id 9 is outside \[0, 4\)"):
        fd.Compiler.create(first).build_batch([1, 9])
    # The embedding reads ids the function computed, not the constants: 9 // 3 = 3 is in range.
    embedding = fd.Embedding(4, 2, mod_inputs=False, name="embedding")
    later = fd.Scalar("int32") >> fd.Function(lambda i: i // 3) >> embedding
    compiler = fd.Compiler.create(later)
    params = compiler.init(jax.random.key(0))
    np.testing.assert_allclose(compiler.apply(params, compiler.build_batch([1, 9])).outputs,
                               params["embedding"]["table"][np.array([0, 3])])


def test_eval_and_max_depth_count_every_operation_as_fold_does():
    block = fd.Scalar() >> fd.Function(jnp.sin) >> fd.Function(jnp.cos)
    assert block.max_depth(1.0) == 2
    np.testing.assert_allclose(block.eval(1.0), np.cos(np.sin(1.0)), rtol=1e-6)


@pytest.mark.parametrize("bad", [1, "yes", None])
def test_fuse_is_validated(bad):
    with pytest.raises(TypeError, match="fuse must be True or False"):
        fd.Compiler.create(fd.Scalar() >> fd.Function(jnp.sin), fuse=bad)
