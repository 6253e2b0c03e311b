"""Records the tensor work of a batch of examples on the host.

``BatchBuilder`` is the ``ctx`` that blocks see during the host walk. It
issues an integer id for every tensor value: a constant (depth 0) or an
output of an operation call (a *node*, depth 1 + the deepest input).
``fold.scheduler.schedule`` then turns these lists into index arrays.

``run`` records one example with the model's host plan
(``fold/scheduler/plan.py``) and falls back to the generic ``walk`` for
examples the plan cannot take (errors, very deep recursion).
"""

from __future__ import annotations

import bisect
import contextlib
import gc
import os
import threading
from collections.abc import Hashable, Iterator, Sequence
from typing import NamedTuple

import numpy as np

from fold.blocks.base import Block
from fold.blocks.host import ConstValue, ExampleLimits, HostValue, OpBlock, Step
from fold.blocks.types import TensorType
from fold.scheduler.plan import host_plan
from fold.scheduler.program import Program
from fold.scheduler.walk import walk
from fold.typing import PyObject

__all__ = ["BatchBuilder", "ExampleChunk", "Recorded", "gc_paused", "const_table", "run_examples"]




_gc_lock = threading.Lock()
_gc_pausers = 0  # builds under way (batches may be built on a background thread beside the caller's)
_gc_was_enabled = True  # the collector's state when the first of them began


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pauses Python's cyclic garbage collector while a batch is built.

    Building allocates tens of thousands of small tuples per batch, and
    every few hundred allocations the collector would traverse the young
    objects and, now and then, the whole heap, including the user's
    dataset (often millions of nested Python objects). Nothing a build
    allocates needs the cycle collector, so it runs again afterwards; for
    that to cost nothing, what outlives a build must not be per node (the
    builder keeps ints in flat lists) and must not form cycles
    (``BatchBuilder.finish``), or the first allocation after the build
    pays for a collection.

    The collector is process-wide and builds may overlap on several threads,
    so it is paused by the first build and resumed by the last (if it was
    enabled when the first began).
    """
    global _gc_pausers, _gc_was_enabled
    with _gc_lock:
        if _gc_pausers == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_pausers += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_pausers -= 1
            if _gc_pausers == 0 and _gc_was_enabled:
                gc.enable()


def _after_fork_in_child() -> None:
    """A forked worker has only the thread that forked: builds under way on others never end there."""
    global _gc_lock, _gc_pausers
    _gc_lock = threading.Lock()  # another thread may have held it at the fork
    if _gc_pausers and _gc_was_enabled:
        gc.enable()
    _gc_pausers = 0


os.register_at_fork(after_in_child=_after_fork_in_child)


class Recorded(NamedTuple):
    """Recorded work as arrays: what ``schedule`` reads (``BatchBuilder.arrays``, or recorded
    examples merged into a batch). Value and node ids are positions in these arrays."""

    v_type: np.ndarray          # per value id: arena (type) index
    v_node: np.ndarray          # producing node, -1 for a constant
    v_pos: np.ndarray           # constant's index in its type's table, or the node's output j
    n_op: np.ndarray            # per node: operation index
    n_depth: np.ndarray         # depth (1 + the deepest input)
    n_inputs: np.ndarray        # input value ids of every node, node after node
    # Per type: (values, shape (n, *type shape), zero where not filled; filled, (n,) bool).
    consts: list[tuple[np.ndarray, np.ndarray]]
    metric_values: dict[str, np.ndarray]  # per metric: value id of each entry
    metric_examples: dict[str, np.ndarray]  # per metric: example index of each entry
    metric_labels: dict[str, list[PyObject]]  # per labeled metric: each entry's label (None if unlabeled)


def const_table(values: Sequence[ConstValue], t: TensorType) -> tuple[np.ndarray, np.ndarray]:
    """One type's constants as ``(values, filled)`` (see ``Recorded.consts``); ``None`` is zeros."""
    n = len(values)
    filled = np.fromiter((v is not None for v in values), bool, n)
    if filled.all():
        return np.asarray(values, t.dtype).reshape(n, *t.shape), filled
    table = np.zeros((n, *t.shape), t.dtype)
    if filled.any():
        table[filled] = np.asarray([v for v in values if v is not None], t.dtype).reshape(-1, *t.shape)
    return table, filled


class _Mark(NamedTuple):
    """How long the builder's lists and memos were when an example began (``_rollback``)."""

    values: int
    nodes: int
    inputs: int
    consts: list[int]
    metrics: dict[str, int]
    shared: int
    cached: int


class BatchBuilder:
    """Host-side recorder of constants, operation calls and metrics for one batch."""

    def __init__(self, program: Program):
        self.program = program
        self.example_index: int | None = None
        self.example_start = 0  # the current example's first node
        self.value_starts: list[int] = []  # each example's first value id
        # Where each example of the batch sits in the dataset the user gave (``Compiler.batches``).
        self.dataset_indices: Sequence[int] | None = None
        # Per tensor value id, its depth (0 for a constant, at least 1 for a node's output). What
        # else ``Recorded`` holds per value (type, producing node, position) follows from the
        # nodes' first values and the constants' ids (``arrays``), so that the walk appends to one
        # list per value, not four (docs/performance.md, "Host: building schedules").
        self.v_depth: list[int] = []
        # Per type: the constants' values and value ids, in order.
        self.consts: list[list[np.ndarray | None]] = [[] for _ in program.types]
        self.const_vids: list[list[int]] = [[] for _ in program.types]
        # Per node: operation index, depth and first output's value id (its outputs are that and
        # the ids after it); the input value ids of all nodes in one flat list (an operation
        # always takes the same number of inputs).
        self.n_op: list[int] = []
        self.n_depth: list[int] = []
        self.n_first: list[int] = []
        self.n_inputs: list[int] = []
        # Per metric, each entry's example index and value id, in two flat lists: a tuple per
        # entry would be an object that outlives the build for the cycle collector to traverse
        # (see gc_paused).
        self.metric_examples: dict[str, list[int]] = {name: [] for name in program.metric_types}
        self.metric_values: dict[str, list[int]] = {name: [] for name in program.metric_types}
        self.metric_labels: dict[str, list[PyObject]] = {name: [] for name in program.labeled_metrics}
        self._shared: dict[Hashable, int] = {}
        # Per-batch memo for blocks whose host value is the same every call (Zeros).
        self.block_cache: dict[Hashable, HostValue] = {}
        # (declaration, input object) of each recursive call the walk is in (see ``recursing``).
        self.recursing: set[tuple[int, int]] = set()
        self._plan_run, self._callers, self._const_makers, self._release = host_plan(program).bind(self)

    def run(self, x: PyObject) -> HostValue:
        """Records example ``x`` (index ``self.example_index``) and returns its host value.

        The plan is tried first; if it raises, everything it recorded for
        ``x`` is undone and ``walk`` runs ``x`` again, raising the error
        with the example index and block path (or succeeding where the plan
        only ran out of recursion depth).
        """
        mark = self._mark()
        self.value_starts.append(mark[0])
        self.example_start = mark[1]
        try:
            out = self._plan_run(x, 0)
        except Exception:
            self._rollback(mark)
        else:
            self.check_size()
            return out
        self.recursing.clear()  # what a failed walk left
        out = walk(self.program.root, x, self)
        self.check_size()
        return out

    @property
    def limits(self) -> ExampleLimits:
        """Bounds on one example's host work (the program's)."""
        return self.program.limits

    def check_size(self) -> None:
        """Raises ValueError if the current example has more operation calls than
        ``ExampleLimits.max_nodes`` (the walk checks at every recursive call, the plan at the end)."""
        nodes = len(self.n_op) - self.example_start
        if nodes > self.limits.max_nodes:
            raise ValueError(f"{self.where()} makes more than {self.limits.max_nodes:,} operation calls "
                             f"({nodes:,} so far): raise the limit with Compiler.create(max_example_nodes=...) "
                             "if the example is meant to be this large")

    def finish(self) -> None:
        """Ends recording. The plan's entry points are closures over this builder and each
        other; breaking those cycles lets the builder's lists (tens of thousands of ints) be
        freed as soon as the last reference goes, not by the cycle collector, which would
        traverse everything young (and now and then the whole heap) to find them."""
        self._release()
        del self._plan_run, self._callers, self._const_makers, self._release

    def arrays(self) -> Recorded:
        """What was recorded, as arrays."""
        def ints(values: list[int]) -> np.ndarray:
            return np.asarray(values, np.int64)

        n_op = ints(self.n_op)
        v_type, v_node, v_pos = self._value_sources(n_op)
        return Recorded(v_type, v_node, v_pos, n_op,
                        ints(self.n_depth), ints(self.n_inputs),
                        [const_table(c, t) for c, t in zip(self.consts, self.program.types)],
                        {k: ints(v) for k, v in self.metric_values.items()},
                        {k: ints(v) for k, v in self.metric_examples.items()},
                        {k: list(v) for k, v in self.metric_labels.items()})

    def _value_sources(self, n_op: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Each value's type, producing node (-1 for a constant) and position (the constant's index
        in its type's table, or the node's output j), from the nodes (``n_op`` as an array) and the
        constants' ids."""
        n_values = len(self.v_depth)
        v_type, v_node, v_pos = np.empty(n_values, np.int64), np.empty(n_values, np.int64), np.empty(n_values, np.int64)
        ops = self.program.ops
        n_out = np.asarray([len(op.out_tidx) for op in ops], np.int64)
        out_type = np.zeros((len(ops), max(n_out, default=0)), np.int64)
        for o, op in enumerate(ops):
            out_type[o, :n_out[o]] = op.out_tidx
        counts = n_out[n_op]
        node = np.repeat(np.arange(len(n_op)), counts)
        j = np.arange(len(node)) - np.repeat(np.cumsum(counts) - counts, counts)
        vid = np.repeat(np.asarray(self.n_first, np.int64), counts) + j
        v_type[vid], v_node[vid], v_pos[vid] = out_type[n_op[node], j], node, j
        for t, vids in enumerate(self.const_vids):
            v_type[vids], v_node[vids], v_pos[vids] = t, -1, np.arange(len(vids))
        return v_type, v_node, v_pos

    def _mark(self) -> _Mark:
        return _Mark(len(self.v_depth), len(self.n_op), len(self.n_inputs), [len(c) for c in self.consts],
                     {k: len(v) for k, v in self.metric_values.items()}, len(self._shared), len(self.block_cache))

    def _rollback(self, mark: _Mark) -> None:
        n_values, n_nodes, n_flat, n_consts, n_metrics, n_shared, n_cached = mark
        del self.v_depth[n_values:]
        for nodes in (self.n_op, self.n_depth, self.n_first):
            del nodes[n_nodes:]
        del self.n_inputs[n_flat:]
        for table, vids, n in zip(self.consts, self.const_vids, n_consts):
            del table[n:]
            del vids[n:]
        for name, n in n_metrics.items():
            del self.metric_examples[name][n:]
            del self.metric_values[name][n:]
            if name in self.metric_labels:
                del self.metric_labels[name][n:]
        # Dicts keep insertion order: the entries made for this example come last.
        for memo, n in ((self._shared, n_shared), (self.block_cache, n_cached)):
            for key in list(memo)[n:]:
                del memo[key]

    def const(self, ttype: TensorType, value: ConstValue) -> int:
        """A depth-0 constant: an array of ``ttype``, a valid Python number for a scalar type
        (tables become arrays in ``schedule``), or ``None`` for zeros."""
        return self._const_makers[self.program.type_index[ttype]](value)

    def unshare(self) -> None:
        """Forgets what the batch's examples share (constants, memoised block values): a recorded
        example keeps its own copy, since batches gather examples recorded apart."""
        self._shared.clear()
        self.block_cache.clear()

    def const_shared(self, key: Hashable, ttype: TensorType, value: np.ndarray | None) -> int:
        """A constant stored once per batch, whichever example asks for it."""
        vid = self._shared.get(key)
        if vid is None:
            vid = self._shared[key] = self.const(ttype, value)
        return vid

    def zeros(self, ttype: TensorType) -> int:
        return self.const_shared(("zeros", ttype), ttype, None)

    def const_value(self, vid: int) -> np.ndarray | None:
        """The host value of a constant id, or None if it is computed."""
        if self.v_depth[vid] > 0:
            return None
        for tidx, vids in enumerate(self.const_vids):  # each type's ids ascend
            pos = bisect.bisect_left(vids, vid)
            if pos < len(vids) and vids[pos] == vid:
                value, t = self.consts[tidx][pos], self.program.types[tidx]
                return np.zeros(t.shape, t.dtype) if value is None else np.asarray(value, t.dtype)
        raise ValueError(f"value id {vid} was never recorded")

    def where(self) -> str:
        """The current example, as errors name it: its index in the dataset where it has one."""
        i = self.example_index
        if i is None:
            return "the input"
        if self.dataset_indices is None:
            return f"example {i}"
        return f"example {self.dataset_indices[i]} (position {i} in its batch)"

    def steps(self, pipe: Block) -> Sequence[Step]:
        """The blocks ``pipe`` runs: its children, or its children with runs of operations fused
        (``fold/scheduler/fusion.py``)."""
        return self.program.steps(pipe)

    def call(self, block: OpBlock, x: HostValue) -> HostValue:
        """Records one call of ``block``'s operation on host value ``x``."""
        return self._callers[self.program.block_ops[block]](x)

    def metric(self, name: str, vid: int, label: PyObject = None) -> None:
        """Records tensor ``vid`` as an entry of metric ``name`` for the current example, with
        ``label`` if the metric has labels."""
        self.metric_examples[name].append(self.example_index or 0)
        self.metric_values[name].append(vid)
        if name in self.metric_labels:
            self.metric_labels[name].append(label)

    @property
    def max_depth(self) -> int:
        """The deepest node so far; a metric entry counts one deeper than its value (as in Fold)."""
        depth = max(self.n_depth, default=0)
        for vids in self.metric_values.values():
            depth = max(depth, 1 + max((self.v_depth[vid] for vid in vids), default=-1))
        return depth


def run_examples(program: Program, examples: Sequence[PyObject], indexed: bool = True,
                 dataset_indices: Sequence[int] | None = None) -> tuple[BatchBuilder, list[HostValue]]:
    """Records ``examples`` into a new builder of ``program``; returns it (finished) and each
    example's host value. Errors name each example's position in ``examples`` (``indexed``) or
    "the input" (one example given on its own), and its ``dataset_indices`` entry if given."""
    builder = BatchBuilder(program)
    builder.dataset_indices = dataset_indices
    outputs = []
    try:
        with gc_paused():
            for i, x in enumerate(examples):
                builder.example_index = i if indexed else None
                outputs.append(builder.run(x))
    finally:
        builder.example_index = None
        builder.finish()
    return builder, outputs


class ExampleChunk(NamedTuple):
    """Examples of one batch with their indices in the dataset they came from (``Compiler.batches``),
    so that errors name the example the user can find."""

    examples: list[PyObject]
    indices: Sequence[int]
