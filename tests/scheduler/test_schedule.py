"""Schedule layout invariants: every node has one row, groups are contiguous, items are chunked."""

from __future__ import annotations

import random

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fold as fd
from fold.scheduler.builder import BatchBuilder
from fold.scheduler.schedule import (
    CHAIN_BATCH,
    FINE_ITEM,
    ITEM_OVERHEAD,
    SMALL_CHUNK,
    TINY_BATCH,
    TINY_SIZE_CLASS,
    _item_size,
    arena_rows_for,
    item_sizes,
    next_pow2,
    pick_chunk,
    schedule,
)
from fold.scheduler.walk import walk
from tests.models import enable_x64, make_rnn, random_tree


def _tree_model():
    decl = fd.ForwardDeclaration(fd.PyObjectType(), fd.TensorType((2,)))
    pair = fd.Record((decl(), decl())) >> fd.Function(lambda a, b: (a + b, a - b)) >> fd.Concat() \
        >> fd.Function(lambda v: v[:, :2])
    decl.resolve_to(fd.OneOf(lambda t: isinstance(t, tuple), {False: fd.Scalar() >> fd.Function(
        lambda x: jnp.stack([x, -x], -1)), True: pair}))
    return decl()


def _build(compiler, examples, chunk):
    builder = BatchBuilder(compiler.program)
    roots = []
    for i, e in enumerate(examples):
        builder.example_index = i
        roots.append(walk(compiler.program.root, e, builder))
    batch = schedule(compiler.program, builder.arrays(), [np.asarray(roots)], len(examples), (chunk,), keep_host=True)
    return builder, batch


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
    n_items = int(a.n_items)
    counts = a.items_count[:n_items]
    nodes = a.items_node[:n_items]
    assert np.all((counts >= 1) & (counts <= 8))
    covered = np.concatenate([np.arange(s, s + c) for s, c in zip(nodes, counts)])
    n_loop = sum(1 for d in builder.n_depth if d >= 2)
    assert len(covered) == len(set(covered.tolist())) == n_loop
    assert a.in_idx.shape[0] == A + 8 and a.items_out.shape[0] == A
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
        assert batch.arrays.in_idx.shape[0] == A + batch.layout.chunk
        # A is known before the rows are allocated (it bounds which C compete): it matches them.
        assert A == next_pow2(max(batch.stats.rows, batch.stats.num_nodes, 8))


def test_each_arena_has_its_own_types_rows_rounded_up():
    # Scalars (the leaves and 0.5) fill far fewer rows than the (2,) vectors of every node.
    decl = fd.ForwardDeclaration(fd.PyObjectType(), fd.TensorType((2,)))
    pair = fd.Record((decl(), decl())) >> fd.Function(lambda a, b: a + b)
    leaf = (fd.AllOf(fd.Scalar(), fd.Void() >> fd.FromTensor(np.float32(0.5)))
            >> fd.Function(lambda x, h: jnp.stack([x, h], -1)))
    decl.resolve_to(fd.OneOf(lambda t: isinstance(t, tuple), {False: leaf, True: pair}))
    compiler = fd.Compiler.create(decl(), chunk_size=8)
    rng = random.Random(3)
    examples = [random_tree(rng, 40, lambda r: r.random()) for _ in range(4)]
    batch = compiler.build_batch(examples, exact_layout=True)
    scalar, vector = (compiler.program.type_index[fd.TensorType(s)] for s in ((), (2,)))
    rows = batch.layout.arena_rows
    # Rows round up to a multiple of an eighth of the next power of two: 161 of 256 to 192.
    assert batch.stats.type_rows[scalar] == 4 * 40 + 1 and rows[scalar] == 192
    assert batch.stats.type_rows[vector] == 4 * 79 and rows[vector] == 320 and batch.layout.size_class == 512
    assert batch.layout.hoist_sizes == (256,)  # the 160 leaf calls, padded
    arenas = compiler._arenas_jit(compiler.init(jax.random.key(0)), batch)
    assert {t: a.shape[0] for t, a in arenas.items()} == {scalar: 192 + 8, vector: 320 + 8}
    # Values against an unbatched evaluation of each tree.
    params = compiler.init(jax.random.key(0))

    def reference(t):
        return np.add(reference(t[0]), reference(t[1])) if isinstance(t, tuple) else np.array([t, 0.5])

    out = compiler.apply(params, batch).outputs
    np.testing.assert_allclose(np.asarray(out), [reference(t) for t in examples], rtol=1e-5)


def test_batch_stats_count_nodes_items_depth_and_rows():
    compiler = fd.Compiler.create(fd.Map(fd.Scalar() >> fd.Function(lambda x: 2 * x)) >> fd.Sum())
    batch = compiler.build_batch([list(range(32))])
    # 32 doubles (depth 1, hoisted), then a balanced sum of 32: adds at depths 2 to 6, one item each
    # (the adds at depths 4 to 6 are within TAIL_DEPTH of the result, but those at depth 2 are not),
    # each at its own size (the batch has one example).
    assert batch.stats == fd.BatchStats(num_nodes=63, num_items=5, max_depth=6, rows=32 + 32 + 31,
                                        type_rows=(32 + 32 + 31,), saved_rows=(16 + 8 + 4 + 2 + 1,),
                                        group_rows=(16, 8, 4, 2, 1))  # the adds, a depth each
    assert batch.layout.tail_ops == ()
    assert "nodes=63" in repr(batch)
    assert jax.tree_util.tree_unflatten(*reversed(jax.tree_util.tree_flatten(batch))).stats is None


def _sum_of_doubles():
    return fd.Map(fd.Scalar() >> fd.Function(lambda x: 2 * x)) >> fd.Sum()


def test_operations_near_the_results_run_after_the_loop():
    compiler = fd.Compiler.create(_sum_of_doubles())
    examples = [[1.0, 2.0, 3.0], [4.0], [5.0, 6.0]]
    batch = compiler.build_batch(examples, exact_layout=True)
    # Every call is within TAIL_DEPTH of a result, so there is no loop. Groups run by decreasing
    # distance: doubles of 2 and 3 (distance 2), doubles of 1 and 5, 6 and add(2, 3) (1), then
    # doubles of 4 and both roots' adds (0).
    assert batch.stats.num_items == 0 and batch.layout.loop_ops == () and batch.layout.hoist_ops == ()
    kinds = ["add" if "add" in compiler.program.ops[o].spec.label else "double" for o in batch.layout.tail_ops]
    assert kinds == ["double", "double", "add", "double", "add"]
    assert batch.layout.tail_sizes == (8,) * 5
    out = jax.jit(compiler.apply)(compiler.init(jax.random.key(0)), batch).outputs
    np.testing.assert_allclose(out, [2 * sum(e) for e in examples])


def test_a_birnn_readout_of_concatenation_layers_and_loss_runs_after_the_loop():
    # A word's forward and backward states are ready at different depths, so its concatenation
    # would take a loop item at nearly every depth; it is three calls from the loss (concatenation,
    # two layers, loss), within TAIL_DEPTH, so it runs after the loop with the readout.
    def cell():
        return fd.Function(lambda x, h: (jnp.tanh(x + 0.5 * h),) * 2)

    forward = fd.RNN(cell(), initial_state=fd.Zeros((2,))) >> fd.GetItem(0)
    backward = fd.Slice(step=-1) >> fd.RNN(cell(), initial_state=fd.Zeros((2,))) >> fd.GetItem(0) >> fd.Slice(step=-1)
    concat = fd.Concat()
    readout = fd.FC(3, activation=jnp.tanh, name="hidden") >> fd.FC(1, activation=None, name="out")
    loss = fd.Function(lambda z: jnp.sum(z ** 2, -1))
    words = fd.Map(fd.Vector(2)) >> fd.AllOf(forward, backward) >> fd.ZipWith(concat)
    # Separate Maps, as a tagger's readout and its loss over (tag, logits) are: no fusion between them.
    compiler = fd.Compiler.create(words >> fd.Map(readout) >> fd.Map(loss >> fd.Metric("loss")) >> fd.Void())
    rng = np.random.default_rng(0)
    examples = [rng.normal(size=(n, 2)).astype(np.float32) for n in (5, 3, 7, 1)]
    batch = compiler.build_batch([e.tolist() for e in examples])
    assert compiler.program.block_ops[concat] in batch.layout.tail_ops
    # The cells alone: per direction, every depth of the longest sentence but its first.
    assert batch.stats.num_items == 2 * 6
    params = compiler.init(jax.random.key(0))

    def reference(p, e):
        def run(xs):
            h, out = jnp.zeros(2), []
            for x in xs:
                h = jnp.tanh(x + 0.5 * h)
                out.append(h)
            return out
        total = 0.0
        for f, b in zip(run(e), run(e[::-1])[::-1]):
            z = jnp.tanh(jnp.concatenate([f, b]) @ p["hidden"]["w"] + p["hidden"]["b"])
            total += jnp.sum((z @ p["out"]["w"] + p["out"]["b"]) ** 2)
        return total

    def loss_of(p):
        return compiler.apply(p, batch).metrics["loss"].sum()

    def reference_loss(p):
        return sum(reference(p, e) for e in examples)

    np.testing.assert_allclose(loss_of(params), reference_loss(params), rtol=1e-5)
    got, want = jax.jit(jax.grad(loss_of))(params), jax.grad(reference_loss)(params)
    for name in ("hidden", "out"):
        for k in ("w", "b"):
            np.testing.assert_allclose(got[name][k], want[name][k], rtol=1e-4, atol=1e-6)


def test_an_operation_consumed_inside_the_loop_stays_in_it():
    # ``triple`` is one call from the result, but the add that reads it is the same operation as
    # the Sum's adds, which stay in the loop: so ``triple`` must run before the loop too.
    triple = fd.Function(lambda x: 3 * x)
    model = fd.Record((fd.Map(fd.Scalar() >> fd.Function(lambda x: 2 * x)) >> fd.Sum(),
                       fd.Scalar() >> triple)) >> fd.Function(jnp.add)
    compiler = fd.Compiler.create(model)
    examples = [(list(range(16)), 5.0), ([1.0, 2.0], 7.0)]
    batch = compiler.build_batch(examples)
    op = compiler.program.block_ops[triple]
    assert batch.layout.loop_ops and op not in batch.layout.tail_ops and op in batch.layout.hoist_ops
    out = compiler.apply(compiler.init(jax.random.key(0)), batch).outputs
    np.testing.assert_allclose(out, [2 * sum(s) + 3 * x for s, x in examples])


def test_pick_chunk_takes_a_large_c_only_when_most_of_its_items_are_full():
    chunks, big = (128, 512), 1 << 16
    assert pick_chunk(np.array([4096, 2048, 1024]), chunks, big) == 512
    assert pick_chunk(np.array([600, 300, 120, 40, 9, 3]), chunks, big) == 128  # SST-like: small groups
    # 512-row items holding 1.4x the rows (padding included) of 128-row items take 512; 2x keep 128.
    assert pick_chunk(np.array([512] * 3 + [10] * 2), chunks, big) == 512
    assert pick_chunk(np.array([512] * 3 + [10] * 6), chunks, big) == 128
    assert pick_chunk(np.array([], np.int64), chunks, big) == 128
    assert pick_chunk(np.array([5000]), (128,), big) == 128
    assert pick_chunk(np.array([5000, 5000]), (8, 32, 128), big) == 128


def test_pick_chunk_takes_a_small_c_for_chains_of_a_few_examples():
    """A batch of at most CHAIN_BATCH sequences has at most one row per example in every loop group
    (one RNN step of each sentence): C = 32 holds each group in one item, as C = 128 does, and
    writes a quarter of the rows per item. A BiLSTM tagger's step at batch 16 took half as long."""
    chunks = (32, 128, 512)
    tagger_batch = np.array([16] * 40 + [11] * 30 + [2] * 20)  # size class 8192, 16 sentences
    assert pick_chunk(tagger_batch, chunks, 8192, 16) == 32
    assert pick_chunk(tagger_batch[tagger_batch <= CHAIN_BATCH], chunks, 8192, CHAIN_BATCH) == 32
    # A tree batch's groups hold several rows per example: it keeps 128, in every batch of the
    # stream, so its batches do not alternate between two C.
    assert pick_chunk(np.array([40, 30, 20, 10, 5, 1]), chunks, 8192, 16) == 128
    # More examples than CHAIN_BATCH take the large candidates, chains or not.
    assert pick_chunk(np.array([64] * 40), chunks, 8192, 64) == 128


def test_pick_chunk_takes_a_small_c_only_in_tiny_batches_where_it_adds_few_items():
    chunks, tiny = (32, 128, 512), TINY_SIZE_CLASS
    # One Table 1 tree: groups of 1-40 rows, 7 items at C = 32 against 6 at 128.
    assert pick_chunk(np.array([40, 30, 20, 10, 5, 1]), chunks, tiny) == 32
    # Four such trees: 16 items against 6; an SST batch: 37 items against 12.
    assert pick_chunk(np.array([160, 120, 80, 40, 20, 4]), chunks, tiny) == 128
    assert pick_chunk(np.array([600, 300, 120, 40, 9, 3]), chunks, tiny) == 128
    assert pick_chunk(np.array([], np.int64), chunks, tiny) == 32  # nothing in the loop: the smallest arenas
    # Groups of at most 32 rows make as many items either way: the smaller C is cheaper...
    assert pick_chunk(np.array([32] * 50 + [3] * 50), chunks, tiny) == 32
    # ... but above the tiny size classes only candidates of SMALL_CHUNK rows or more compete,
    # unless the caller gave no other.
    assert pick_chunk(np.array([32] * 50 + [3] * 50), chunks, 2 * tiny) == SMALL_CHUNK == 128
    assert pick_chunk(np.array([32] * 50 + [3] * 50), (8, 32), 2 * tiny) == 32
    # ... and only in batches of at most TINY_BATCH examples: 64 small examples take 128 in every
    # size class, so their batches do not alternate between two C (two compilations).
    assert pick_chunk(np.array([32] * 50 + [3] * 50), chunks, tiny, TINY_BATCH) == 32
    assert pick_chunk(np.array([32] * 50 + [3] * 50), chunks, tiny, 64) == 128
    # An item costs ITEM_OVERHEAD + C: a 64-row group is one item at 128 and two at 32.
    pairs = [np.array([64] * n + [16] * m) for n in range(1, 6) for m in range(0, 30, 3)]
    for groups in pairs:
        cheaper_at_32 = (2 * groups.size - np.sum(groups == 16)) * (ITEM_OVERHEAD + 32) <= groups.size * (
            ITEM_OVERHEAD + 128)
        assert pick_chunk(groups, (32, 128), tiny) == (32 if cheaper_at_32 else 128)


def test_item_sizes_are_the_powers_of_two_from_min_item_to_c_and_halfway_from_fine_item():
    assert FINE_ITEM == 24 and SMALL_CHUNK == 128
    assert item_sizes(128, 5) == (8, 16, 24, 32, 48, 64, 96, 128)
    assert item_sizes(512, 256) == (8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
    # Smaller C (single trees, short chains): items of a few rows, powers of two alone.
    assert item_sizes(8, 64) == (8,) and item_sizes(32, 5) == (8, 16, 32) and item_sizes(64, 5) == (8, 16, 32, 64)
    # Batches of a few examples have items of a row or a few: they run at their own size.
    assert item_sizes(8, 4) == (1, 2, 4, 8) and item_sizes(32, 1) == (1, 2, 4, 8, 16, 32)
    assert item_sizes(128, 1) == (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128)


def test_an_item_takes_the_smallest_size_that_holds_it():
    sizes = item_sizes(512, 64)
    counts = [1, 8, 9, 17, 24, 25, 33, 48, 49, 64, 65, 96, 97, 300, 384, 385, 512]
    assert [_item_size(n, sizes) for n in counts] == [8, 8, 16, 24, 24, 32, 48, 48, 64, 64, 96, 96, 128, 384,
                                                      384, 512, 512]
    tiny = item_sizes(32, 1)
    assert [_item_size(n, tiny) for n in (1, 3, 5, 17, 32)] == [1, 4, 8, 32, 32]


def test_batches_of_large_groups_use_the_large_chunk_and_agree_with_the_small_one():
    # 48 copies of one 16-leaf tree: its levels are groups of 48 x (8, 4, 2, 1) rows.
    rng = random.Random(3)
    shape = random_tree(rng, 16, lambda r: r.random())
    model = _tree_model()
    small = fd.Compiler.create(model, chunk_size=8)
    both = fd.Compiler.create(model, chunk_size=(8, 32))
    big = [shape] * 48
    assert small.build_batch(big).layout.chunk == 8
    assert both.build_batch(big).layout.chunk == 32
    assert both.build_batch([shape]).layout.chunk == 8  # one tree: groups of a few rows
    params = small.init(jax.random.key(0))

    def loss(compiler, p):
        return jnp.sum(jnp.sin(compiler.apply(p, compiler.build_batch(big)).outputs))

    np.testing.assert_allclose(loss(both, params), loss(small, params), rtol=1e-5)
    for a, b in zip(jax.tree_util.tree_leaves(jax.grad(lambda p: loss(both, p))(params)),
                    jax.tree_util.tree_leaves(jax.grad(lambda p: loss(small, p))(params))):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_bad_chunk_sizes_are_clear_errors():
    for bad in (100, 4, (), (128, 96), "128"):
        with pytest.raises(ValueError, match="chunk_size must be a power of two >= 8"):
            fd.Compiler.create(_tree_model(), chunk_size=bad)


def _dead_output_model() -> fd.Block:
    """Trees whose pairs compute ``(a + b, a * b)`` and keep only the sum: nothing reads the product."""
    decl = fd.ForwardDeclaration(fd.PyObjectType(), fd.TensorType((2,)))
    pair = fd.Record((decl(), decl())) >> fd.Layer.from_pure(
        lambda key, t: {"w": jnp.array([1.5, -0.5])}, lambda p, a, b: (p["w"] * (a + b), a * b), name="pair") \
        >> fd.GetItem(0)
    leaf = fd.Scalar() >> fd.Function(lambda x: jnp.stack([x, jnp.sin(x)], -1))
    decl.resolve_to(fd.OneOf(lambda t: isinstance(t, tuple), {False: leaf, True: pair}))
    return decl()


def test_outputs_nothing_reads_get_no_rows_and_results_stay_exact():
    compiler = fd.Compiler.create(_dead_output_model(), chunk_size=8)
    rng = random.Random(4)
    examples = [random_tree(rng, rng.randint(1, 12), lambda r: r.random()) for _ in range(6)]
    n_leaves = sum(len(jax.tree_util.tree_leaves(t)) for t in examples)
    batch = compiler.build_batch(examples, exact_layout=True)
    vector = compiler.program.type_index[fd.TensorType((2,))]
    # One row per leaf and per pair's sum; the products write to the dump rows.
    assert batch.stats.type_rows[vector] == n_leaves + (n_leaves - len(examples))
    params = compiler.init(jax.random.key(0))

    def reference(p, t):
        if not isinstance(t, tuple):
            return jnp.array([t, np.sin(t)], jnp.float32)
        return p["pair"]["w"] * (reference(p, t[0]) + reference(p, t[1]))

    def loss(p):
        return jnp.sum(compiler.apply(p, batch).outputs ** 2)

    def reference_loss(p):
        return sum(jnp.sum(reference(p, t) ** 2) for t in examples)

    np.testing.assert_allclose(np.asarray(compiler.apply(params, batch).outputs),
                               np.stack([reference(params, t) for t in examples]), rtol=1e-5)
    np.testing.assert_allclose(jax.jit(jax.grad(loss))(params)["pair"]["w"],
                               jax.jit(jax.grad(reference_loss))(params)["pair"]["w"], rtol=1e-4)
    # ``eval`` reads every value back, so its batches keep rows for all outputs.
    _, kept = _build(compiler, examples, 8)
    assert kept.stats.type_rows[vector] == n_leaves + 2 * (n_leaves - len(examples))
    np.testing.assert_allclose(compiler.eval_one(examples[0], params), reference(params, examples[0]), rtol=1e-5)


def test_arena_rows_round_up_to_an_eighth_of_the_next_power_of_two():
    assert [arena_rows_for(n) for n in (0, 1, 8, 9, 64, 65, 100, 161, 256, 257, 19_300, 32_768)] == [
        8, 8, 8, 16, 64, 80, 112, 192, 256, 320, 20_480, 32_768]
    for n in range(1, 5000, 7):  # never fewer rows than used, nor (above 8) a quarter more
        assert n <= arena_rows_for(n) <= max(8, n * 5 // 4)


def test_items_of_one_and_a_half_powers_of_two_compute_the_reference_values_and_gradients():
    # 64 sequences of 1-11 steps at C = 128: each step's group holds 33-64 rows, so its item is
    # padded to 48 or 64 rows (not to 64 only).
    with enable_x64():
        block, reference, examples = make_rnn("float64", seed=2, n=64)
        examples = [xs or [[0.5, -0.5, 1.0]] for xs in examples]
        compiler = fd.Compiler.create(block, chunk_size=128)
        batch = compiler.build_batch(examples)
        sizes = item_sizes(batch.layout.chunk, batch.layout.num_examples)
        n = int(batch.arrays.n_items)
        used = {sizes[b % len(sizes)] for b in batch.arrays.items_branch[:n].tolist()}
        assert 48 in used
        params = compiler.init(jax.random.key(0))
        np.testing.assert_allclose(np.asarray(compiler.apply(params, batch).outputs),
                                   np.stack([reference(params, xs) for xs in examples]), rtol=1e-10, atol=1e-12)

        def loss(p, c=compiler, b=batch):
            return jnp.sum(jnp.sin(c.apply(p, b).outputs) ** 2)

        grads = jax.grad(loss)(params)
        # Against C = 8 (items of 8 rows, no size between powers of two) and finite differences.
        small = fd.Compiler.create(block, chunk_size=8)
        for a, b in zip(jax.tree_util.tree_leaves(grads),
                        jax.tree_util.tree_leaves(jax.grad(loss)(params, small, small.build_batch(examples)))):
            np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)
        (name,) = params  # the LSTM cell's layer
        w, eps = params[name]["w"], 1e-6
        for i, j in [(0, 0), (3, 5), (10, 31)]:
            def at(delta, i=i, j=j):
                return {name: {**params[name], "w": w.at[i, j].add(delta)}}
            numeric = (loss(at(eps)) - loss(at(-eps))) / (2 * eps)
            np.testing.assert_allclose(grads[name]["w"][i, j], numeric, rtol=1e-5, atol=1e-9)
