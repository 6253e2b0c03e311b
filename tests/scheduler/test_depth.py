"""``max_depth`` follows Fold's numbers; deep inputs build without recursion."""

from __future__ import annotations

import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fold as fd


@pytest.mark.parametrize("block, example, depth", [
    (fd.Map(fd.Scalar() >> fd.Function(jnp.abs)), [1, -2, 3], 1),
    (fd.Map(fd.Scalar()) >> fd.Fold(fd.Function(jnp.add), fd.FromTensor(np.float32(0))), [1, 2, 3, 4], 4),
    (fd.Map(fd.Scalar()) >> fd.Reduce(fd.Function(jnp.add)), list(range(7)), 3),
    (fd.Map(fd.Scalar()) >> fd.Reduce(fd.Function(jnp.add)), list(range(8)), 3),
    (fd.Map(fd.Scalar()) >> fd.Reduce(fd.Function(jnp.add)), list(range(9)), 4),
    (fd.Map(fd.Scalar()) >> fd.Sum(), [1.0], 0),
    (fd.Map(fd.Scalar()) >> fd.Mean(), [1, 2, 3, 4], 3),
    (fd.Scalar(), 1.0, 0),
    (fd.Map(fd.Scalar()) >> fd.Length(), [1, 2], 0),
    (fd.Scalar() >> fd.Metric("m"), 1.0, 1),
])
def test_fold_depths(block, example, depth):
    assert block.max_depth(example) == depth


def test_concat_of_vectors_is_one_level():
    assert ((fd.Vector(2), fd.Vector(1)) >> fd.Concat()).max_depth(([1, 2], [3])) == 1


def test_reduce_depth_is_ceil_log2():
    block = fd.Map(fd.Scalar()) >> fd.Reduce(fd.Function(jnp.add))
    for n in range(1, 40):
        assert block.max_depth(list(range(n))) == int(np.ceil(np.log2(n)))


def test_reduce_uses_halving_rule():
    # Non-associative combine: g(a, b) = 2a + b shows the tree's shape.
    block = fd.Map(fd.Scalar()) >> fd.Reduce(fd.Function(lambda a, b: 2 * a + b))
    xs = [1.0, 2.0, 3.0, 4.0, 5.0]

    def ref(v):
        if len(v) == 1:
            return v[0]
        h = len(v) // 2
        return 2 * ref(v[:h]) + ref(v[h:])

    assert float(block.eval(xs)) == ref(xs)


def _deep_tree(depth: int):
    tree = 1.0
    for _ in range(depth):
        tree = (tree, 1.0)
    return tree


def test_ten_thousand_deep_tree_and_sequence_build_without_recursion():
    limit = sys.getrecursionlimit()
    decl = fd.ForwardDeclaration(fd.PyObjectType(), fd.TensorType(()))
    pair = fd.Record((decl(), decl())) >> fd.Function(jnp.add)
    decl.resolve_to(fd.OneOf(lambda t: isinstance(t, tuple), {False: fd.Scalar(), True: pair}))
    tree_model = decl()
    compiler = fd.Compiler.create(tree_model)
    tree = _deep_tree(10_000)
    assert tree_model.max_depth(tree) == 10_000
    batch = compiler.build_batch([tree, (2.0, 3.0)])
    out = compiler.apply({}, batch).outputs
    np.testing.assert_allclose(np.asarray(out), [10_001.0, 5.0])

    seq_model = fd.Map(fd.Scalar()) >> fd.Fold(fd.Function(jnp.add), fd.Zeros(fd.TensorType(())))
    seq_compiler = fd.Compiler.create(seq_model)
    out = seq_compiler.apply({}, seq_compiler.build_batch([[1.0] * 10_000, [2.0]])).outputs
    np.testing.assert_allclose(np.asarray(out), [10_000.0, 2.0])
    assert sys.getrecursionlimit() == limit


def test_deep_tree_gradient():
    decl = fd.ForwardDeclaration(fd.PyObjectType(), fd.TensorType((2,)))
    fc = fd.FC(2, activation=jnp.tanh)
    leaf = fd.Vector(2)
    pair = fd.Record((decl(), decl())) >> fd.Concat() >> fd.Function(fc)
    decl.resolve_to(fd.OneOf(lambda t: isinstance(t, tuple), {False: leaf, True: pair}))
    compiler = fd.Compiler.create(decl())
    params = compiler.init(jax.random.key(0))
    tree = [0.1, 0.2]
    for _ in range(300):
        tree = (tree, [0.3, -0.1])
    batch = compiler.build_batch([tree])
    grads = jax.jit(jax.grad(lambda p, b: jnp.sum(compiler.apply(p, b).outputs)))(params, batch)
    assert all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree_util.tree_leaves(grads))
