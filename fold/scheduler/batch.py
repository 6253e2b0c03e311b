"""A built batch: its index arrays (``BatchArrays``), its static ``BatchLayout`` and host stats.

Notation (see ``docs/design.md``): ``A`` is the batch's size class (a power of two bounding
its rows, nodes and metric entries), ``C`` the most rows of a loop work item, ``B`` the number
of examples. Nodes (operation calls) are numbered in sorted (step, operation) order; a *group*
is one operation's nodes at one step (its depth, or a step of ``levels.py``); each arena type's
rows hold its constants, then node outputs, then ``C`` dump rows for padded writes.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import NamedTuple

import numpy as np

from fold.blocks.base import Repeat
from fold.blocks.host import HostValue
from fold.blocks.types import BroadcastSequenceType, SequenceType, TensorType, TupleType, Type, VoidType
from fold.fields import documented
from fold.typing import PyObject

__all__ = ["Batch", "BatchArrays", "BatchLayout", "BatchStats", "GroupArrays", "HostInfo", "MetricArrays"]


@documented
class BatchLayout(NamedTuple):
    """The static (hashable) part of a batch: it decides what JAX traces."""

    size_class: int           # A: the most rows any arena type may need (a power of two)
    num_examples: int         # B: the examples, exactly
    loop_ops: tuple[int, ...]           # operations with work items, sorted
    hoist_ops: tuple[int, ...]          # operations with depth-1 groups, sorted
    const_types: tuple[int, ...]        # arena types that have a constant table
    tail_ops: tuple[int, ...] = ()      # operations of the groups run after the loop, in order
    tail_sizes: tuple[int, ...] = ()    # their padded row counts (powers of two)
    hoist_sizes: tuple[int, ...] = ()   # padded row counts of the hoisted groups (powers of two)
    arena_rows: tuple[int, ...] = ()    # per arena type, rows before its C dump rows (powers of two <= A)
    chunk: int = 128          # C: the most rows of a work item, and each arena's dump rows
    saved_rows: tuple[int, ...] = ()    # if the backward saves: per loop operation, rows of its saved buffers before C
    #                           spill rows (set by fold/compiler/saving.py, not by the scheduler)
    item_rows: tuple[int, ...] = ()     # per loop operation, its items' mean rows rounded up to a power of two
    #                           (where the executor computes its parameters' cotangents, ``_weights_after``)


class GroupArrays(NamedTuple):
    """The groups run whole, before the loop (hoisted) or after it (tail), ``G`` of them."""

    node: np.ndarray   # [G] int32: the group's first node
    count: np.ndarray  # type: ignore[assignment]  # [G] int32: its nodes (0 for a group a padded layout adds)
    out: np.ndarray    # [G, slots] int32: per output slot, the arena row of the group's first output


class MetricArrays(NamedTuple):
    """One metric's entries, padded to ``A``."""

    rows: np.ndarray     # [A] int32: arena row of each entry's value
    mask: np.ndarray     # [A] bool: real entries
    example: np.ndarray  # [A] int32: the example each entry came from (-1: padding)


class BatchArrays(NamedTuple):
    """The device side of a batch (a pytree of NumPy arrays)."""

    consts: dict[str, np.ndarray]  # {str(type): [arena_rows[type], *shape]}: constants, for types that have any
    in_idx: np.ndarray    # [A + C, most inputs] int32: per node, the arena row of each input
    hoist: GroupArrays    # groups run before the loop, sorted by operation
    tail: GroupArrays     # groups run after the loop, in order
    items_branch: np.ndarray  # [A] int32: per work item, its branch: loop_ops position * item sizes + size
    items_node: np.ndarray    # [A] int32: its first node
    items_count: np.ndarray   # [A] int32: its real rows
    items_out: np.ndarray     # [A, slots] int32: per output slot, the arena row it writes its C rows from
    items_saved: np.ndarray   # [A] int32: its offset in its operation's region of the saved buffers
    n_items: np.ndarray       # [] int32: the work items (iterations of the loop)
    roots: list[np.ndarray]   # per root tensor leaf: [B] int32, each example's arena row
    metrics: dict[str, MetricArrays]  # {metric name: MetricArrays}


@documented
class BatchStats(NamedTuple):
    """What a batch holds, for benchmarks and bucket occupancy (host only)."""

    num_nodes: int            # operation calls
    num_items: int            # loop work items (iterations of the while_loop)
    max_depth: int            # the schedule's last step (tail included; the deepest depth where depths stay)
    rows: int                 # arena rows used by the fullest type (<= size_class)
    type_rows: tuple[int, ...]          # arena rows used, per arena type (constants and node outputs)
    saved_rows: tuple[int, ...] = ()  # per loop operation, rows its items would save (fold/compiler/saving.py decides)
    group_rows: tuple[int, ...] = ()  # rows of each loop group (the node calls of one operation at one step)


class HostInfo(NamedTuple):
    """Where each value id landed: arena type and row (for ``eval``)."""

    v_type: np.ndarray
    v_row: np.ndarray

    def read(self, value: HostValue, t: Type, arenas: Mapping[int, np.ndarray]) -> PyObject:
        """Host value ``value`` of type ``t`` with its tensors read from the computed ``arenas``:
        tensors as NumPy arrays, tuples as tuples, sequences as lists, broadcast sequences as
        ``itertools.repeat``, void as None and Python objects as they are."""
        if isinstance(t, TensorType):
            return np.array(arenas[int(self.v_type[value])][int(self.v_row[value])])
        if isinstance(t, TupleType):
            return tuple(self.read(i, it, arenas) for i, it in zip(value, t))
        if isinstance(t, BroadcastSequenceType):
            return itertools.repeat(self.read(value.value if isinstance(value, Repeat) else value, t.element_type,
                                              arenas))
        if isinstance(t, SequenceType):
            return [self.read(i, t.element_type, arenas) for i in value]
        if isinstance(t, VoidType):
            return None
        return value


class Batch:
    """A built batch: its index arrays (``arrays``, a ``BatchArrays``) plus its static ``layout``.

    It is a JAX pytree, so it can be passed to jitted functions; batches
    with equal layouts share one compilation. ``stats`` (a ``BatchStats``)
    is host-side only and is None inside traced code. ``owner`` identifies
    the compiler that built it (static, like the layout): a compiler
    refuses another's batches, whose rows mean another model's values.
    ``example_indices`` says which examples it holds, row by row: their
    positions in what was given to ``Compiler.batches`` (so a shuffled
    batch's outputs pair with labels kept outside the examples), or to
    ``build_batch`` (positions in the recording for recorded examples).
    ``metric_labels`` holds the labels of labeled ``Metric``s.
    """

    def __init__(self, arrays: BatchArrays, layout: BatchLayout, host: HostInfo | None = None,
                 stats: BatchStats | None = None, owner: str | None = None,
                 metric_labels: dict[str, list[PyObject]] | None = None):
        self.arrays = arrays
        self.layout = layout
        self.host = host  # per-value rows, kept for eval; not part of the pytree
        self.stats = stats
        self.owner = owner
        # Per labeled metric, each real entry's label, in the order of ``result.metrics[name].values``.
        self.metric_labels = {} if metric_labels is None else metric_labels
        # Which examples it holds, in order (``Compiler.build_batch`` and ``batches`` set it).
        self.example_indices: np.ndarray | None = None

    def replace(self, arrays: BatchArrays | None = None, layout: BatchLayout | None = None) -> Batch:
        """This batch with other arrays or another layout (same host info, stats and owner)."""
        out = Batch(self.arrays if arrays is None else arrays, self.layout if layout is None else layout,
                    self.host, self.stats, self.owner, self.metric_labels)
        out.example_indices = self.example_indices
        return out

    def built_stats(self) -> BatchStats:
        """``stats``, which every batch built on the host has (a batch inside traced code has none)."""
        if self.stats is None:
            raise ValueError("this batch has no stats: it was rebuilt inside traced code")
        return self.stats

    def __repr__(self) -> str:
        nodes = f", nodes={self.stats.num_nodes}" if self.stats is not None else ""
        return f"Batch(examples={self.layout.num_examples}, size_class={self.layout.size_class}{nodes})"


def _flatten_batch(b: Batch) -> tuple[tuple[BatchArrays], tuple[BatchLayout, str | None]]:
    return (b.arrays,), (b.layout, b.owner)


def _unflatten_batch(static: tuple[BatchLayout, str | None], children: tuple[BatchArrays]) -> Batch:
    layout, owner = static
    return Batch(children[0], layout, owner=owner)


def _register() -> None:
    import jax  # the one JAX use of the scheduler: a Batch is a pytree

    jax.tree_util.register_pytree_node(Batch, _flatten_batch, _unflatten_batch)


_register()
