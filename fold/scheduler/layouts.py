"""A bounded set of layouts: batches are padded into layouts handed out before.

``schedule`` gives each batch the layout that fits it exactly, and every distinct layout costs
one compilation of each jitted function that takes batches. A model with many operations
varies along many dimensions at once (which operations a batch holds and where they run,
each type's arena rows, each hoisted and tail group's padded rows), so exact layouts rarely
repeat: a JSON-like classifier with a dozen operations gave 23 distinct layouts in 75 batches.

``LayoutPolicy`` keeps the layouts it has handed out. A batch whose exact layout *fits* one of
them (the same examples and ``C``, a size class at most ``MAX_GROWTH`` times its own, and every
other dimension at most as large: ``fits``) is padded into the cheapest such layout
(``pad_to``): an operation it lacks gets no work items (its branches are compiled but never
run), a hoisted or tail group it lacks runs no rows, larger arenas and groups hold rows it
never reads.

A stream of batches (``Compiler.batches``) gets its first layout of each *family* (batches of
the same examples, ``C`` and saving) *planned* from its first ``PLAN_AHEAD`` batches
(``LayoutPolicy.plan``): the join of their layouts (``join``, each dimension's maximum), each
size at least the sample's mean need plus ``SPREAD`` standard deviations. Random models'
epochs then compiled once for their full batches and once for the last, partial one. A later
stream (the next epoch) whose batches' families all have layouts waits for no sample: its
first batch is handed out at once, while a background builder works on the next.

A batch that fits no layout gets a new one: the join of its own and the latest of its family,
with headroom on every size it overflowed (at least twice its need, an arena's up to
``ARENA_HEADROOM_CAP`` of the size class: growing by the exact need took one layout per
overflow), or, first of its family outside a stream, its own with headroom on every size. The
layouts of a family only grow. Outside a stream, batches of at most ``TINY_BATCH`` examples
(single trees) get their exact layout first: there, where ``C`` was tuned, padding costs a
larger share. A stream plans them as it plans the others: given their exact layouts, a BiLSTM
tagger's stream at batch 4 compiled four times in its first 15 batches. Past
``max_layouts`` a batch is padded into any layout it fits, whatever the size class, and only a
batch that fits none compiles (with a warning, once).

Padding costs rows computed for nothing: ``computed_rows`` counts what a batch's layout makes
the device compute, against its ``num_nodes``.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TypeAlias

import numpy as np

from fold.scheduler.batch import Batch, BatchArrays, BatchLayout, GroupArrays, MetricArrays
from fold.scheduler.schedule import TINY_BATCH, arena_rows_for, layout_item_sizes, next_pow2, padded_rows, piece_rows

__all__ = ["ARENA_HEADROOM_CAP", "MAX_GROWTH", "PLAN_AHEAD", "SAVED_SHARE", "SPREAD", "LayoutPolicy", "computed_rows",
           "empty", "fits", "join", "pad_to", "sample_ahead", "saved_floor"]

logger = logging.getLogger("fold")

# Arenas get headroom only up to this share of the size class: every step initialises its arenas
# and their cotangents, so doubling a large arena cost a random model 1.43x the device time of its
# exact layouts; the fullest arena is A rows whatever the headroom.
ARENA_HEADROOM_CAP = 0.25

# ``stream`` plans each family's first layout from this many batches: enough to see the spread of
# a model's sizes, few enough that the first step does not wait long.
PLAN_AHEAD = 16

# A planned size class holds the sample's mean need plus this many standard deviations.
SPREAD = 4.0

# A loop operation that saves has its saved rows rounded up as arena rows are (``arena_rows_for``:
# at most a quarter more than its items take), and at least A // SAVED_SHARE of them
# (``saved_floor``, which the policy of fold/compiler/saving.py and the layouts both apply), so a
# layout whose size class grew past a batch's still holds that batch's floor. Every step fills
# the saved buffers before its loop (the CPU has no uninitialised buffer), so their rows cost
# time whether written or not: a floor of A // 4 and powers of two gave the DyNet suite's
# Tree-LSTM 5.9-6.4x the rows its items save, and steps up to 1.08x as long as these sizes
# (``benchmarks.saved_rows``).
SAVED_SHARE = 16

Ints: TypeAlias = tuple[int, ...]
"""A layout's operations, or their padded row counts."""

TypeShape: TypeAlias = tuple[tuple[int, ...], str]
"""An arena type as the layouts see it: its shape and dtype."""

# A batch is padded into a layout of at most this many times its own size class (before the
# budget is spent): a larger size class costs larger index arrays and arenas, not more loop work.
MAX_GROWTH = 2


def _embed(ops: Ints, sizes: Ints, into_ops: Ints, into_sizes: Ints) -> list[int] | None:
    """Positions in ``into_ops`` that hold the groups ``ops`` in order, each with at least the
    rows ``sizes`` gives it, or None. Greedy earliest matching finds an embedding when one
    exists."""
    positions, j = [], 0
    for o, size in zip(ops, sizes):
        while j < len(into_ops) and not (into_ops[j] == o and into_sizes[j] >= size):
            j += 1
        if j == len(into_ops):
            return None
        positions.append(j)
        j += 1
    return positions


def _kind(layout: BatchLayout) -> tuple[int, int, bool]:
    """What padding cannot change: the number of examples, ``C``, and whether the batch saves."""
    return layout.num_examples, layout.chunk, bool(layout.saved_rows)


def _saved_of(layout: BatchLayout) -> dict[int, int]:
    return dict(zip(layout.loop_ops, layout.saved_rows))


def fits(need: BatchLayout, have: BatchLayout, max_growth: int | None = MAX_GROWTH) -> bool:
    """Whether a batch of layout ``need`` can be padded into ``have`` (``pad_to``); ``max_growth``
    bounds the ratio of their size classes (None: no bound)."""
    if _kind(need) != _kind(have):
        return False
    if have.size_class < need.size_class or (max_growth is not None
                                             and have.size_class > max_growth * need.size_class):
        return False
    if not set(need.loop_ops) <= set(have.loop_ops) or not set(need.const_types) <= set(have.const_types):
        return False
    if any(n > h for n, h in zip(need.arena_rows, have.arena_rows)):
        return False
    # An operation saves exactly where its layout gives it rows, and a batch's items need as many
    # as its own layout gives them: a layout may not make a batch save an operation it does not.
    saved, need_saved = _saved_of(have), _saved_of(need)
    if any(rows > saved[o] for o, rows in need_saved.items()):
        return False
    if any(saved.get(o) and not need_saved.get(o) for o in need.loop_ops):
        return False
    return (_embed(need.hoist_ops, need.hoist_sizes, have.hoist_ops, have.hoist_sizes) is not None
            and _embed(need.tail_ops, need.tail_sizes, have.tail_ops, have.tail_sizes) is not None)


def _merge(a_ops: Ints, a_sizes: Ints, b_ops: Ints, b_sizes: Ints,
           grow: Callable[[int, int], int]) -> tuple[Ints, Ints]:
    """A shortest sequence of groups that holds both ``a`` and ``b`` in order (their longest
    common subsequence of operations once), each group ``grow(a's rows, b's rows)`` (0 where it
    is not one of theirs)."""
    n, m = len(a_ops), len(b_ops)
    lcs = np.zeros((n + 1, m + 1), np.int64)
    for i in range(n - 1, -1, -1):
        for j in range(m - 1, -1, -1):
            lcs[i, j] = lcs[i + 1, j + 1] + 1 if a_ops[i] == b_ops[j] else max(lcs[i + 1, j], lcs[i, j + 1])
    ops, sizes, i, j = [], [], 0, 0
    while i < n or j < m:
        if i < n and j < m and a_ops[i] == b_ops[j]:
            ops.append(a_ops[i])
            sizes.append(grow(a_sizes[i], b_sizes[j]))
            i, j = i + 1, j + 1
        elif j == m or (i < n and lcs[i + 1, j] >= lcs[i, j + 1]):
            ops.append(a_ops[i])
            sizes.append(grow(a_sizes[i], 0))
            i += 1
        else:
            ops.append(b_ops[j])
            sizes.append(grow(0, b_sizes[j]))
            j += 1
    return tuple(ops), tuple(sizes)


def join(a: BatchLayout, b: BatchLayout, headroom: bool = False) -> BatchLayout:
    """The smallest layout both ``a`` and ``b`` fit (same examples, ``C`` and saving). With
    ``headroom``, every size where ``b`` needs more than ``a`` has is at least twice what ``b``
    needs (up to the size class, an arena's up to ``ARENA_HEADROOM_CAP`` of it): the next
    batches, which straddle the same powers of two, then fit too; ``join(empty(b), b, True)``
    gives ``b`` headroom everywhere."""
    if _kind(a) != _kind(b):
        raise ValueError(f"layouts of different examples, C or saving have no join: {a} and {b}")
    A = max(a.size_class, b.size_class)

    def grow(have: int, need: int, cap: int = A) -> int:
        return max(need, min(cap, 2 * need)) if headroom and need > have else max(have, need)

    loop_ops = tuple(sorted(set(a.loop_ops) | set(b.loop_ops)))
    saved_rows: tuple[int, ...] = ()
    if a.saved_rows:
        sa, sb = _saved_of(a), _saved_of(b)
        saved_rows = saved_floor(tuple(grow(sa.get(o, 0), sb.get(o, 0)) for o in loop_ops), A)
    # Hoisted groups: one per operation, sorted (they read only constants, so any order is right).
    ha, hb = dict(zip(a.hoist_ops, a.hoist_sizes)), dict(zip(b.hoist_ops, b.hoist_sizes))
    hoist_ops = tuple(sorted(set(ha) | set(hb)))
    hoist_sizes = tuple(grow(ha.get(o, 0), hb.get(o, 0)) for o in hoist_ops)
    tail_ops, tail_sizes = _merge(a.tail_ops, a.tail_sizes, b.tail_ops, b.tail_sizes, grow)
    # Items' rows only steer where weight cotangents are summed: the fewer rows win (either is exact).
    ia, ib = dict(zip(a.loop_ops, a.item_rows)), dict(zip(b.loop_ops, b.item_rows))
    item_rows = tuple(min(rows[o] for rows in (ia, ib) if o in rows) for o in loop_ops) if ia or ib else ()
    return BatchLayout(A, a.num_examples, loop_ops, hoist_ops, tuple(sorted(set(a.const_types) | set(b.const_types))),
                       tail_ops, tail_sizes, hoist_sizes,
                       tuple(grow(x, y, int(ARENA_HEADROOM_CAP * A)) for x, y in zip(a.arena_rows, b.arena_rows)),
                       a.chunk, saved_rows, item_rows)


def empty(layout: BatchLayout) -> BatchLayout:
    """``layout`` with no rows anywhere: what ``join`` grows a family's first layout from."""
    return layout._replace(tail_sizes=(0,) * len(layout.tail_sizes), hoist_sizes=(0,) * len(layout.hoist_sizes),
                           arena_rows=(0,) * len(layout.arena_rows), saved_rows=(0,) * len(layout.saved_rows))


def _grow(x: np.ndarray, n: int, fill: int | bool = 0) -> np.ndarray:
    """``x`` with its leading dimension padded to ``n`` with ``fill``."""
    out = np.full((n, *x.shape[1:]), fill, x.dtype)
    out[:len(x)] = x
    return out


def _pad_groups(groups: GroupArrays, positions: list[int] | None, n: int) -> GroupArrays:
    """``groups`` at ``positions`` among ``n`` groups; the others have no rows."""
    assert positions is not None  # (from ``_embed``) the layout was picked because they fit
    out = GroupArrays(np.zeros(n, np.int32), np.zeros(n, np.int32),
                      np.zeros((n, groups.out.shape[1]), np.int32))
    for field, src in zip(out, groups):
        field[positions] = src
    return out


def pad_to(batch: Batch, layout: BatchLayout, type_shapes: Sequence[TypeShape]) -> Batch:
    """``batch`` as a batch of ``layout``, which its own layout must fit (``fits``).
    ``type_shapes`` gives each arena type's row shape and dtype (for constant tables it lacks)."""
    need, a = batch.layout, batch.arrays
    if need == layout:
        return batch
    if not fits(need, layout, max_growth=None):
        raise ValueError(f"a batch of layout {need} does not fit {layout}")
    if layout.saved_rows and batch.stats is not None:
        # Items write past a region too small for them without an error on the device (the write
        # is clamped into the buffer), so check what they need here, on the host.
        have = _saved_of(layout)
        for o, rows in zip(need.loop_ops, batch.stats.saved_rows):
            if have.get(o) and rows > have[o]:
                raise ValueError(f"operation {o}'s loop items save {rows} rows, more than the {have[o]} of {layout}")
    A, C = layout.size_class, layout.chunk
    n_sizes = len(layout_item_sizes(layout))
    position = np.asarray([layout.loop_ops.index(o) for o in need.loop_ops] or [0], np.int32)
    n = int(a.n_items)
    branch = a.items_branch.copy()
    branch[:n] = position[branch[:n] // n_sizes] * n_sizes + branch[:n] % n_sizes
    consts = {}
    for t in layout.const_types:
        table = a.consts.get(str(t))
        shape, dtype = type_shapes[t]
        consts[str(t)] = (_grow(table, layout.arena_rows[t]) if table is not None
                          else np.zeros((layout.arena_rows[t], *shape), dtype))
    metrics = {name: MetricArrays(_grow(m.rows, A), _grow(m.mask, A, False), _grow(m.example, A, -1))
               for name, m in a.metrics.items()}
    arrays = BatchArrays(
        consts, _grow(a.in_idx, A + C),
        _pad_groups(a.hoist, _embed(need.hoist_ops, need.hoist_sizes, layout.hoist_ops, layout.hoist_sizes),
                    len(layout.hoist_ops)),
        _pad_groups(a.tail, _embed(need.tail_ops, need.tail_sizes, layout.tail_ops, layout.tail_sizes),
                    len(layout.tail_ops)),
        _grow(branch, A), _grow(a.items_node, A), _grow(a.items_count, A), _grow(a.items_out, A),
        _grow(a.items_saved, A), a.n_items, a.roots, metrics)
    return batch.replace(arrays, layout)


def computed_rows(batch: Batch) -> int:
    """Rows the device computes for ``batch``: each work item's padded size, and each hoisted or
    tail group's rows rounded up to whole pieces of its layout's size (the executor's
    ``_group_forward``)."""
    layout, a = batch.layout, batch.arrays
    sizes = np.asarray(layout_item_sizes(layout))
    n = int(a.n_items)
    rows = int(sizes[a.items_branch[:n] % len(sizes)].sum())
    for groups, group_sizes in ((a.hoist, layout.hoist_sizes), (a.tail, layout.tail_sizes)):
        for count, size in zip(groups.count.tolist(), group_sizes):
            piece = piece_rows(size, layout.chunk)
            rows += -(-count // piece) * piece
    return rows


def sample_ahead(batches: Iterator[Batch], n: int, first: Sequence[Batch] = ()) -> tuple[list[Batch], Exception | None]:
    """``first`` and the next batches of ``batches``, ``n`` in all (fewer where it ends), and the
    error building the one after them raised, if any: a stream raises it in its place, after
    the batches before it."""
    sample = list(first)
    try:
        while len(sample) < n and (more := next(batches, None)) is not None:
            sample.append(more)
    except Exception as e:
        return sample, e
    return sample, None


class LayoutPolicy:
    """Hands out layouts for a stream of batches, at most ``max_layouts`` unless a batch fits none
    (see the module docstring). Host only; not thread-safe (the compiler calls it from the
    process that consumes the batches)."""

    def __init__(self, type_shapes: Sequence[TypeShape], max_layouts: int):
        self.type_shapes = list(type_shapes)
        self.max_layouts = max_layouts
        self.layouts: list[BatchLayout] = []
        self._warned = False

    def stream(self, batches: Iterable[Batch], ahead: int | None = None) -> Iterator[Batch]:
        """``batches`` assigned layouts in order, the first layout of each family planned from the
        first ``ahead`` (default ``PLAN_AHEAD``) batches from the first batch of a family without
        one (``plan``). Batches of families planned before (an earlier epoch) go straight
        through, so a stream waits for a sample only when it has something to plan. A batch that
        raises while building is raised when the stream reaches it, after the batches before it."""
        ahead = PLAN_AHEAD if ahead is None else ahead
        batches = iter(batches)
        for batch in batches:
            if _kind(batch.layout) in {_kind(layout) for layout in self.layouts}:
                yield self.assign(batch)
                continue
            sample, error = sample_ahead(batches, ahead, [batch])
            self.plan(sample)
            for batch in sample:
                yield self.assign(batch)
            if error is not None:
                raise error
            break
        for batch in batches:
            yield self.assign(batch)

    def plan(self, sample: Sequence[Batch]) -> None:
        """Hands out one layout for each family of ``sample`` that has none yet, large enough for
        the batches that will follow: the join of
        the sample's layouts, its size class, arenas, groups and saved buffers at least the
        sample's mean need plus ``SPREAD`` standard deviations (rounded up as the schedule rounds
        them). Measured needs, unlike ``join``'s headroom, leave no headroom where sizes do not
        vary, and larger groups run in larger pieces, so headroom costs rows computed."""
        kinds = {_kind(b.layout) for b in sample} - {_kind(layout) for layout in self.layouts}
        for kind in sorted(kinds):
            members = [b for b in sample if _kind(b.layout) == kind]
            joined = functools.reduce(join, (b.layout for b in members))
            stats = [b.built_stats() for b in members]
            A = max(joined.size_class, next_pow2(_bound([max(s.rows, s.num_nodes) for s in stats])))

            def bounded(have: Ints, needs: Sequence[Sequence[int] | np.ndarray], keep_zeros: bool = False,
                        rounded: Callable[[int], int] = padded_rows) -> Ints:
                rows = [rounded(_bound(n)) if n.any() or not keep_zeros else 0
                        for n in np.asarray(needs, np.int64).reshape(len(needs), -1).T]
                return tuple(max(h, min(A, r)) for h, r in zip(have, rows))

            # What each member's items save (not its layout's rounded rows: spread on rounded sizes
            # would round twice), for the operations it saves.
            items = [dict(zip(b.layout.loop_ops, s.saved_rows)) for b, s in zip(members, stats)]
            saved = [[rows[o] if _saved_of(b.layout).get(o) else 0 for o in joined.loop_ops]
                     for b, rows in zip(members, items)]
            layout = joined._replace(
                size_class=A,
                arena_rows=bounded(joined.arena_rows, [s.type_rows for s in stats], rounded=arena_rows_for),
                hoist_sizes=bounded(joined.hoist_sizes, [_group_rows(b.arrays.hoist, b.layout.hoist_ops,
                                                                     b.layout.hoist_sizes, joined.hoist_ops,
                                                                     joined.hoist_sizes) for b in members]),
                tail_sizes=bounded(joined.tail_sizes, [_group_rows(b.arrays.tail, b.layout.tail_ops,
                                                                   b.layout.tail_sizes, joined.tail_ops,
                                                                   joined.tail_sizes) for b in members]),
                # An operation no member saves gets no rows: rows would make it save (``fits``).
                saved_rows=saved_floor(bounded(joined.saved_rows, saved, keep_zeros=True, rounded=arena_rows_for), A)
                if joined.saved_rows
                else ())
            self._hand_out(layout, f"planned from {len(members)} of the batches ahead")

    def assign(self, batch: Batch) -> Batch:
        """``batch`` padded into a layout handed out before, or into a new one."""
        need = batch.layout
        over = len(self.layouts) >= self.max_layouts
        fitting = [layout for layout in self.layouts if fits(need, layout, None if over else MAX_GROWTH)]
        if fitting:
            return pad_to(batch, min(fitting, key=_cost), self.type_shapes)
        family = [layout for layout in self.layouts if _kind(layout) == _kind(need)]
        if family:
            layout = join(family[-1], need, headroom=True)
        else:  # tiny batches (single trees) run exactly what they need: the measured tuning of C did
            layout = join(empty(need), need, headroom=need.num_examples > TINY_BATCH)
        if layout in self.layouts:  # a batch of a smaller size class than MAX_GROWTH allows: none larger
            return pad_to(batch, layout, self.type_shapes)
        self._hand_out(layout, f"grows layout {self.layouts.index(family[-1]) + 1} to hold the batch" if family
                       else "the first of its examples, C and saving")
        if over and not self._warned:
            self._warned = True
            logger.warning("fold: %d layouts, past max_layouts=%d: a batch of %d examples with C=%d fits none of "
                           "them, so it compiles a layout of its own (batches of a new example count or C "
                           "always do)", len(self.layouts), self.max_layouts, need.num_examples, need.chunk)
        return pad_to(batch, layout, self.type_shapes)

    def _hand_out(self, layout: BatchLayout, reason: str) -> None:
        self.layouts.append(layout)
        logger.info("fold: layout %d (%s): A=%d, B=%d, C=%d, %d loop operations, %d hoisted and %d tail groups",
                    len(self.layouts), reason, layout.size_class, layout.num_examples, layout.chunk,
                    len(layout.loop_ops), len(layout.hoist_ops), len(layout.tail_ops))


def saved_floor(saved_rows: Ints, size_class: int) -> Ints:
    """``saved_rows`` with each saving operation's rows (non-zero) raised to ``size_class``'s floor
    (``SAVED_SHARE``): a layout whose size class grew past its batches' would otherwise turn
    away the batches of that size class, whose own layouts ask for the floor."""
    return tuple(max(rows, size_class // SAVED_SHARE) if rows else 0 for rows in saved_rows)


def _bound(needs: Sequence[int] | np.ndarray) -> int:
    """What a sample's ``needs`` say later batches need: their largest, or their mean plus
    ``SPREAD`` standard deviations if that is more."""
    x = np.asarray(needs, np.float64)
    return int(np.ceil(max(x.max(), x.mean() + SPREAD * x.std(ddof=1 if len(x) > 1 else 0))))


def _group_rows(groups: GroupArrays, ops: Ints, sizes: Ints, into_ops: Ints, into_sizes: Ints) -> np.ndarray:
    """Rows of each group of ``into_ops`` that a batch with ``groups`` (of ``ops`` and ``sizes``)
    fills once padded into them (0 where it has none)."""
    rows = np.zeros(len(into_ops), np.int64)
    rows[_embed(ops, sizes, into_ops, into_sizes)] = groups.count
    return rows


def _cost(layout: BatchLayout) -> tuple[int, int]:
    """Which of several fitting layouts to pad into: the smallest size class, then the fewest
    arena and group rows."""
    return (layout.size_class, sum(layout.arena_rows) + sum(layout.hoist_sizes) + sum(layout.tail_sizes))
