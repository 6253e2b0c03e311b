"""The host plan records exactly what the generic walk records, and falls back to it correctly."""

from __future__ import annotations

import pathlib
import random

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fold as fd
from examples import sst, tree_lstm_sst
from fold.scheduler.builder import BatchBuilder
from fold.scheduler.plan import MAX_PLAN_DEPTH, host_plan
from fold.scheduler.walk import walk
from tests.models import MODELS, random_tree

SAMPLE = pathlib.Path(__file__).resolve().parents[1] / "data" / "sst_sample"


def _record(compiler: fd.Compiler, examples: list, use_plan: bool) -> tuple[BatchBuilder, list]:
    builder = BatchBuilder(compiler.program)
    outputs = []
    for i, x in enumerate(examples):
        builder.example_index = i
        outputs.append(builder.run(x) if use_plan else walk(compiler.program.root, x, builder))
    return builder, outputs


def _value_sources(builder: BatchBuilder) -> tuple[list, list, list]:
    """Each value's type, node and position, one value at a time: the reference for the arrays
    ``BatchBuilder.arrays`` derives from the nodes' first values and the constants' ids."""
    n = len(builder.v_depth)
    v_type, v_node, v_pos = [None] * n, [None] * n, [None] * n
    for node, (o, first) in enumerate(zip(builder.n_op, builder.n_first)):
        for j, t in enumerate(builder.program.ops[o].out_tidx):
            v_type[first + j], v_node[first + j], v_pos[first + j] = t, node, j
    for t, vids in enumerate(builder.const_vids):
        for k, vid in enumerate(vids):
            v_type[vid], v_node[vid], v_pos[vid] = t, -1, k
    return v_type, v_node, v_pos


def _state(builder: BatchBuilder) -> dict:
    consts = [[None if c is None else (np.asarray(c).dtype.str, np.asarray(c).tolist()) for c in table]
              for table in builder.consts]
    rec = builder.arrays()
    values = (rec.v_type.tolist(), rec.v_node.tolist(), rec.v_pos.tolist())
    assert values == _value_sources(builder)
    return {"values": (*values, builder.v_depth),
            "nodes": (builder.n_op, builder.n_depth, builder.n_inputs), "consts": consts,
            "metrics": (builder.metric_examples, builder.metric_values), "max_depth": builder.max_depth}


def assert_plan_matches_walk(compiler: fd.Compiler, examples: list) -> BatchBuilder:
    plan, plan_out = _record(compiler, examples, use_plan=True)
    ref, ref_out = _record(compiler, examples, use_plan=False)
    assert plan_out == ref_out
    assert _state(plan) == _state(ref)
    return plan


def _sst_model():
    trees = sst.load("train", SAMPLE)
    args = tree_lstm_sst.parse_args(["--state-size", "4", "--embed-size", "3"])
    # Words missing from the vocabulary take the Optional's zeros branch.
    vocab = sst.vocabulary(trees[: len(trees) // 2])
    return tree_lstm_sst.build_model(vocab, args), trees[:40]


@pytest.mark.parametrize("name", sorted(MODELS))
def test_plan_records_what_the_walk_records(name):
    block, _, examples = MODELS[name]()
    assert_plan_matches_walk(fd.Compiler.create(block), examples)


def test_plan_matches_walk_on_sst_with_optional_metrics_and_shared_zeros():
    block, trees = _sst_model()
    builder = assert_plan_matches_walk(fd.Compiler.create(block), trees)
    assert len(builder.metric_values["loss"]) == sum(sst.nodes(t) for t in trees)


def _sum_tree():
    decl = fd.ForwardDeclaration(fd.PyObjectType(), fd.TensorType(()))
    pair = (fd.AllOf(fd.Void() >> fd.FromTensor(np.float32(0.5)), fd.Record((decl(), decl())))
            >> fd.Function(lambda c, ab: c * (ab[0] + ab[1])))
    node = fd.Composition()
    with node.scope():
        value = fd.OneOf(lambda t: isinstance(t, tuple), {False: fd.Scalar(), True: pair}).reads(node.input)
        fd.Metric("node").reads(value)
        node.output.reads(value)
    decl.resolve_to(node)
    return decl()


def _chain(depth: int):
    """``(2, (2, ... (2, 1)))``: every level records a constant before it recurses."""
    tree = 1.0
    for _ in range(depth):
        tree = (2.0, tree)
    return tree


def test_deep_example_is_rolled_back_and_walked():
    compiler = fd.Compiler.create(_sum_tree())
    rng = random.Random(0)
    # The deep example comes first, so its aborted plan run is what creates the shared constant.
    examples = [_chain(MAX_PLAN_DEPTH + 50), random_tree(rng, 5, lambda r: r.random()),
                random_tree(rng, 7, lambda r: r.random())]
    builder = assert_plan_matches_walk(compiler, examples)
    assert builder.max_depth > MAX_PLAN_DEPTH
    # The shared FromTensor constant survives the rollback: one per batch.
    assert sum(c is not None and np.shape(c) == () and float(c) == 0.5 for c in builder.consts[0]) == 1
    value = 1.0
    for _ in range(MAX_PLAN_DEPTH + 50):
        value = 0.5 * (2.0 + value)
    out = compiler.apply(compiler.init(jax.random.key(0)), compiler.build_batch(examples))
    np.testing.assert_allclose(np.asarray(out.outputs)[0], value, rtol=1e-5)


def test_bad_example_after_good_ones_gets_the_walks_error():
    compiler = fd.Compiler.create(_sum_tree())
    with pytest.raises(ValueError, match=r"example 2: at .*Scalar.*string 'x'"):
        compiler.build_batch([(1.0, 2.0), 3.0, ((1.0, "x"), 2.0)])
    # The builder of the next batch starts clean.
    assert_plan_matches_walk(compiler, [(1.0, 2.0), 3.0])


def test_sequences_that_are_not_lists_take_the_walk():
    fold = fd.Fold(fd.Function(lambda acc, x: acc + x), fd.Zeros(fd.TensorType(())))
    block = fd.Record((fd.Map(fd.Scalar()) >> fold, fd.Map(fd.Scalar()) >> fd.Sum()))
    block = block >> fd.Function(lambda a, b: a - b)
    compiler = fd.Compiler.create(block)
    examples = [([1.0, 2.0], (3.0, 4.0)), ((5.0,), [6.0, 7.0, 8.0]), ([], [])]
    assert_plan_matches_walk(compiler, examples)
    out = compiler.apply(compiler.init(jax.random.key(0)), compiler.build_batch(examples))
    np.testing.assert_allclose(np.asarray(out.outputs), [3.0 - 7.0, 5.0 - 21.0, 0.0])


def test_plan_source_is_python_for_every_operation():
    compiler = fd.Compiler.create(_sum_tree() >> fd.Function(jnp.negative))
    source = host_plan(compiler.program).source
    compile(source, "<plan>", "exec")
    for o in range(len(compiler.program.ops)):
        assert f"def rec{o}(" in source


def test_build_pauses_the_garbage_collector_and_restores_it():
    import gc

    compiler = fd.Compiler.create(_sum_tree())
    seen = []
    probe = fd.InputTransform(lambda x: seen.append(gc.isenabled()) or x) >> _sum_tree()
    probe_compiler = fd.Compiler.create(probe)
    probe_compiler.build_batch([(1.0, 2.0)])
    assert seen == [False] and gc.isenabled()
    with pytest.raises(ValueError):
        compiler.build_batch([(1.0, "x")])
    assert gc.isenabled()
    gc.disable()
    try:
        compiler.build_batch([(1.0, 2.0)])
        assert not gc.isenabled()
    finally:
        gc.enable()


def _garbage_of_a_build(compiler: fd.Compiler, examples: list) -> tuple:
    """``(batch, tracked objects the build made that are still alive, unreachable objects it left)``,
    measured on a second build (the first warms caches up)."""
    import gc

    compiler.build_batch(examples)
    # Leaves generation 0 empty. Twice: JAX's gc callback drops the references its C++ side held
    # (earlier compilers' jitted methods), which can leave cycles only the next collection finds.
    gc.collect()
    gc.collect()
    gc.disable()
    try:
        batch = compiler.build_batch(examples)
        return batch, len(gc.get_objects(generation=0)), gc.collect()
    finally:
        gc.enable()


def test_build_leaves_nothing_for_the_cycle_collector():
    """A build's objects are freed by reference counting, and the few that outlive it are not per
    node: otherwise the first allocation after a build runs a collection (and now and then one
    over the whole heap, the user's dataset included). Metric entries used to be tuples (one per
    node) and the plan's recursive closures a cycle holding the builder's lists."""
    block, trees = _sst_model()
    batch, young, unreachable = _garbage_of_a_build(fd.Compiler.create(block), trees)
    assert unreachable == 0
    assert batch.stats.num_nodes > 1000
    assert young < 100, young


def _mutual_recursion():
    """Two declarations that call each other: an even level sums its children, an odd one
    negates the sum."""
    even = fd.ForwardDeclaration(fd.PyObjectType(), fd.TensorType(()))
    odd = fd.ForwardDeclaration(fd.PyObjectType(), fd.TensorType(()))
    even.resolve_to(fd.OneOf(lambda t: isinstance(t, list), {False: fd.Scalar(), True: fd.Map(odd()) >> fd.Sum()}))
    odd.resolve_to(fd.OneOf(lambda t: isinstance(t, list), {
        False: fd.Scalar(), True: fd.Map(even()) >> fd.Sum() >> fd.Function(jnp.negative)}))
    return even()


@pytest.mark.parametrize("name", [*sorted(MODELS), "mutual_recursion"])
def test_no_model_leaves_cycles_after_a_build(name):
    if name == "mutual_recursion":
        block, examples = _mutual_recursion(), [[1.0, [2.0, [3.0]]], 4.0, [[5.0], 6.0]]
    else:
        block, _, examples = MODELS[name]()
    compiler = fd.Compiler.create(block)
    if name == "mutual_recursion":
        assert host_plan(compiler.program).source.count("def decl") == 2
        assert_plan_matches_walk(compiler, examples)
    assert _garbage_of_a_build(compiler, examples)[2] == 0


def test_shared_nodes_are_planned_and_record_what_the_walk_records():
    from tests.blocks.test_sharing import make_dag_model, random_dag

    rng = random.Random(7)
    examples = [random_dag(rng, rng.randint(1, 10)) for _ in range(6)]
    examples.append(examples[0]["kids"][0])  # another example reaching the same objects
    for across in (False, True):
        compiler = fd.Compiler.create(make_dag_model(across_examples=across)[0])
        source = host_plan(compiler.program).source
        assert "ctx.block_cache.get(" in source  # emitted, not left to the generic walk
        assert_plan_matches_walk(compiler, examples)
        assert _garbage_of_a_build(compiler, examples)[2] == 0


def test_rnn_is_planned_and_records_what_the_walk_records(monkeypatch):
    cell = fd.LSTMCell(3, name="cell")
    from_zeros = fd.Map(fd.Vector(2)) >> fd.RNN(cell)
    from_block = fd.Map(fd.Vector(2)) >> fd.RNN(cell, initial_state=fd.Zeros(((3,), (3,))))
    from_input = fd.Record((fd.Map(fd.Vector(2)), fd.Record((fd.Vector(3), fd.Vector(3))))) \
        >> fd.RNN(cell, initial_state_from_input=True)
    over_tuple = fd.Record((fd.Vector(2), fd.Vector(2))) >> fd.RNN(cell)  # not a list: the walk's
    reversed_ = fd.Map(fd.Vector(2)) >> fd.Slice(step=-1) >> fd.RNN(cell) >> fd.GetItem(0)
    block = fd.Record((from_zeros >> fd.GetItem(1) >> fd.GetItem(1), from_block >> fd.GetItem(1) >> fd.GetItem(0),
                       from_input >> fd.GetItem(1) >> fd.GetItem(1), over_tuple >> fd.GetItem(1) >> fd.GetItem(1),
                       reversed_ >> fd.Sum()))
    compiler = fd.Compiler.create(block >> fd.Concat())
    rng = np.random.default_rng(0)

    def example(n: int) -> tuple:
        seq = [rng.normal(size=2).tolist() for _ in range(n)]
        pair = (rng.normal(size=2).tolist(), rng.normal(size=2).tolist())
        return seq, seq, (seq, (rng.normal(size=3).tolist(), rng.normal(size=3).tolist())), pair, seq

    examples = [example(n) for n in (3, 0, 1, 2, 5)]
    walked = []
    host = fd.RNN._host

    def counted(self, x, ctx):
        walked.append(self)
        return (yield from host(self, x, ctx))

    monkeypatch.setattr(fd.RNN, "_host", counted)
    assert_plan_matches_walk(compiler, examples)
    # The plan ran the three RNNs over lists itself; the walk did the rest (and all of the reference).
    planned_walks = len(walked) - 5 * len(examples)
    assert planned_walks == 2 * len(examples)
