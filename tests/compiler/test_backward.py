"""``Compiler.create(..., backward="save" | "auto")``: the loop's backward pass from saved matmul
outputs, always or when they fit in ``save_limit`` bytes.

The reference is ``backward="recompute"``, which ``test_gradients`` checks against NumPy
references and finite differences.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fold as fd
from examples import weave
from fold.compiler.executor import _SavedBuffers
from fold.compiler.saving import saved_buffer_bytes
from fold.scheduler.layouts import SAVED_SHARE
from fold.scheduler.schedule import arena_rows_for, item_sizes
from tests.compiler.test_randomness import _functions
from tests.models import MODELS, enable_x64
from tests.params import diagonal


def _grads(block: fd.Block, backward: str, examples: list, key: jax.Array | None = None,
           weight_pass: bool | None = None, **create: int) -> dict:
    compiler = fd.Compiler.create(block, backward=backward, **create)
    compiler.executor.weight_pass = weight_pass
    params = compiler.init(jax.random.key(3))
    batch = compiler.build_batch(examples)
    return jax.jit(jax.grad(lambda p: jnp.sum(jnp.sin(compiler.apply(p, batch, key).outputs) ** 2)))(params)


def _assert_same(a: dict, b: dict) -> None:
    assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_allclose(x, y, rtol=1e-10, atol=1e-13)


@pytest.mark.parametrize("name, chunk", diagonal(sorted(MODELS), [(128, 512), 8]))
def test_saved_backward_gives_the_recomputed_gradients(name, chunk):
    # C = 8 cuts depths into several items, with padded remainders, per operation.
    with enable_x64():
        block, _, examples = MODELS[name](dtype="float64", n=8)
        _assert_same(_grads(block, "save", examples, chunk_size=chunk),
                     _grads(block, "recompute", examples, chunk_size=chunk))


def test_saved_buffers_hold_one_row_per_loop_row():
    """Each loop operation's saved buffers have as many rows as its items' padded rows (rounded up
    as arena rows are, above the size class's floor), one item after another: not a row per row
    of its output's arena, nor the next power of two."""
    block, _, examples = MODELS["tree_lstm"](n=20)
    for backward in ("recompute", "save"):
        compiler = fd.Compiler.create(block, backward=backward, chunk_size=8)
        batch = compiler.build_batch(examples, exact_layout=True)
        layout, arrays = batch.layout, batch.arrays
        if backward == "recompute":
            assert layout.saved_rows == ()
            continue
        sizes = item_sizes(layout.chunk, layout.num_examples)
        n = int(arrays.n_items)
        branch = arrays.items_branch[:n]
        rows = np.array([sizes[b % len(sizes)] for b in branch])
        for q in range(len(layout.loop_ops)):
            mine = branch // len(sizes) == q
            np.testing.assert_array_equal(arrays.items_saved[:n][mine], np.cumsum(rows[mine]) - rows[mine])
            if compiler.saved_row_bytes(8)[layout.loop_ops[q]]:
                floor = layout.size_class // SAVED_SHARE
                assert layout.saved_rows[q] == max(arena_rows_for(int(rows[mine].sum())), floor)
            else:  # nothing to save (no matmul): no buffer
                assert layout.saved_rows[q] == 0
        assert 0 < sum(layout.saved_rows) < max(layout.arena_rows)


def test_loop_operations_share_saved_buffers():
    """A weave module's FCs in the loop save matmul outputs of one row shape: they share one buffer,
    each operation in rows of its own, so a loop item writes one saved chunk instead of one per
    operation; the gradients match recomputing's."""
    block = weave.build_weave(4, modules=1)
    rng = np.random.default_rng(0)
    molecules = [weave.random_molecule(rng, 3, 5) for _ in range(3)]
    compiler = fd.Compiler.create(block, backward="save", chunk_size=8)
    layout = compiler.build_batch(molecules).layout
    plans = compiler.executor._plans(layout, compiler.init(jax.random.key(0)), None, compiler.executor.float_types)
    buffers = _SavedBuffers.of(plans, layout.saved_rows, layout.chunk)
    assert len(plans) >= 2 and sum(len(leaves) for leaves in plans.values()) == len(plans)
    assert buffers.rows_of == (((4,), np.dtype("float32")),)
    (first,) = buffers.first_rows
    # Each region: the operation's saved rows, then C spill rows for its last item's padded
    # write; the last region's spill rows are the buffer's dump rows.
    regions = sorted((int(first[q]), int(first[q]) + layout.saved_rows[q] + layout.chunk) for q in plans)
    assert regions[0][0] == 0 and regions[-1][1] == buffers.rows[0] + layout.chunk
    assert all(end == start for (_, end), (start, _) in zip(regions, regions[1:]))  # back to back
    assert sum(end - start for start, end in regions) * 4 * 4 == saved_buffer_bytes(
        layout.saved_rows, [compiler.saved_row_bytes(8)[o] for o in layout.loop_ops], layout.chunk)
    assert all(first[q] == -1 for q in range(len(layout.loop_ops)) if q not in plans)
    grads = {mode: _grads(block, mode, molecules, chunk_size=8) for mode in ("save", "recompute")}
    for a, b in zip(jax.tree_util.tree_leaves(grads["save"]), jax.tree_util.tree_leaves(grads["recompute"])):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_saved_backward_replays_dropout_masks():
    with enable_x64():
        block, _, examples = MODELS["tree_lstm"](dtype="float64", n=6)
        cell = next(b.layer for b in _functions(block) if isinstance(b.layer, fd.BinaryTreeLSTMCell))
        cell.recurrent_dropout = 0.4
        key = jax.random.key(7)
        _assert_same(_grads(block, "save", examples, key, chunk_size=8),
                     _grads(block, "recompute", examples, key, chunk_size=8))


def test_saved_backward_does_less_work():
    """The forward pass of every loop item is not run again: the compiled gradient has fewer FLOPs."""
    block, _, examples = MODELS["tree_lstm"](n=8)
    flops = {}
    for backward in ("recompute", "save"):
        compiler = fd.Compiler.create(block, backward=backward)
        params = compiler.init(jax.random.key(3))
        batch = compiler.build_batch(examples)
        grad = jax.jit(jax.grad(lambda p: jnp.sum(compiler.apply(p, batch).outputs ** 2)))
        cost = grad.lower(params).compile().cost_analysis()
        flops[backward] = (cost[0] if isinstance(cost, list) else cost)["flops"]
    assert flops["save"] < 0.95 * flops["recompute"], flops


def test_padded_rows_stay_finite_with_saved_rows():
    """Padded rows of an item reuse its first row, also for the saved matmul outputs: with
    ``log(y ** 2)`` (infinite derivative at 0) after the FC's matmul the gradients stay finite
    and equal the recomputing backward's."""
    fc = fd.FC(1, activation=lambda y: jnp.log(y ** 2), name="fc")
    model = fd.Map(fd.Vector(1)) >> fd.Fold(fd.Function(fc), fd.FromTensor(np.ones(1, np.float32))) \
        >> fd.Function(lambda y: y[:, 0])
    examples = [[[3.0]] * n for n in (1, 3, 6, 2)]
    grads = {}
    for backward in ("recompute", "save"):
        compiler = fd.Compiler.create(model, backward=backward)
        params = {"fc": {"w": jnp.ones((2, 1)), "b": jnp.zeros((1,))}}
        batch = compiler.build_batch(examples)
        grads[backward] = jax.jit(jax.grad(lambda p: jnp.sum(compiler.apply(p, batch).outputs)))(params)
        assert all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree_util.tree_leaves(grads[backward]))
    for a, b in zip(jax.tree_util.tree_leaves(grads["save"]), jax.tree_util.tree_leaves(grads["recompute"])):
        np.testing.assert_allclose(a, b, rtol=1e-5)


def _fc_fold(width: int) -> fd.Block:
    """A fold of ``FC(width)`` over a sequence of vectors: one loop operation, whose only matmul
    output has ``width`` floats per row."""
    return (fd.Map(fd.Vector(width)) >> fd.Fold(fd.Concat() >> fd.Function(fd.FC(width)),
                                                fd.FromTensor(np.zeros(width, np.float32)))
            >> fd.Function(lambda y: jnp.sum(y, axis=1)))


def test_saved_row_bytes_are_the_matmul_outputs():
    compiler = fd.Compiler.create(_fc_fold(3), backward="save")
    (o,) = [i for i, op in enumerate(compiler.program.ops) if isinstance(op.layer, fd.FC)]
    for chunk in compiler.chunk_sizes:
        row_bytes = compiler.saved_row_bytes(chunk)
        assert row_bytes[o] == 3 * 4  # the FC's matmul output: 3 float32 per row
        assert [b for i, b in enumerate(row_bytes) if i != o] == [0] * (len(row_bytes) - 1)  # no matmuls
        assert len(row_bytes) == len(compiler.program.ops) > 1


def test_auto_saves_when_the_saved_buffers_fit_the_limit():
    # FC(128) on 256 inputs: 2 * 256 FLOPs per saved float, 128 per byte (>= SAVE_INTENSITY).
    examples = [[[1.0] * 128] * n for n in (2, 5, 9)]
    compiler = fd.Compiler.create(_fc_fold(128), backward="save")
    saved = compiler.build_batch(examples).layout
    (q,) = [q for q, o in enumerate(saved.loop_ops) if isinstance(compiler.program.ops[o].layer, fd.FC)]
    need = (saved.saved_rows[q] + saved.chunk) * 128 * 4  # the FC's buffer: rows + C dump rows
    for limit, saves in ((need, True), (need - 1, False), (0, False)):
        layout = fd.Compiler.create(_fc_fold(128), save_limit=limit).build_batch(examples).layout
        assert layout.saved_rows == (saved.saved_rows if saves else ()), limit
    assert fd.Compiler.create(_fc_fold(128)).build_batch(examples).layout == saved  # far below the default limit
    assert fd.Compiler.create(_fc_fold(128), backward="recompute").build_batch(examples).layout.saved_rows == ()


def test_the_default_limit_saves_table1_at_batch_32_and_recomputes_sst_at_256():
    """``SAVE_LIMIT`` sits between what saving gains (Table 1 trees at batch 32, 25.6 MiB saved:
    steps 0.73-0.85x as long) and where it only doubles the temporaries (SST at batch 256, 29-32
    MiB: 0.98x; ``benchmarks.backward``): at 32 MiB, with the saved buffers at their items' rows, most
    SST batches of 256 saved and the memory benchmark's step held 5.3x its activations."""
    import random

    from benchmarks import models
    from examples import sst
    from tests.examples.test_tagger import SAMPLE

    rng = random.Random(0)
    table1 = fd.Compiler.create(models.table1_model(256, 128) >> fd.Metric("out"))
    trees = [models.random_tree(rng, 128) for _ in range(64)]
    assert table1.build_batch(trees[:32]).layout.saved_rows
    assert not table1.build_batch(trees).layout.saved_rows
    sample = sst.load("train", SAMPLE)
    tree_lstm = fd.Compiler.create(models.sst_model(sst.vocabulary(sample), 150))
    # The sample's first 200 trees save 24.9 MiB, its first 208 30.8 MiB (as SST's batches of 256).
    assert tree_lstm.build_batch(sample[:200]).layout.saved_rows
    assert not tree_lstm.build_batch(sample[:208]).layout.saved_rows


@pytest.mark.parametrize("width, worth", [(3, False), (60, False), (68, True), (128, True)])
def test_auto_saves_only_operations_worth_saving(width, worth):
    """FC(width) on 2 * width inputs costs a little over width FLOPs per byte it would save
    (2 * 2w * w for the matmul, a few per row for bias and activation, against 4w bytes): ``auto``
    keeps it only from SAVE_INTENSITY = 64 up; ``save`` always keeps it."""
    examples = [[[1.0] * width] * n for n in (2, 5, 9)]
    save, auto = (fd.Compiler.create(_fc_fold(width), backward=b) for b in ("save", "auto"))
    (o,) = [i for i, op in enumerate(auto.program.ops) if isinstance(op.layer, fd.FC)]
    flops = auto.executor.flops_per_row(o, auto.init(jax.random.key(0)))
    assert 4 * width * width <= flops <= 4 * width * width + 4 * width
    assert save.saved_row_bytes(128)[o] == width * 4
    assert auto.saved_row_bytes(128)[o] == (width * 4 if worth else 0)
    assert bool(auto.build_batch(examples).layout.saved_rows) == worth
    assert save.build_batch(examples).layout.saved_rows


@pytest.mark.parametrize("limit", [0, 2**30])
@pytest.mark.parametrize("name", ["tree_lstm", "calculator"])
def test_auto_gives_the_recomputed_gradients(name, limit):
    with enable_x64():
        block, _, examples = MODELS[name](dtype="float64", n=8)
        _assert_same(_grads(block, "auto", examples, chunk_size=8, save_limit=limit),
                     _grads(block, "recompute", examples, chunk_size=8))


def test_models_without_matmuls_save_nothing():
    """Nothing to save: no saved buffers, in either mode, so no extra layout size to compile."""
    model = fd.Map(fd.Scalar()) >> fd.Fold(fd.Function(lambda h, x: jnp.tanh(h + x)), fd.FromTensor(np.float32(0)))
    for backward in ("save", "auto"):
        compiler = fd.Compiler.create(model, backward=backward)
        assert compiler.saved_row_bytes(8) == (0,) * len(compiler.program.ops)
        batch = compiler.build_batch([[1.0] * 9, [3.0] * 4])
        assert batch.layout.loop_ops and batch.layout.saved_rows == ()
        assert compiler.stats().saving == 0


class _HostSeededFC(fd.Layer):
    """A layer whose init draws on the host from a seed it reads off the key: not traceable."""

    def init(self, key: jax.Array, input_type: fd.Type) -> dict:
        rng = np.random.default_rng(int(jax.random.randint(key, (), 0, 1000)))
        return {"w": jnp.asarray(rng.normal(size=(4, 2)), jnp.float32)}

    def apply(self, params: dict, x: jax.Array) -> jax.Array:
        return jnp.tanh(x @ params["w"])


def test_saved_row_bytes_of_a_layer_whose_init_cannot_be_traced():
    model = fd.Map(fd.Vector(2)) >> fd.Fold(fd.Concat() >> _HostSeededFC(), fd.FromTensor(np.zeros(2, np.float32)))
    compiler = fd.Compiler.create(model, backward="save")
    (o,) = [i for i, op in enumerate(compiler.program.ops) if isinstance(op.layer, _HostSeededFC)]
    assert compiler.saved_row_bytes(128)[o] == 2 * 4
    assert compiler.build_batch([[[1.0, 2.0]] * 5]).layout.saved_rows
    # ``auto`` also counts its FLOPs from concrete parameters: 4 * 2 per row, too few to save.
    auto = fd.Compiler.create(model)
    assert auto.saved_row_bytes(128)[o] == 0 and auto._saving.flops_per_row[o] >= 16


def test_the_scheduler_never_prices_saving(monkeypatch):
    """Building a batch is NumPy only (workers run it): the save policy, which traces JAX, decides
    afterwards in the compiler's process."""
    compiler = fd.Compiler.create(_fc_fold(128), chunk_size=8)

    def traced(*args):
        raise AssertionError("the scheduler priced saving")

    monkeypatch.setattr(compiler.executor, "saved_row_bytes", traced)
    monkeypatch.setattr(compiler.executor, "flops_per_row", traced)
    batch = compiler._batcher.build_own([[[1.0] * 128] * 5])
    assert batch.layout.saved_rows == () and batch.stats.saved_rows
    monkeypatch.undo()
    assert compiler._saving.decide(batch).layout.saved_rows


def test_auto_decides_the_same_in_workers():
    """Batches built by workers (forked) are decided in the parent, as build_batch decides."""
    examples = [[[1.0] * 128] * n for n in range(1, 13)]
    compiler = fd.Compiler.create(_fc_fold(128), chunk_size=8)
    built = list(compiler.batches(examples, 4, num_workers=1))
    assert [b.layout for b in built] == [compiler.build_batch(examples[i:i + 4]).layout for i in (0, 4, 8)]
    assert all(b.layout.saved_rows for b in built)


def test_unknown_backward_is_a_clear_error():
    with pytest.raises(ValueError, match=r"backward must be one of \('auto', 'recompute', 'save'\), got 'keep'"):
        fd.Compiler.create(fd.Scalar() >> fd.Function(jnp.sin), backward="keep")


@pytest.mark.parametrize("limit", [-1, 1.5, True, "16M"])
def test_bad_save_limit_is_a_clear_error(limit):
    with pytest.raises(ValueError, match=r"save_limit must be a number of bytes >= 0, got"):
        fd.Compiler.create(fd.Scalar() >> fd.Function(jnp.sin), save_limit=limit)
