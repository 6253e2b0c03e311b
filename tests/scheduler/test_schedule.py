"""Schedule layout invariants: every node has one row, groups are contiguous, items are chunked."""

from __future__ import annotations

import random

import jax
import jax.numpy as jnp
import numpy as np

import fold as fd
from fold.scheduler.builder import BatchBuilder
from fold.scheduler.schedule import schedule
from fold.scheduler.walk import walk
from tests.models import random_tree


def _tree_model():
    decl = fd.ForwardDeclaration(fd.PyObjectType(), fd.TensorType((2,)))
    pair = fd.Record((decl(), decl())) >> fd.Function(lambda a, b: (a + b, a - b)) >> fd.Concat() \
        >> fd.Function(lambda v: v[:, :2])
    decl.resolve_to(fd.OneOf(lambda t: isinstance(t, tuple), {False: fd.Scalar() >> fd.Function(
        lambda x: jnp.stack([x, -x], -1)), True: pair}))
    return decl()


def _build(compiler, examples, chunk):
    builder = BatchBuilder(compiler)
    roots = []
    for i, e in enumerate(examples):
        builder.example_index = i
        roots.append(walk(compiler.root, e, builder))
    return builder, schedule(builder, [roots], len(examples), chunk, keep_host=True)


def test_rows_are_unique_and_items_cover_every_loop_node_once():
    compiler = fd.Compiler.create(_tree_model(), chunk_size=8)
    rng = random.Random(1)
    examples = [random_tree(rng, rng.randint(1, 30), lambda r: r.random()) for _ in range(12)]
    builder, batch = _build(compiler, examples, 8)
    host, a = batch.host, batch.arrays
    A = batch.layout.size_class
    pairs = set(zip(host.v_type.tolist(), host.v_row.tolist()))
    assert len(pairs) == len(host.v_type), "two values share an arena row"
    assert int(host.v_row.max()) < A
    n_items = int(a["n_items"])
    counts = a["items_count"][:n_items]
    nodes = a["items_node"][:n_items]
    assert np.all((counts >= 1) & (counts <= 8))
    covered = np.concatenate([np.arange(s, s + c) for s, c in zip(nodes, counts)])
    n_loop = sum(1 for d in builder.n_depth if d >= 2)
    assert len(covered) == len(set(covered.tolist())) == n_loop
    assert a["in_idx"].shape[0] == A + 8 and a["items_out"].shape[0] == A
    # Items run in (depth, op) order: an item never reads a row written later.
    depth_sorted = sorted(builder.n_depth)
    item_depths = [depth_sorted[s] for s in nodes]
    assert item_depths == sorted(item_depths)


def test_size_class_is_a_power_of_two_above_the_rows():
    compiler = fd.Compiler.create(_tree_model())
    for n in (1, 5, 40):
        rng = random.Random(n)
        batch = compiler.build_batch([random_tree(rng, n, lambda r: r.random())])
        A = batch.layout.size_class
        assert A & (A - 1) == 0 and A >= 8
        assert batch.arrays["in_idx"].shape[0] == A + compiler.chunk


def test_batch_stats_count_nodes_items_depth_and_rows():
    compiler = fd.Compiler.create(fd.Map(fd.Scalar() >> fd.Function(lambda x: 2 * x)) >> fd.Sum())
    batch = compiler.build_batch([[1, 2, 3], [4]])
    # 4 doubles (depth 1, hoisted), then a balanced sum of 3: adds at depths 2 and 3.
    assert batch.stats == fd.BatchStats(num_nodes=6, num_items=2, max_depth=3, rows=4 + 4 + 2,
                                        type_rows=(4 + 4 + 2,))
    assert "nodes=6" in repr(batch)
    assert jax.tree_util.tree_unflatten(*reversed(jax.tree_util.tree_flatten(batch))).stats is None
