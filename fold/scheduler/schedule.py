"""Turns a recorded batch into the executor's index arrays (vectorised NumPy).

Layout (see docs/design.md). One *arena* per tensor type holds, in order,
that type's constants and then every node output, nodes sorted by
(step, operation); each (step, operation) *group* is cut into chunks
and each chunk owns one contiguous row range per output. The size class
``A = next_pow2(max(rows of the fullest type, nodes, metric entries))``
sizes the per-node input index table (``A + C`` rows), the work list and
the metric arrays (``A`` entries). Arena ``t`` has ``R_t + C`` rows, ``R_t``
the rows its type uses rounded up to a power of two (at most ``A``): row
``R_t`` onwards is a dump region for padded writes.

Groups at depth 1 read only constants and are *hoisted*: run once before
the loop over all their rows (padded to a power of two). Operations whose
every call is at most ``TAIL_DEPTH`` steps from a result (a per-node readout and its loss, say)
run *after* the loop, once per level, over all their rows (padded to a
power of two): their nodes get depths past the loop's deepest, ordered by
that distance (see ``_tail``). The loop's nodes run at their depths or, where
that makes fewer groups, at steps of a list schedule (``levels.py``).
The remaining groups are cut into *work items* of ``C`` rows plus one
remainder rounded up to a power of two (>= 8); the jitted ``while_loop``
runs one item per iteration. ``C`` is chosen from the compiler's candidates,
per batch (``pick_chunk``) or, in a stream, once from a sample of its batches
(``stream_chunk``): large groups run faster in large items, while every item
costs a fixed overhead plus work in proportion to ``C`` whatever its rows.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from fold.errors import InvalidConstant
from fold.scheduler.batch import Batch, BatchArrays, BatchLayout, BatchStats, GroupArrays, HostInfo, MetricArrays
from fold.scheduler.builder import Recorded
from fold.scheduler.levels import loop_steps

if TYPE_CHECKING:
    from fold.scheduler.program import Program

__all__ = ["check_constants", "schedule", "next_pow2", "pick_chunk", "item_sizes", "profile", "GroupProfile",
           "piece_rows", "padded_rows", "layout_item_sizes", "arena_rows_for", "stream_chunk", "MIN_ITEM", "PIECES"]

MIN_ITEM = 8
# What a loop item costs besides its rows, in rows: ``pick_chunk`` prices an item of C rows at
# ITEM_OVERHEAD + C. Measured on a 2-core CPU (SST and Table 1 training steps, C = 512 against
# 128): batches whose 512-row items held 1.65-1.71x the rows of their 128-row items ran 6-8 %
# faster with 512, those at 1.95-2.16x 6-7 % slower; an overhead of 159-237 rows puts the
# crossover between the two, and 192 puts it at 1.82x.
ITEM_OVERHEAD = 192
# Chunk sizes below SMALL_CHUNK serve only batches of size class A <= TINY_SIZE_CLASS and at most
# TINY_BATCH examples: single trees (groups of 1-40 rows, 17 items at C = 32 against 16 at 128)
# ran 8-23 % faster training and 26-36 % faster inference at 32. In larger batches the cost model
# picked them for some batches of a size class and not others (SST batches of 8-20 trees, within
# 5 % either way; batches of 64 small random-model examples at A = 1024 and 2048), and each C a
# stream uses compiles separately: an SST epoch at batch 16 compiled 15 times instead of 7. (This
# holds for batches built one by one: a stream picks one C for all its batches, ``stream_chunk``.)
SMALL_CHUNK = 128
TINY_SIZE_CLASS = 1024
TINY_BATCH = 4
# ... and batches of at most CHAIN_BATCH examples none of whose loop groups holds more rows than
# the batch has examples: chains (an RNN over sentences, a fold over characters), whose every
# group is one step of each sequence. There the cost model holds in every batch of a stream (C =
# 32 makes as many items as 128, each writing, slicing and scattering a quarter of the rows), so
# they do not alternate; a BiLSTM tagger's training step at batch 16 took 16.4 ms at C = 32
# against 32.6 ms at 128 (at batch 64, where groups reach 64 rows, 69 against 72).
CHAIN_BATCH = 32

# From this many rows up, in batches whose C is at least SMALL_CHUNK, a work item can also hold
# one and a half times a power of two (24, 48, 96, 192, 384): a group's last item, padded to the
# next size, then computes at most a third more rows than it holds instead of up to twice as many.
# Measured on a 2-core CPU, SST Tree-LSTM training steps taking turns on the same batches
# (``benchmarks.item_ladder``, four runs): 0.93-0.96x at batch 25, 0.92-0.98x at 64 (C = 128),
# 0.86-0.93x at 256 (C = 512); from 48 only, batch 25 gained nothing (0.99-1.03x). Each size is a
# branch to compile, forward and backward: the first steps took 1.3-1.7x as long. Batches with
# smaller C (single trees, chains of a few examples) have items of a few rows and keep the powers
# of two.
FINE_ITEM = 24

# A hoisted or tail group runs in at most this many pieces, forward and backward (``piece_rows``).
PIECES = 8

# How far (in operation calls) from a result an operation's calls may be for it to run after the
# loop; 3 covers a BiRNN's per-element concatenation, a two-layer readout and its loss. A
# BiLSTM tagger's concatenations otherwise took a loop item at nearly every depth (the forward
# and backward states of a word are ready at different depths): a quarter of its items, and
# 12-13 % of its training step at batch 16 and 64.
TAIL_DEPTH = 3


def next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def padded_rows(n: int) -> int:
    """Rows a count of ``n`` is padded to: the next power of two, at least ``MIN_ITEM``."""
    return max(MIN_ITEM, next_pow2(n))


def arena_rows_for(n: int) -> int:
    """Rows an arena whose batch uses ``n`` of them gets: the next multiple of an eighth of the
    power of two at or above ``n`` (at least ``MIN_ITEM``), so at most a quarter more than it uses
    (a power of two left SST's state arena 40 % empty). Like every size of a layout, it is a
    compilation key: the ladder is coarse enough that a stream's planned layout (``LayoutPolicy``)
    still holds the batches that follow."""
    step = max(MIN_ITEM, next_pow2(n) // 8)
    return max(MIN_ITEM, -(-int(n) // step) * step)


def piece_rows(size: int, chunk: int) -> int:
    """Rows per loop iteration of a hoisted or tail group of ``size`` rows (padded): the executor
    runs it in at most ``PIECES`` pieces, none smaller than ``chunk`` unless the group is, so its
    temporaries shrink to a piece's rows for a few loop iterations."""
    return size // min(PIECES, max(1, size // chunk))


def item_sizes(chunk: int, num_examples: int) -> tuple[int, ...]:
    """The padded row counts a work item can have when ``C = chunk`` (a power of two) in a batch
    of ``num_examples``, smallest first: the powers of two from ``MIN_ITEM`` to C, and from one
    row in batches of at most ``TINY_BATCH`` examples, and between them, when C is at least
    ``SMALL_CHUNK``, one and a half times a power of two from ``FINE_ITEM`` up. Small batches'
    items hold a row or a few: computed on 8 rows, a single SST tree's inference took 1.5x as
    long, and a tagger's batch-1 training step 1.2-1.4x. Each size is a branch of the loop's
    ``switch``, forward and backward, so larger batches, whose items seldom hold fewer than 8
    rows, keep the shorter ladder (their compilation took 1.2-1.3x as long with every size from
    1, the tagger's at batch 16).

    Examples:
        >>> item_sizes(128, 64)
        (8, 16, 24, 32, 48, 64, 96, 128)
        >>> item_sizes(32, 1)
        (1, 2, 4, 8, 16, 32)
    """
    low = 1 if num_examples <= TINY_BATCH else MIN_ITEM
    powers = [1 << k for k in range(low.bit_length() - 1, chunk.bit_length())]
    between = [3 * p // 2 for p in powers if FINE_ITEM <= 3 * p // 2 < chunk] if chunk >= SMALL_CHUNK else []
    return tuple(sorted(powers + between))


def layout_item_sizes(layout: BatchLayout) -> tuple[int, ...]:
    """``item_sizes`` of ``layout``'s loop, in the order ``BatchArrays.items_branch`` numbers them."""
    return item_sizes(layout.chunk, layout.num_examples)


def _item_size(count: int, sizes: tuple[int, ...]) -> int:
    """The smallest of the item sizes ``sizes`` (``item_sizes``, smallest first) that holds ``count``
    rows (at most the largest)."""
    return sizes[bisect.bisect_left(sizes, count)]


def pick_chunk(group_rows: np.ndarray, chunks: tuple[int, ...], size_class: int, num_examples: int = 1) -> int:
    """``C`` for a batch of size class ``size_class`` whose loop groups have ``group_rows`` rows,
    ``chunks`` the candidates in increasing order: the one whose work items cost least, an item
    of ``C`` rows costing ``ITEM_OVERHEAD + C`` (ties go to the smaller ``C``). Every item
    writes, slices and scatters ``C`` rows whatever its count, so a large ``C`` pays off only
    when most of its items are full, and a small one when it adds few items.

    Candidates below ``SMALL_CHUNK`` compete only in size classes up to ``TINY_SIZE_CLASS`` of
    at most ``TINY_BATCH`` examples, in chains of at most ``CHAIN_BATCH`` examples (no loop
    group has more rows than the batch has examples), or when no other was given: elsewhere
    they gain little, and a stream whose batches took different ``C`` would compile once per
    ``C``.

    Examples:
        >>> pick_chunk(np.array([4096, 2048, 1024]), (32, 128, 512), 16384)  # large groups: full items
        512
        >>> pick_chunk(np.array([600, 300, 120, 40, 9, 3]), (32, 128, 512), 16384)  # an SST batch
        128
        >>> pick_chunk(np.array([40, 20, 10, 5, 2, 1]), (32, 128, 512), 256)  # one small tree
        32
    """
    tiny = size_class <= TINY_SIZE_CLASS and num_examples <= TINY_BATCH
    chain = num_examples <= CHAIN_BATCH and int(group_rows.max(initial=0)) <= num_examples
    if not (tiny or chain) and chunks[-1] >= SMALL_CHUNK:
        chunks = tuple(c for c in chunks if c >= SMALL_CHUNK)
    return _cheapest([group_rows], chunks)


def stream_chunk(sample: Sequence[np.ndarray], chunks: tuple[int, ...]) -> int:
    """``C`` for every batch of a stream, from the loop groups' rows of a ``sample`` of its
    batches: the candidate whose items cost least over the whole sample, priced as in
    ``pick_chunk``. Every candidate competes: one ``C`` serves the stream, so its batches cannot
    alternate between sizes and compile once for each.

    Examples:
        >>> stream_chunk([np.array([40, 19, 12, 6]), np.array([59, 20, 9])], (32, 128, 512))  # a tagger's
        32
        >>> stream_chunk([np.array([600, 300, 120, 40, 9, 3])] * 2, (32, 128, 512))  # SST's
        128
    """
    return _cheapest(sample, chunks)


def _cheapest(sample: Sequence[np.ndarray], chunks: tuple[int, ...]) -> int:
    """The candidate whose items, ``ITEM_OVERHEAD + C`` rows each, cost least over the loop
    groups of every batch of ``sample`` (ties go to the smaller)."""
    costs = [sum(int(np.sum(-(-rows // c))) for rows in sample) * (ITEM_OVERHEAD + c) for c in chunks]
    return chunks[int(np.argmin(costs))]


def check_constants(program: Program, rec: Recorded) -> None:
    """Runs each layer's ``check_constant_inputs`` once, on every call of its operation whose
    inputs are all constants (one call of the hook per operation instead of per node); raises
    ``InvalidConstant`` with what the hook raised."""
    first_in = None
    for o, op in enumerate(program.ops):
        if op.check_inputs is None:
            continue
        if first_in is None:
            n_in = np.array([len(other.in_paths) for other in program.ops], np.int64)[rec.n_op]
            first_in = np.cumsum(n_in) - n_in
        nodes = np.flatnonzero(rec.n_op == o)
        ins = rec.n_inputs[first_in[nodes][:, None] + np.arange(len(op.in_tidx))]
        ins = ins[(rec.v_node[ins] < 0).all(axis=1)]
        if not len(ins):
            continue
        try:
            op.check_inputs(*(rec.consts[t][0][rec.v_pos[ins[:, j]]] for j, t in enumerate(op.in_tidx)))
        except Exception as e:
            raise InvalidConstant(e) from e


def _tail(n_op: np.ndarray, producer: np.ndarray, consumer: np.ndarray, n_ops: int) -> np.ndarray:
    """Per node, its distance to a result (0: nothing consumes it) if its operation runs after the
    loop, else -1.

    An operation qualifies when all its calls are within ``TAIL_DEPTH`` of a result and nothing
    that stays in the loop consumes any of them; then every input of a tail node is computed
    before it (loop nodes first, then tail nodes by decreasing distance).
    """
    n_nodes = len(n_op)
    dist = np.where(np.bincount(producer, minlength=n_nodes) == 0, 0, -1)
    for k in range(1, TAIL_DEPTH + 1):
        # Within k of a result: every consumer is within k - 1.
        bad = np.bincount(producer, weights=dist[consumer] < 0, minlength=n_nodes)
        dist = np.where((dist < 0) & (bad == 0), k, dist)
    ok = np.ones(n_ops, bool)
    ok[n_op[dist < 0]] = False
    while True:
        spoiled = producer[ok[n_op[producer]] & ~ok[n_op[consumer]]]
        if not len(spoiled):
            break
        ok[n_op[spoiled]] = False
    return np.where(ok[n_op], dist, -1)


def _live_outputs(program: Program, rec: Recorded, roots: list[np.ndarray], every: bool = False) -> np.ndarray:
    """``[operations, most outputs]``: whether anything in the batch reads a value of that output
    of that operation (a call's input, a root or a metric entry); all True with ``every``.

    An output nobody reads, such as the first ``h`` of a cell's ``(h, (c, h))`` that the model
    takes apart with ``GetItem(1)``, gets no arena rows: its calls write it to the dump rows, so
    a Tree-LSTM's state arena holds two rows per node instead of three, and its cotangent arena
    the same."""
    width = max(max((len(op.out_tidx) for op in program.ops), default=0), 1)
    if every:
        return np.ones((len(program.ops), width), bool)
    read = np.zeros(len(rec.v_node), bool)
    read[rec.n_inputs] = True
    for ids in [*roots, *rec.metric_values.values()]:
        read[np.asarray(ids, np.int64).ravel()] = True
    out = np.flatnonzero(rec.v_node >= 0)
    key = rec.n_op[rec.v_node[out]] * width + rec.v_pos[out]
    live = np.bincount(key, weights=read[out], minlength=len(program.ops) * width) > 0
    return live.reshape(len(program.ops), width)


def _size_class(program: Program, rec: Recorded, live: np.ndarray) -> int:
    """``A = next_pow2(max(rows of the fullest type, nodes, metric entries))``: every value that is
    read has one row, so a type's rows are its constants plus one per ``live`` output of that
    type of every call."""
    rows = np.array([len(filled) for _, filled in rec.consts], np.int64)
    calls = np.bincount(rec.n_op, minlength=len(program.ops))
    for o, (op, n) in enumerate(zip(program.ops, calls.tolist())):
        for j, t in enumerate(op.out_tidx):
            rows[t] += n * bool(live[o, j])
    n_metric = max((len(v) for v in rec.metric_values.values()), default=0)
    return next_pow2(max(int(rows.max(initial=0)), len(rec.n_op), n_metric, MIN_ITEM))


class _Groups(NamedTuple):
    """Nodes sorted by (depth, operation) and cut into groups and chunks (``_sort``, ``_cut``)."""

    order: np.ndarray     # [nodes]: node ids in sorted order
    rank: np.ndarray      # [nodes]: each node's position in that order
    g_start: np.ndarray   # [groups]: a group's first position
    g_count: np.ndarray   # [groups]: its nodes
    g_op: np.ndarray      # [groups]: its operation
    g_depth: np.ndarray   # [groups]: its depth
    loop_depth: int       # the deepest depth the loop runs (tail groups come after it)


class _Chunks(NamedTuple):
    """Groups cut into chunks (one per hoisted or tail group, ``C`` rows per loop item), each with
    its output rows (``_cut``)."""

    group: list[int]      # per chunk: its group
    start: list[int]      # its first position in sorted order
    count: list[int]  # type: ignore[assignment]  # a NamedTuple field named like tuple's method: its nodes
    base: np.ndarray      # [chunks, most outputs]: first arena row of each output
    type_rows: np.ndarray  # [types]: rows each arena uses (constants and outputs)


def _depths(program: Program, rec: Recorded) -> tuple[np.ndarray, int]:
    """Node depths once tail nodes move past the loop's deepest depth (farthest from a result
    first), and that deepest loop depth."""
    n_in = np.array([len(op.in_paths) for op in program.ops], np.int64)[rec.n_op]
    consumer = np.repeat(np.arange(len(rec.n_op)), n_in)
    producer = rec.v_node[rec.n_inputs]
    computed = producer >= 0
    producer, consumer = producer[computed], consumer[computed]
    dist = _tail(rec.n_op, producer, consumer, len(program.ops))
    tail = dist >= 0
    depth, loop_depth = loop_steps(rec.n_op, rec.n_depth, producer, consumer, (rec.n_depth > 1) & ~tail)
    return np.where(tail, loop_depth + 1 + TAIL_DEPTH - dist, depth), loop_depth


class GroupProfile(NamedTuple):
    """One group of a batch's schedule: an operation's nodes at one depth (``profile``)."""

    stage: str         # "hoisted" (before the loop), "loop" or "tail" (after it)
    depth: int         # its depth in the schedule (tail groups come after the loop's deepest)
    op: int            # its operation's index in ``program.ops``
    rows: int          # its nodes (one row each)
    computed: int      # rows the executor computes for it (items and groups padded, exact layout)


def profile(program: Program, rec: Recorded, chunk: int, num_examples: int) -> list[GroupProfile]:
    """The groups of the schedule ``rec`` (``num_examples`` examples) gets with ``C = chunk``, in
    the order they run."""
    n_depth, loop_depth = _depths(program, rec)
    groups = _sort(rec.n_op, n_depth, loop_depth)
    sizes = item_sizes(chunk, num_examples)
    out = []
    for looped, depth, op, n in zip(_in_loop(groups).tolist(), groups.g_depth.tolist(), groups.g_op.tolist(),
                                    groups.g_count.tolist()):
        if looped:  # as _items pads them: C-row items, the last one to the next item size
            full, rest = divmod(n, chunk)
            computed = full * chunk + (_item_size(rest, sizes) if rest else 0)
        else:  # as the layout pads hoisted and tail groups
            computed = padded_rows(n)
        stage = "loop" if looped else "hoisted" if depth == 1 else "tail"
        out.append(GroupProfile(stage, int(depth), int(op), int(n), computed))
    return out


def _sort(n_op: np.ndarray, n_depth: np.ndarray, loop_depth: int) -> _Groups:
    """Nodes sorted by (depth, operation); a group is a run of equal (depth, operation)."""
    n_nodes = len(n_op)
    order = np.lexsort((n_op, n_depth)) if n_nodes else np.zeros(0, np.int64)
    rank = np.empty(n_nodes, np.int64)
    rank[order] = np.arange(n_nodes)
    s_depth, s_op = n_depth[order], n_op[order]
    if n_nodes:
        change = np.flatnonzero((np.diff(s_depth) != 0) | (np.diff(s_op) != 0)) + 1
        g_start = np.concatenate([[0], change])
    else:
        g_start = np.zeros(0, np.int64)
    g_count = np.diff(np.concatenate([g_start, [n_nodes]]))
    return _Groups(order, rank, g_start, g_count, s_op[g_start], s_depth[g_start], loop_depth)


def _in_loop(groups: _Groups) -> np.ndarray:
    """Per group, whether the loop runs it (neither hoisted at depth 1 nor in the tail)."""
    return (groups.g_depth > 1) & (groups.g_depth <= groups.loop_depth)


def _cut(program: Program, rec: Recorded, groups: _Groups, chunk: int, live: np.ndarray) -> _Chunks:
    """Chunks and their rows: constants first, then each chunk's ``live`` outputs, output by
    output (an output nobody reads gets base row -1: no rows). A loop item writes C rows per
    output, in the same order, so its padded tail may only ever land on rows that are written
    later: allocating per chunk (not per group) guarantees that even for ops with several
    outputs."""
    c_group, c_start, c_count = [], [], []
    for g, (looped, s0, n) in enumerate(zip(_in_loop(groups).tolist(), groups.g_start.tolist(),
                                            groups.g_count.tolist())):
        step = chunk if looped else n
        for off in range(0, n, step):
            c_group.append(g)
            c_start.append(s0 + off)
            c_count.append(min(step, n - off))
    cursor = np.array([len(filled) for _, filled in rec.consts], np.int64)
    max_out = max((len(op.out_tidx) for op in program.ops), default=0)
    c_base = np.zeros((len(c_group), max(max_out, 1)), np.int64)
    for c, (g, n) in enumerate(zip(c_group, c_count)):
        o = int(groups.g_op[g])
        for j, t in enumerate(program.ops[o].out_tidx):
            if not live[o, j]:
                c_base[c, j] = -1
                continue
            c_base[c, j] = cursor[t]
            cursor[t] += n
    return _Chunks(c_group, c_start, c_count, c_base, cursor)


def _value_rows(rec: Recorded, groups: _Groups, chunks: _Chunks) -> np.ndarray:
    """The arena row of every value id: a constant's position, or its node's chunk's row
    (meaningless for a value of an output without rows, which nothing reads)."""
    v_node, v_pos = rec.v_node, rec.v_pos
    v_row = np.where(v_node < 0, v_pos, 0)
    n_nodes = len(rec.n_op)
    if n_nodes:
        node_chunk = np.empty(n_nodes, np.int64)
        node_chunk[groups.order] = np.repeat(np.arange(len(chunks.group)), chunks.count)
        node_offset = groups.rank - np.asarray(chunks.start, np.int64)[node_chunk]
        is_out = v_node >= 0
        out_node = v_node[is_out]
        v_row[is_out] = chunks.base[node_chunk[out_node], v_pos[is_out]] + node_offset[out_node]
    return v_row


def _input_rows(program: Program, rec: Recorded, groups: _Groups, v_row: np.ndarray, rows: int) -> np.ndarray:
    """``[rows, most inputs]``: per node in sorted order, the arena row of each input."""
    n_in = np.array([len(op.in_paths) for op in program.ops], np.int64)[rec.n_op]
    max_in = max((len(op.in_tidx) for op in program.ops), default=1) or 1
    in_idx = np.zeros((rows, max_in), np.int32)
    consumer = np.repeat(np.arange(len(rec.n_op)), n_in)
    column = np.arange(len(rec.n_inputs)) - np.repeat(np.cumsum(n_in) - n_in, n_in)
    in_idx[groups.rank[consumer], column] = v_row[rec.n_inputs]
    return in_idx


class _Items(NamedTuple):
    """The loop's work items (``_items``), one per loop chunk, in loop order."""

    loop_ops: tuple[int, ...]  # operations with items, sorted
    branch: list[int]    # per item: loop_ops position * item sizes + size position
    node: list[int]      # its first node
    count: list[int]  # type: ignore[assignment]  # a NamedTuple field named like tuple's method: its nodes
    out: list[np.ndarray]  # per output slot, the row its C rows go to
    saved: list[int]     # its offset in its operation's saved rows
    saved_rows: list[int]  # per loop operation: rows its items' saved chunks take


def _items(program: Program, groups: _Groups, chunks: _Chunks, chunk: int, num_examples: int,
           out_starts: Callable[[int, np.ndarray], np.ndarray]) -> _Items:
    """Work items: one per loop chunk, its size the smallest of ``item_sizes`` that holds it. With saving, each loop
    operation's items keep what they save in rows of its own, one item after another in loop
    order (see ``Executor._saved_starts``)."""
    in_loop = _in_loop(groups)
    items = [c for c, g in enumerate(chunks.group) if in_loop[g]]
    loop_ops = tuple(sorted({int(groups.g_op[chunks.group[c]]) for c in items}))
    loop_pos = {o: i for i, o in enumerate(loop_ops)}
    sizes = item_sizes(chunk, num_examples)
    size_pos = {s: i for i, s in enumerate(sizes)}
    out = _Items(loop_ops, [], [], [], [], [], [0] * len(loop_ops))
    for c in items:
        o, cnt = int(groups.g_op[chunks.group[c]]), chunks.count[c]
        size = _item_size(cnt, sizes)
        out.branch.append(loop_pos[o] * len(sizes) + size_pos[size])
        out.node.append(chunks.start[c])
        out.count.append(cnt)
        out.out.append(out_starts(o, chunks.base[c]))
        out.saved.append(out.saved_rows[loop_pos[o]])
        out.saved_rows[loop_pos[o]] += size
    return out


def _item_rows(items: _Items, sizes: int) -> tuple[int, ...]:
    """Per loop operation, its items' mean rows rounded up to a power of two (``sizes``: item
    sizes per operation in ``items.branch``)."""
    op = np.asarray(items.branch, np.int64) // sizes
    n = np.bincount(op, minlength=len(items.loop_ops))
    rows = np.bincount(op, weights=items.count, minlength=len(items.loop_ops)).astype(np.int64)
    return tuple(next_pow2(-(-r // k)) for r, k in zip(rows.tolist(), n.tolist()))


def _item_arrays(items: _Items, A: int, dump_row: np.ndarray) -> tuple[np.ndarray, ...]:
    """``items_branch``, ``items_node``, ``items_count``, ``items_out`` and ``items_saved``, each
    padded to ``A`` items."""
    n = len(items.branch)
    arrays = [np.zeros(A, np.int32) for _ in range(4)]
    for array, values in zip(arrays, (items.branch, items.node, items.count, items.saved)):
        array[:n] = values
    items_out = np.tile(dump_row.astype(np.int32), (A, 1))
    if n:
        items_out[:n] = np.asarray(items.out, np.int64)
    branch, node, count, saved = arrays
    return branch, node, count, items_out, saved


def _metric_arrays(rec: Recorded, v_row: np.ndarray, A: int) -> dict[str, MetricArrays]:
    metrics = {}
    for name, vids in rec.metric_values.items():
        n = len(vids)
        rows = np.zeros(A, np.int32)
        rows[:n] = v_row[vids]
        mask = np.zeros(A, bool)
        mask[:n] = True
        example = np.full(A, -1, np.int32)
        example[:n] = rec.metric_examples[name]
        metrics[name] = MetricArrays(rows, mask, example)
    return metrics


def _const_tables(rec: Recorded, arena_rows: tuple[int, ...]) -> dict[str, np.ndarray]:
    """Constant tables, for types with a non-zero constant, ``arena_rows[t]`` rows each."""
    consts = {}
    for t, (values, filled) in enumerate(rec.consts):
        if filled.any():
            arr = np.zeros((arena_rows[t], *values.shape[1:]), values.dtype)
            arr[:len(values)] = values
            consts[str(t)] = arr
    return consts


def schedule(program: Program, rec: Recorded, roots: list[np.ndarray], num_examples: int, chunk_sizes: tuple[int, ...],
             keep_host: bool = False, check: bool = True, owner: str | None = None) -> Batch:
    """Builds the batch arrays from recorded work ``rec`` of ``program``.

    ``roots[l]`` holds, per example, the value id of root leaf ``l``; ``chunk_sizes`` are
    the candidates for ``C``, smallest first. With ``check``, layers validate their constant
    inputs first (``check_constants``). ``owner`` marks the batch as the compiler's (``Batch``).
    """
    if check:
        check_constants(program, rec)
    n_depth, loop_depth = _depths(program, rec)
    groups = _sort(rec.n_op, n_depth, loop_depth)
    # ``eval`` and ``check_numerics`` (``keep_host``) read back every value: all outputs keep rows.
    live = _live_outputs(program, rec, roots, every=keep_host)
    A = _size_class(program, rec, live)
    group_rows = groups.g_count[_in_loop(groups)]
    chunk = pick_chunk(group_rows, chunk_sizes, A, num_examples)
    chunks = _cut(program, rec, groups, chunk, live)
    # Each arena holds only its own type's rows, rounded up (``arena_rows_for``): a model's types
    # fill very different numbers of rows.
    arena_rows = tuple(min(A, arena_rows_for(r)) for r in chunks.type_rows.tolist())
    slot_of = program.slot_index  # (type, k) -> column of the out-start tables
    dump_row = np.asarray([arena_rows[t] for t, _ in sorted(slot_of, key=lambda slot: slot_of[slot])] or [A], np.int64)
    v_row = _value_rows(rec, groups, chunks)

    def out_starts(o: int, base_row: np.ndarray) -> np.ndarray:
        # Slots the op lacks write their (zero) chunk to the dump rows, outputs without rows theirs.
        row: np.ndarray = dump_row.copy()
        for j, slot in enumerate(program.ops[o].out_slots):
            if base_row[j] >= 0:
                row[slot_of[slot]] = base_row[j]
        return row

    def whole_groups(chosen: list[int]) -> tuple[tuple[int, ...], GroupArrays]:
        """Operations and arrays of chunks that run whole (hoisted or tail)."""
        ops = tuple(int(groups.g_op[chunks.group[c]]) for c in chosen)
        out = np.asarray([out_starts(o, chunks.base[c]) for o, c in zip(ops, chosen)], np.int32)
        return ops, GroupArrays(np.asarray([chunks.start[c] for c in chosen], np.int32),
                                np.asarray([chunks.count[c] for c in chosen], np.int32),
                                out.reshape(len(chosen), max(len(slot_of), 1)))

    # Hoisted (depth-1) chunks, one per operation; tail chunks, one per (depth, operation).
    hoist_ops, hoist = whole_groups([c for c, g in enumerate(chunks.group) if groups.g_depth[g] == 1])
    tail_ops, tail = whole_groups([c for c, g in enumerate(chunks.group) if groups.g_depth[g] > loop_depth])
    items = _items(program, groups, chunks, chunk, num_examples, out_starts)
    branch, node, count, items_out, saved = _item_arrays(items, A, dump_row)
    consts = _const_tables(rec, arena_rows)
    arrays = BatchArrays(consts, _input_rows(program, rec, groups, v_row, A + chunk), hoist, tail, branch, node,
                         count, items_out, saved, np.asarray(len(items.branch), np.int32),
                         [v_row[r].astype(np.int32) for r in roots], _metric_arrays(rec, v_row, A))
    layout = BatchLayout(A, num_examples, items.loop_ops, hoist_ops, tuple(sorted(int(k) for k in consts)), tail_ops,
                         tuple(map(padded_rows, tail.count.tolist())), tuple(map(padded_rows, hoist.count.tolist())),
                         arena_rows, chunk, item_rows=_item_rows(items, len(item_sizes(chunk, num_examples))))
    host = HostInfo(rec.v_type, v_row) if keep_host else None
    stats = BatchStats(len(rec.n_op), len(items.branch), int(n_depth.max()) if len(n_depth) else 0,
                       int(chunks.type_rows.max(initial=0)), tuple(chunks.type_rows.tolist()), tuple(items.saved_rows),
                       tuple(group_rows.tolist()))
    return Batch(arrays, layout, host, stats, owner, rec.metric_labels)
