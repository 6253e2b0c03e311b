"""Batches padded into larger layouts: same results, a bounded number of layouts, a budget."""

from __future__ import annotations

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fold as fd
from benchmarks.random_models import random_model
from fold.scheduler.layouts import (
    ARENA_HEADROOM_CAP,
    MAX_GROWTH,
    PLAN_AHEAD,
    SAVED_SHARE,
    LayoutPolicy,
    computed_rows,
    empty,
    fits,
    join,
    pad_to,
)
from tests.models import MODELS
from tests.scheduler.test_row_ownership import replay_writes


def _exact(compiler: fd.Compiler, examples: list) -> fd.Batch:
    """The batch with its own (exact-fit) layout, bypassing the compiler's layout policy."""
    return compiler.build_batch(examples, exact_layout=True)


def _shapes(compiler: fd.Compiler) -> list:
    return [(t.shape, t.dtype) for t in compiler.program.types]


# Seeds 0-2 cover both backward modes and chunk sizes, with and without headroom; 3-5 are slow.
@pytest.mark.parametrize("seed", [0, *(pytest.param(s, marks=pytest.mark.slow) for s in (1, 2, 3, 4, 5))])
def test_a_padded_batch_computes_what_the_exact_one_does(seed):
    """Two batches of one random model, each padded into the join of both layouts: every row is
    still written once and read after (host replay), and outputs and gradients are the exact
    batch's."""
    model = random_model(seed, n=24)
    compiler = fd.Compiler.create(model.block, backward=("save", "recompute")[seed % 2], chunk_size=(8, 16)[seed % 2])
    first, second = _exact(compiler, model.examples[:12]), _exact(compiler, model.examples[12:])
    target = join(first.layout, second.layout, headroom=bool(seed % 3))
    assert fits(first.layout, target, None) and fits(second.layout, target, None)
    params = compiler.init(jax.random.key(seed))

    def loss_and_grads(batch):
        out = jax.jit(compiler.apply)(params, batch).outputs
        grads = jax.jit(jax.grad(lambda p: jnp.sum(jnp.sin(compiler.apply(p, batch).outputs))))(params)
        return out, grads

    exact = loss_and_grads(second)
    padded_batch = pad_to(second, target, _shapes(compiler))
    assert padded_batch.layout == target
    replay_writes(compiler, padded_batch)
    assert computed_rows(padded_batch) >= computed_rows(second) >= second.stats.num_nodes
    for a, b in zip(jax.tree_util.tree_leaves(loss_and_grads(padded_batch)), jax.tree_util.tree_leaves(exact)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=model.text)


def test_join_keeps_each_loop_operations_fewest_item_rows():
    # The items' mean rows only choose where weight cotangents are summed: a joined layout keeps
    # the smaller, so a stream's batches all sum them the same way.
    block, _, examples = MODELS["tree_lstm"](n=12)
    compiler = fd.Compiler.create(block, chunk_size=8)
    a = _exact(compiler, examples[:6]).layout
    assert a.item_rows and all(n & (n - 1) == 0 for n in a.item_rows)  # powers of two
    b = _exact(compiler, examples[6:]).layout._replace(item_rows=tuple(4 * n for n in a.item_rows))
    assert join(a, b).item_rows == join(b, a).item_rows == a.item_rows


def test_join_merges_tail_sequences_in_order_and_grows_with_headroom():
    model = random_model(3, n=10)
    compiler = fd.Compiler.create(model.block, chunk_size=8)
    a, b = _exact(compiler, model.examples[:5]).layout, _exact(compiler, model.examples[5:]).layout
    both = join(a, b)
    assert both == join(b, a) or fits(a, join(b, a), None)
    for layout in (a, b):
        assert fits(layout, both, None)
        assert set(layout.loop_ops) <= set(both.loop_ops)
        assert all(n <= m for n, m in zip(layout.arena_rows, both.arena_rows))
    assert list(both.hoist_ops) == sorted(set(a.hoist_ops) | set(b.hoist_ops))
    for layout in (a, b):  # each batch's tail groups, in its order, in the merged sequence
        it = iter(both.tail_ops)
        assert all(any(o == p for p in it) for o in layout.tail_ops)
    roomy = join(a, b, headroom=True)  # headroom where b needs more than a has, only
    cap = int(ARENA_HEADROOM_CAP * roomy.size_class)
    for have, n, m in zip(a.arena_rows, b.arena_rows, roomy.arena_rows):
        assert m == (max(n, min(cap, 2 * n)) if n > have else max(have, n))
    hoisted, had = dict(zip(roomy.hoist_ops, roomy.hoist_sizes)), dict(zip(a.hoist_ops, a.hoist_sizes))
    for o, n in zip(b.hoist_ops, b.hoist_sizes):
        assert hoisted[o] == (min(roomy.size_class, 2 * n) if n > had.get(o, 0) else had[o])
    assert fits(both, roomy, None)
    first = join(empty(b), b, headroom=True)  # a family's first layout: headroom everywhere
    assert all(m == max(n, min(int(ARENA_HEADROOM_CAP * b.size_class), 2 * n))
               for n, m in zip(b.arena_rows, first.arena_rows))
    assert all(m == min(b.size_class, 2 * n) for n, m in zip(b.hoist_sizes + b.tail_sizes,
                                                            first.hoist_sizes + first.tail_sizes))


def test_fits_needs_the_same_examples_and_bounds_the_growth():
    compiler = fd.Compiler.create(fd.Map(fd.Scalar()) >> fd.Sum(), chunk_size=8)
    small = _exact(compiler, [[1.0]]).layout
    assert not fits(small, _exact(compiler, [[1.0], [2.0]]).layout, None)  # examples differ
    layouts = {n: _exact(compiler, [[1.0] * n]).layout for n in (1, 100, 200, 300)}
    big = layouts[300]
    assert big.size_class > MAX_GROWTH * small.size_class
    for layout in layouts.values():
        assert fits(layout, big, None)
        assert fits(layout, big) == (big.size_class <= MAX_GROWTH * layout.size_class)
    assert layouts[100].size_class < big.size_class and not fits(big, layouts[100], None)
    with pytest.raises(ValueError, match="does not fit"):
        pad_to(_exact(compiler, [[1.0] * 300]), layouts[100], _shapes(compiler))


def test_a_stream_of_batches_of_a_many_operation_model_compiles_a_few_layouts():
    """Exact layouts of a random model's batches are mostly distinct; the compiler pads them into
    a few, and the results are those of the exact batches."""
    model = random_model(5, n=640, depth=3)
    compiler = fd.Compiler.create(model.block)
    batches = list(compiler.batches(model.examples, 32))
    assert len({b.layout for b in batches}) <= 3
    assert compiler.stats().layouts == len({b.layout for b in batches})
    exact = [_exact(compiler, model.examples[i:i + 32]) for i in range(0, 640, 32)]
    assert len({b.layout for b in exact}) >= 6
    params = compiler.init(jax.random.key(0))
    for padded, own in zip(batches[::7], exact[::7]):
        np.testing.assert_allclose(compiler.apply(params, padded).outputs, compiler.apply(params, own).outputs,
                                   rtol=1e-6, atol=1e-6)


def test_past_the_budget_batches_pad_into_any_layout_they_fit_and_a_misfit_warns_once(caplog):
    compiler = fd.Compiler.create(fd.Map(fd.Scalar()) >> fd.Sum(), chunk_size=8, max_layouts=1)
    with caplog.at_level(logging.INFO, logger="fold"):
        big = compiler.build_batch([[1.0] * 300])
        small = compiler.build_batch([[1.0]])  # 1/64 of big's size class: fits it past the budget
        assert small.layout == big.layout
        assert caplog.text.count("layout 1") == 1
        for n in (2, 3):  # a new number of examples fits no layout: it compiles, warned once
            compiler.build_batch([[1.0]] * n)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "max_layouts=1" in warnings[0].getMessage()
    assert compiler.stats().layouts == 3


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "8"])
def test_max_layouts_is_validated(bad):
    with pytest.raises(ValueError, match="max_layouts"):
        fd.Compiler.create(fd.Map(fd.Scalar()) >> fd.Sum(), max_layouts=bad)


def test_batches_plan_one_layout_for_the_full_batches_from_a_few_ahead(caplog):
    """Grown from the first batch, this model's full batches took several layouts; planned from
    PLAN_AHEAD batches (their join, the size class and arenas bounded by the spread), one holds
    every full batch, and the last partial batch gets its own."""
    n = 2000
    model = random_model(5, n=n, depth=3)
    compiler = fd.Compiler.create(model.block, chunk_size=128)
    recorded = compiler.record(model.examples)
    with caplog.at_level(logging.INFO, logger="fold"):
        batches = list(compiler.batches(recorded, 64, shuffle=True, seed=5))
    assert f"planned from {PLAN_AHEAD} of the batches ahead" in caplog.text
    assert len({b.layout for b in batches[:-1]}) == 1 and batches[-1].layout.num_examples == n % 64
    assert compiler.stats().layouts == 2
    order = np.random.default_rng(5).permutation(n)
    grown = LayoutPolicy(_shapes(compiler), 8)
    for i in range(0, n - n % 64, 64):
        grown.assign(_exact(compiler, recorded[order[i:i + 64]]))
    assert len(grown.layouts) > 1


def test_an_error_while_planning_ahead_is_raised_after_the_batches_before_it():
    compiler = fd.Compiler.create(fd.Map(fd.Scalar()) >> fd.Sum(), chunk_size=8)
    examples = [[1.0, 2.0]] * 20 + [["x"]] + [[1.0]] * 20
    seen = []
    with pytest.raises(ValueError, match="expected a number"):
        for batch in compiler.batches(examples, 5):
            seen.append(batch)
    assert len(seen) == 4
    np.testing.assert_allclose(compiler.apply(compiler.init(jax.random.key(0)), seen[0]).outputs, [3.0] * 5)


def test_a_later_epoch_hands_out_its_first_batch_without_waiting_for_a_sample():
    walked = []
    compiler = fd.Compiler.create(fd.Map(fd.InputTransform(lambda x: walked.append(x) or x) >> fd.Scalar())
                                  >> fd.Sum(), chunk_size=8)
    examples = [[float(i)] * (i % 4 + 1) for i in range(40 * 5)]
    first = list(compiler.batches(examples, 5, prefetch=False))
    walked.clear()
    second = compiler.batches(examples, 5, prefetch=False)
    assert next(second).layout == first[0].layout
    assert len(walked) == sum(len(x) for x in examples[:5])  # one batch, not a sample of PLAN_AHEAD
    assert [b.layout for b in second] == [b.layout for b in first[1:]]
    assert compiler.stats().layouts == 1


def _mixed_saving_model() -> fd.Block:
    """A loop with an operation ``backward="auto"`` saves (a 256-wide cell, worth it) and one it does
    not (a 3-wide cell), as in the fuzz case that found a layout making the second save too."""
    def cell(width: int, name: str) -> fd.Block:
        return fd.Map(fd.Vector(2)) >> fd.Fold(fd.Concat() >> fd.FC(width, name=name), fd.Zeros((width,)))

    return fd.Record((cell(3, "narrow"), cell(256, "wide"))) >> fd.Concat()


def _named(compiler: fd.Compiler, layout: fd.BatchLayout, name: str) -> int:
    """The position in ``layout.loop_ops`` of the operation of layer ``name``."""
    ops = compiler.program.ops
    return next(q for q, o in enumerate(layout.loop_ops) if ops[o].layer is not None and ops[o].layer.name == name)


def test_a_layout_never_makes_a_batch_save_an_operation_it_does_not():
    """Planned layouts give no saved rows to operations no batch saves (rows make an operation
    save, into a region sized for nothing: wrong gradients), and fits refuses such a layout."""
    compiler = fd.Compiler.create(_mixed_saving_model(), backward="auto", chunk_size=32)
    rng = np.random.default_rng(0)
    examples = [(rng.normal(size=(int(rng.integers(2, 9)), 2)).tolist(), rng.normal(size=(5, 2)).tolist())
                for _ in range(48)]
    own = compiler._saving.decide(compiler._batcher.build_own(examples[:6])).layout
    narrow, wide = _named(compiler, own, "narrow"), _named(compiler, own, "wide")
    assert own.saved_rows[narrow] == 0 and own.saved_rows[wide] > 0  # auto saves the wide cell only
    batches = list(compiler.batches(examples, 6))
    assert len(batches) == 8
    for batch in batches:
        layout = batch.layout
        assert layout.saved_rows[_named(compiler, layout, "narrow")] == 0
        assert layout.saved_rows[_named(compiler, layout, "wide")] > 0
    saving_it = own._replace(saved_rows=tuple(8 if q == narrow else r for q, r in enumerate(own.saved_rows)))
    assert fits(own, own, None) and not fits(own, saving_it, None)
    # A layout whose region is smaller than what the items save is refused on the host, even if
    # the batch's own layout claimed it fits (the device would clamp the writes silently).
    batch = compiler._saving.decide(compiler._batcher.build_own(examples[:6]))
    need = batch.built_stats().saved_rows[wide]
    short = batch.replace(layout=own._replace(saved_rows=tuple(8 if q == wide else r
                                                               for q, r in enumerate(own.saved_rows))))
    target = own._replace(size_class=2 * own.size_class,
                          saved_rows=tuple(8 if q == wide else r for q, r in enumerate(own.saved_rows)))
    with pytest.raises(ValueError, match=f"loop items save {need} rows, more than the 8"):
        pad_to(short, target, _shapes(compiler))


def test_mixed_saving_gradients_in_a_stream_equal_the_per_example_reference():
    """The fuzz case that found it (seed 225: auto saving one loop operation and not another, in a
    planned layout), against its per-example reference."""
    from benchmarks.fuzz import Case, run_case

    _, compared = run_case(Case(seed=225, chunk=512, backward="auto", recorded=True, batch_size=6, wide=True))
    assert compared == 6


def test_a_planned_size_class_gives_saving_operations_their_floor_of_saved_rows():
    """A plan whose size class the spread raises above its sample's also raises the saved rows of
    the operations that save to that size class's floor (``A // SAVED_SHARE``), which every batch
    of that size class asks for: a BiLSTM tagger's epoch at batch 16 compiled a second layout for
    its 162nd batch, which needed no more than the plan's rows but a size class's floor more."""
    side = fd.Map(fd.Vector(2) >> fd.FC(2) >> fd.Metric("m")) >> fd.Void()  # nodes outside the loop
    fold = fd.Map(fd.Vector(2)) >> fd.Fold(fd.Concat() >> fd.FC(16), fd.Zeros((16,)))
    compiler = fd.Compiler.create(fd.Record((side, fold)) >> fd.GetItem(1), backward="save", chunk_size=8)
    sizes = np.random.default_rng(0).integers(20, 30, PLAN_AHEAD * 8).tolist() + [31] * 8
    examples = [([[1.0, 0.0]] * n, [[1.0, 0.0]] * 6) for n in sizes]
    batches = list(compiler.batches(examples, 8, prefetch=False))
    planned = batches[0].layout
    assert planned.size_class > max(_exact(compiler, examples[i:i + 8]).layout.size_class
                                    for i in range(0, PLAN_AHEAD * 8, 8))
    assert _exact(compiler, examples[-8:]).layout.size_class == planned.size_class
    assert min(planned.saved_rows) >= planned.size_class // SAVED_SHARE
    assert {b.layout for b in batches} == {planned}


def test_planned_saved_rows_follow_what_the_items_save():
    """A stream's planned saved buffers hold what its batches' items save, rounded up as arenas
    are: every step fills them whole, and a floor of a quarter of the size class and powers of two
    gave the DyNet suite's Tree-LSTM 5.9-6.4x its items' rows (steps up to 1.08x as long)."""
    side = fd.Map(fd.Vector(2) >> fd.FC(2) >> fd.Metric("m")) >> fd.Void()  # nodes outside the loop
    fold = fd.Map(fd.Vector(2)) >> fd.Fold(fd.Concat() >> fd.FC(16), fd.Zeros((16,)))
    compiler = fd.Compiler.create(fd.Record((side, fold)) >> fd.GetItem(1), backward="save", chunk_size=8)
    sizes = np.random.default_rng(1).integers(20, 30, PLAN_AHEAD * 8).tolist()
    examples = [([[1.0, 0.0]] * n, [[1.0, 0.0]] * 40) for n in sizes]
    batches = list(compiler.batches(examples, 8, prefetch=False))
    need = max(b.built_stats().saved_rows[0] for b in
               (_exact(compiler, examples[i:i + 8]) for i in range(0, len(examples), 8)))
    (saved,) = batches[0].layout.saved_rows
    assert need <= saved <= 1.5 * need
    assert {b.layout for b in batches} == {batches[0].layout}


def test_a_stream_of_tiny_batches_plans_its_layout_too():
    """``compiler.batches`` at batch 4 (a smoke test, single trees) planned nothing and gave each
    batch its exact layout first: a tagger's first 15 batches took four layouts (four
    compilations). A stream plans tiny batches as it plans the others; ``build_batch`` still gives
    a tiny batch its own (while no layout holds it)."""
    from examples import sst, tagger
    from tests.examples.test_tagger import SAMPLE

    train = tagger.examples_of(sst.load("train", SAMPLE))
    args = tagger.parse_args(["--quick"])
    compiler = fd.Compiler.create(tagger.build_model(*tagger.vocabularies(train, args.min_count), args))
    examples = train[:4 * 60]
    batches = list(compiler.batches(examples, 4, prefetch=False))
    assert len({b.layout for b in batches}) <= 2  # the plan, and at most one growth past it
    fresh = fd.Compiler.create(compiler.program.root)
    assert fresh.build_batch(examples[:4]).layout == _exact(fresh, examples[:4]).layout
