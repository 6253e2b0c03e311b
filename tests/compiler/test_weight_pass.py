"""Loop weight cotangents computed after the backward loop (``Executor._weight_pass``) against
the same cotangents added item by item."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import fold as fd
from examples import tagger
from fold.compiler.executor import DEFER_BATCH, WEIGHT_PASS_SHARE
from tests.compiler.test_backward import _assert_same, _grads
from tests.compiler.test_randomness import _functions
from tests.models import MODELS, enable_x64
from tests.params import diagonal


def _deferred(block: fd.Block, examples: list, key: jax.Array | None = None,
              weight_pass: bool | None = None) -> list[str]:
    """The layers whose loop cotangents a batch of ``examples`` leaves to the pass."""
    compiler = fd.Compiler.create(block)
    compiler.executor.weight_pass = weight_pass
    batch = compiler.build_batch(examples)
    layout = batch.layout
    params = compiler.init(jax.random.key(0))
    after = compiler.executor._weights_after(layout, params, key)
    return sorted(compiler.executor.ops[layout.loop_ops[q]].layer.name for q in after)


@pytest.mark.parametrize(("name", "setting"), diagonal(sorted(MODELS), [(8, "save"), (8, "recompute"),
                                                                       ((128, 512), "save")]))
def test_the_pass_gives_the_per_item_gradients(name, setting):
    # C = 8 cuts a depth into several items, with padded remainders, so an operation's rows come
    # from many items, and a saving batch reads its saved rows back from several regions.
    chunk, backward = setting
    with enable_x64():
        block, _, examples = MODELS[name](dtype="float64", n=8)
        _assert_same(_grads(block, backward, examples, weight_pass=True, chunk_size=chunk),
                     _grads(block, backward, examples, weight_pass=False, chunk_size=chunk))


def _chain(width: int) -> fd.Block:
    return fd.Map(fd.Vector(2)) >> fd.Fold(fd.Concat() >> fd.FC(width, name="cell"), fd.Zeros(width)) \
        >> fd.FC(1, name="out")


@pytest.mark.parametrize(("width", "examples", "deferred"), [(64, 1, True), (2, DEFER_BATCH, False),
                                                           (64, DEFER_BATCH + 1, False)])
def test_layers_whose_items_hold_few_rows_for_their_parameters_defer(width, examples, deferred):
    # A fold step's item holds one row per example: a 64-unit cell (8,384 parameter entries, 194
    # entries of input and output per row) over one chain defers; a 2-unit cell (10 entries, 6
    # per row) over 32 chains does not, nor does any cell in a batch of more than DEFER_BATCH.
    rng = np.random.default_rng(0)
    block = _chain(width)
    batch_examples = [rng.normal(size=(6, 2)).tolist() for _ in range(examples)]
    compiler = fd.Compiler.create(block)
    layout = compiler.build_batch(batch_examples).layout
    params = compiler.init(jax.random.key(0))
    q = next(q for q, o in enumerate(layout.loop_ops) if compiler.executor.ops[o].layer.name == "cell")
    share = compiler.executor.item_share(layout.loop_ops[q], params["cell"], layout.item_rows[q])
    assert (share <= WEIGHT_PASS_SHARE and examples <= DEFER_BATCH) == deferred
    assert _deferred(block, batch_examples) == (["cell"] if deferred else [])


def test_a_layer_that_draws_stays_in_the_loop():
    """A loop item's key depends on the item, so a cell with recurrent dropout adds its weight
    cotangents item by item, with the masks its forward pass drew."""
    def cell_of(block: fd.Block) -> fd.Layer:
        return next(b.layer for b in _functions(block) if isinstance(b.layer, fd.BinaryTreeLSTMCell))

    with enable_x64():
        block, _, examples = MODELS["tree_lstm"](dtype="float64", n=6)
        assert cell_of(block).name in _deferred(block, examples, weight_pass=True)
        block, _, examples = MODELS["tree_lstm"](dtype="float64", n=6, recurrent_dropout=0.4)
        cell = cell_of(block)
        key = jax.random.key(7)
        assert cell.name not in _deferred(block, examples, key, weight_pass=True)
        assert cell.name in _deferred(block, examples, None, weight_pass=True)  # no key: nothing draws
        _assert_same(_grads(block, "auto", examples, key, True, chunk_size=8),
                     _grads(block, "auto", examples, key, False, chunk_size=8))


@pytest.mark.slow  # 24 s; the per-model test above covers a chain (the RNN) in every backward mode
def test_a_bidirectional_tagger_gets_the_same_gradients():
    """Word and character LSTMs over chains (two of them reversed), an MLP per word and a loss per
    word: every loop operation has rows from many one- to four-row items."""
    args = tagger.parse_args(["--word-size", "6", "--hidden", "4", "--mlp-size", "3", "--char-size", "2"])
    rng = np.random.default_rng(0)
    words = ["the", "film", "x", "abc", "gooD"]
    examples = [{"words": [words[i] for i in rng.integers(0, 5, n)], "tags": rng.integers(0, 5, n).tolist()}
                for n in (1, 7, 3, 12, 5)]
    block = tagger.build_model({"the": 0, "film": 1}, {ch: i + 1 for i, ch in enumerate("abcdefghx")}, args)
    assert len(_deferred(block, examples, weight_pass=True)) >= 4

    def grads(weight_pass: bool) -> dict:
        compiler = fd.Compiler.create(block, chunk_size=8)  # one item size: one branch per operation
        compiler.executor.weight_pass = weight_pass
        batch = compiler.build_batch(examples)
        loss = jax.jit(jax.grad(lambda p: compiler.apply(p, batch).metrics["loss"].sum()))
        return loss(compiler.init(jax.random.key(1)))

    deferred, per_item = grads(True), grads(False)
    assert jax.tree_util.tree_structure(deferred) == jax.tree_util.tree_structure(per_item)
    for x, y in zip(jax.tree_util.tree_leaves(deferred), jax.tree_util.tree_leaves(per_item)):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-7)  # float32 sums in another order
