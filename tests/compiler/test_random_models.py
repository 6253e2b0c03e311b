"""Outputs and gradients of every backward mode against an independent per-example reference.

Models whose loop operations share saved buffers (several operations saving rows of one shape,
interleaved at the same depths), and random models from ``benchmarks.random_models`` with a random
``C`` and backward mode: a batching bug anywhere in the schedule, the loop or the saved buffers
shows as a difference from the per-example ``jax.numpy`` reference.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fold as fd
from benchmarks.fuzz import MODES, comparer, random_params
from benchmarks.random_models import RandomModel, fc_reference, random_model
from tests.params import diagonal

# Saving is what these shapes exercise; the other backward modes run them under -m slow.
SAVE_IN_CI = ["save", *(pytest.param(m, marks=pytest.mark.slow) for m in MODES if m != "save")]

# "auto" saves a loop FC when its input is at least this wide (SAVE_INTENSITY FLOPs per saved byte).
WIDE = 128


def _check(model: RandomModel, backward: str, chunk: int | tuple, seed: int = 0) -> fd.Batch:
    """Asserts that ``model``'s batched outputs and gradients equal its reference's, example by
    example; returns the batch."""
    compiler = fd.Compiler.create(model.block, backward=backward, chunk_size=chunk)
    params = random_params(compiler, seed)
    # The batch's own layout: padding it with room to spare would hide writes past a region's end
    # (tests/scheduler/test_layouts.py checks padded batches).
    batch = compiler.build_batch(model.examples, exact_layout=True)
    comparer(compiler, model, seed)(params, batch, model.examples,
                                    f"{model.text} (backward={backward}, chunk={chunk})")
    return batch


def _folds(widths: tuple, w: int, n: int = 7, seed: int = 0) -> RandomModel:
    """A ``Fold`` with an FC of its own per input width, over sequences of that width, the results
    concatenated into a linear readout: the folds' FCs run at the same depths and save rows of
    one shape."""
    fcs = [fd.FC(w, activation=jnp.tanh) for _ in widths]
    readout = fd.FC(1, activation=None)
    folds = [fd.Map(fd.Vector(k)) >> fd.Fold(fd.Concat() >> fd.Function(fc), fd.Zeros(fd.TensorType((w,))))
             for k, fc in zip(widths, fcs)]
    block = fd.Record(tuple(folds)) >> fd.Concat() >> fd.Function(readout)

    def reference(p: dict, example: tuple) -> jax.Array:
        states = []
        for fc, xs in zip(fcs, example):
            h = jnp.zeros(w, jnp.float32)
            for x in xs:
                h = fc_reference(fc, jnp.concatenate([h, jnp.asarray(x, jnp.float32)]), p)
            states.append(h)
        return fc_reference(readout, jnp.concatenate(states), p)

    rng = np.random.default_rng(seed)
    examples = [tuple(rng.normal(size=(int(rng.integers(0, 8)), k)).round(3).tolist() for k in widths)
                for _ in range(n)]
    examples[0] = tuple(rng.normal(size=(7 - j, k)).round(3).tolist() for j, k in enumerate(widths))
    return RandomModel(block, reference, examples, f"Folds{widths} of width {w}")


def _tree(w: int, n: int = 6, seed: int = 0) -> RandomModel:
    """Trees whose leaves (``OneHot >> FC >> FC``), binary nodes and n-ary nodes each end in an FC
    of width ``w``: leaves and inner nodes save rows of one shape at the same depths."""
    leaf1, leaf2, pair, many = (fd.FC(w, activation=jnp.tanh) for _ in range(4))
    decl = fd.ForwardDeclaration(fd.PyObjectType(), fd.TensorType((w,)))
    decl.resolve_to(fd.OneOf(lambda t: t[0], {
        "leaf": fd.GetItem(1) >> fd.OneHot(0, 5) >> fd.Function(leaf1) >> fd.Function(leaf2),
        "pair": fd.GetItem(1) >> fd.Record((decl(), decl())) >> fd.Concat() >> fd.Function(pair),
        "list": fd.GetItem(1) >> fd.Map(decl()) >> fd.Sum() >> fd.Function(many),
    }))

    def reference(p: dict, t: tuple) -> jax.Array:
        if t[0] == "leaf":
            return fc_reference(leaf2, fc_reference(leaf1, jax.nn.one_hot(t[1], 5, dtype=jnp.float32), p), p)
        if t[0] == "pair":
            return fc_reference(pair, jnp.concatenate([reference(p, t[1][0]), reference(p, t[1][1])]), p)
        return fc_reference(many, jnp.sum(jnp.stack([reference(p, k) for k in t[1]]), axis=0), p)

    rng = np.random.default_rng(seed)

    def grow(depth: int) -> tuple:
        kind = "leaf" if depth == 0 else ("leaf", "pair", "list")[int(rng.integers(3))]
        if kind == "leaf":
            return ("leaf", int(rng.integers(5)))
        if kind == "pair":
            return ("pair", (grow(depth - 1), grow(depth - 1)))
        return ("list", [grow(depth - 1) for _ in range(int(rng.integers(1, 4)))])

    return RandomModel(decl(), reference, [grow(int(rng.integers(0, 5))) for _ in range(n)], f"Tree of width {w}")


# The diagonal saves in two of its three cases (save at width 8, auto at WIDE).
@pytest.mark.parametrize("backward, shape", diagonal(("save", "auto", "recompute"),
                                                     [(8, 8), (WIDE, 32), (2 * WIDE, 128)]))
def test_folds_sharing_a_saved_buffer(backward, shape):
    """Regression: an operation's last item wrote C rows into the next operation's region of a
    shared saved buffer, over rows saved earlier (a gradient error of 0.08 in the first FC)."""
    w, chunk = shape
    batch = _check(_folds((2, 3), w), backward, chunk)
    assert bool(batch.layout.saved_rows) == (backward == "save" or (backward == "auto" and w >= WIDE))


@pytest.mark.parametrize("backward", SAVE_IN_CI)
def test_three_folds_interleaved_at_the_same_depths(backward):
    batch = _check(_folds((2, 3, 4), WIDE), backward, 32)
    assert (sum(r > 0 for r in batch.layout.saved_rows) == 3) == (backward != "recompute")


@pytest.mark.parametrize("backward", SAVE_IN_CI)
def test_trees_whose_leaves_and_inner_nodes_save(backward):
    batch = _check(_tree(WIDE), backward, 32)
    assert (sum(r > 0 for r in batch.layout.saved_rows) == 3) == (backward != "recompute")


def _draw(seed: int) -> tuple:
    """Seed ``seed``'s model (every fourth one wide), chunk size and backward mode."""
    rng = np.random.default_rng(seed)
    chunk = (8, 16, 32, 128, (8, 32, 128))[int(rng.integers(5))]
    return random_model(seed, wide=seed % 4 == 3), MODES[int(rng.integers(3))], chunk


# Seed 3 is wide (it saves); seeds 1 and 2, like 4-215, run under -m slow (the fuzz draws more).
@pytest.mark.parametrize("seed", [0, 3, *(pytest.param(s, marks=pytest.mark.slow) for s in (1, 2))])
def test_random_model(seed):
    model, backward, chunk = _draw(seed)
    _check(model, backward, chunk, seed)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(4, 216))
def test_more_random_models(seed):
    model, backward, chunk = _draw(seed)
    _check(model, backward, chunk, seed)
