"""``Compiler.check_numerics``: the first example and operation whose value or gradient is not finite.

One NaN in one example's input makes every parameter's gradient NaN, even when that example is
masked out of the loss: the batched backward matmul multiplies the masked rows' zero cotangents
by the NaN activations, and 0 x NaN is NaN. Batching cannot avoid that, so this finds the
example instead: it builds the examples into one batch, keeping where every value lives, runs the
forward pass and reads every value row; the first non-finite value, in the order the walk made
them, is where the trouble starts (values computed from it come later). If every value is finite
it takes the gradient of each example's loss in a batch of its own (one backward pass per example,
in the few layouts of a second compiler) and names the first example whose gradient is not finite.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fold.compiler.executor import Arenas
from fold.compiler.result import Result
from fold.scheduler.batch import Batch
from fold.scheduler.builder import BatchBuilder
from fold.scheduler.program import Program
from fold.typing import Params, PyObject

__all__ = ["check_arguments", "check_values", "check_gradients"]


def _example_losses(result: Result, n: int) -> jax.Array:
    """The default per-example loss: the sum of every output and metric value of each example
    (so a gradient reaches everything the examples compute)."""
    total = jnp.zeros(n)
    for leaf in jax.tree_util.tree_leaves(result.outputs):
        total = total + leaf.reshape(n, -1).sum(axis=1)
    for m in result.metrics.values():
        values = m.padded.reshape(m.padded.shape[0], -1).sum(axis=1)
        total = total.at[jnp.where(m.mask, m.example, n)].add(values, mode="drop")
    return total


def _name(i: int, dataset_indices: Sequence[int] | None) -> str:
    return f"example {i}" if dataset_indices is None else f"example {dataset_indices[i]} (position {i})"


def check_arguments(examples: list[PyObject], dataset_indices: Sequence[int] | None) -> None:
    """Raises ValueError for no examples, or indices that do not match them."""
    if not examples:
        raise ValueError("check_numerics needs at least one example")
    if dataset_indices is not None and len(dataset_indices) != len(examples):
        raise ValueError(f"dataset_indices has {len(dataset_indices)} entries for {len(examples)} examples")


def check_values(program: Program, builder: BatchBuilder, batch: Batch, arenas: Arenas,
                 dataset_indices: Sequence[int] | None) -> None:
    """Raises FloatingPointError naming the first non-finite value of ``batch`` (built keeping its
    host info by ``builder``), given the ``arenas`` its forward pass filled."""
    host = batch.host
    assert host is not None  # built with keep_host=True
    bad: list[int] = []
    for t, arena in ((t, np.asarray(a)) for t, a in arenas.items()):
        if not jnp.issubdtype(arena.dtype, jnp.inexact):
            continue
        ids = np.flatnonzero(host.v_type == t)
        if not len(ids):
            continue
        rows = arena[host.v_row[ids]].reshape(len(ids), -1)
        bad.extend(ids[~np.isfinite(rows).all(axis=1)].tolist())
    if not bad:
        return
    v = min(bad)  # the walk made values in order: later ones may come from this one
    rec = builder.arrays()
    i = int(np.searchsorted(builder.value_starts, v, side="right")) - 1
    ttype = program.types[int(host.v_type[v])]
    node = int(rec.v_node[v])
    if node < 0:
        source = f"an input value of type {ttype} (a constant the host made from the example)"
    else:
        source = f"the output of {program.ops[int(rec.n_op[node])].spec.label} (type {ttype})"
    value = np.asarray(arenas[int(host.v_type[v])])[host.v_row[v]]
    raise FloatingPointError(f"{_name(i, dataset_indices)}: {source} is not finite: {value.tolist()}")


def check_gradients(apply: Callable[[Params, Batch], Result], build: Callable[[list[PyObject]], Batch],
                    params: Params, examples: list[PyObject], loss: Callable[[Result], jax.Array] | None,
                    dataset_indices: Sequence[int] | None) -> None:
    """Raises FloatingPointError naming the first example whose loss has a non-finite gradient, each
    example in a batch of its own that ``build`` makes from a list of it and ``apply`` runs (a
    compiler kept for this, whose layouts the caller's do not share). Within one batch, an example
    whose local derivative is infinite poisons the others' gradients (0 x inf), as a NaN value does."""

    def total_loss(p: Params, b: Batch) -> jax.Array:
        result = apply(p, b)
        per_example = _example_losses(result, 1) if loss is None else jnp.asarray(loss(result))
        if per_example.shape != (1,):
            raise ValueError(f"loss must return one value per example of the batch it gets, shape (1,) for "
                             f"the batches of one example check_numerics takes gradients of, got {per_example.shape}")
        return per_example[0]

    grad = jax.jit(jax.grad(total_loss))
    for i, x in enumerate(examples):
        g = grad(params, build([x]))
        for path, leaf in jax.tree_util.tree_flatten_with_path(g)[0]:
            if not np.isfinite(np.asarray(leaf)).all():
                raise FloatingPointError(f"{_name(i, dataset_indices)}: the gradient of its loss is not finite in "
                                         f"params{jax.tree_util.keystr(path)} (its values are all finite)")
