"""Loop steps: which loop iteration each node runs in, chosen to make few groups.

The loop runs one *group* (an operation's nodes at one step) per work item, so what a batch's
loop costs is roughly its number of groups, not its number of steps. Depths (a node runs one
step after its deepest input, as Fold batches) make a group of every operation present at a
depth. When an operation's nodes sit at different distances from the leaves they split across
depths: in a graph network whose neighbour sums are balanced trees of additions as deep as
each node's degree needs, the message and update layers of one round land on as many depths
as there are tree heights, each depth running three operations on a few rows where one would
run on all of them.

``loop_steps`` schedules instead as a list scheduler does (DyNet's agenda is one): a node is
*ready* once its inputs ran; each step picks one operation and runs all of its ready nodes.
Which one:

1. one whose wave is whole: none of its waiting nodes could join it later. A node's *rank* is
   the most nodes of its own operation on any path to it (itself included): the message layer
   of round ``r`` has rank ``r`` whatever the additions before it. An operation is whole when
   every waiting node of it has a higher rank than all its ready ones (it waits on a node of
   its own operation, so it could not run now anyway);
2. among those (or among all, if none is whole), the one whose ready nodes start the longest
   chain of calls still to run (critical path first, so the loop does not end on a tail of
   nodes that could have run beside others).

Steps then hold one operation each. Where Fold's depths already do (every loop depth holds one
operation, as in a tree model with one cell), or where the steps would make no fewer groups,
the depths stay as they are. The result orders the loop: every node runs after its inputs.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

__all__ = ["loop_steps"]


def _by_level(level: np.ndarray) -> dict[int, np.ndarray]:
    """Positions of ``level``, per value, in increasing order of value."""
    if not len(level):
        return {}
    # A stable sort of 16-bit keys is a radix sort: depths fit.
    key = level.astype(np.uint16) if 0 <= level.min() and level.max() < 1 << 16 else level
    order = np.argsort(key, kind="stable")
    parts = np.split(order, np.flatnonzero(np.diff(level[order])) + 1)
    return {int(level[p[0]]): p for p in parts}


def _heights(depth: np.ndarray, producer: np.ndarray, consumer: np.ndarray) -> np.ndarray:
    """Per node, the most calls on a path from it to a node nothing reads (itself included)."""
    height = np.ones(len(depth), np.int64)
    # Producers in decreasing depth: all consumers of a producer are deeper, hence final.
    for edges in reversed(_by_level(depth[producer]).values()):
        np.maximum.at(height, producer[edges], height[consumer[edges]] + 1)
    return height


def _ranks(depth: np.ndarray, column: np.ndarray, producer: np.ndarray, consumer: np.ndarray,
           nodes: np.ndarray, columns: int) -> np.ndarray:
    """Per node of ``nodes``, the most nodes of its own operation (``column``) on a path to it,
    itself included; paths through ``producer -> consumer`` edges among ``nodes``."""
    counts = np.zeros((len(depth), columns), np.int32)
    edges_at = _by_level(depth[consumer])
    for d, level in _by_level(depth[nodes]).items():
        at = nodes[level]
        if d in edges_at:  # inputs are shallower: their counts are final
            edges = edges_at[d]
            np.maximum.at(counts, consumer[edges], counts[producer[edges]])
        counts[at, column[at]] += 1
    ranks: np.ndarray = counts[nodes, column[nodes]].astype(np.int64)
    return ranks


def loop_steps(n_op: np.ndarray, depth: np.ndarray, producer: np.ndarray, consumer: np.ndarray,
               loop: np.ndarray) -> tuple[np.ndarray, int]:
    """Steps for the loop's nodes (see the module docstring).

    Args:
      n_op: ``[nodes]`` each node's operation.
      depth: ``[nodes]`` each node's depth (1 + its deepest input's).
      producer, consumer: ``[edges]`` the node computing an input and the node reading it.
      loop: ``[nodes]`` whether the loop runs the node (others run before or after it).

    Returns:
      ``(steps, last)``: ``depth`` with each loop node's entry replaced by its step (from 2, as
      loop depths start) and the last step, or ``depth`` unchanged and its deepest loop depth
      where the steps would not make fewer groups.
    """
    nodes = np.flatnonzero(loop)
    last_depth = int(depth[nodes].max(initial=1))
    pairs = np.unique(depth[nodes] * (int(n_op.max(initial=0)) + 1) + n_op[nodes])
    if len(pairs) == len(np.unique(depth[nodes])):  # one operation per depth: nothing to merge
        return depth, last_depth
    inner = loop[producer] & loop[consumer]
    prod, cons = producer[inner], consumer[inner]
    ops = np.unique(n_op[nodes])
    op_column = np.zeros(int(n_op.max()) + 1, np.int64)
    op_column[ops] = np.arange(len(ops))
    height = _heights(depth, producer, consumer)
    rank = np.zeros(len(depth), np.int64)
    rank[nodes] = _ranks(depth, op_column[n_op], prod, cons, nodes, len(ops))

    steps, step = depth.copy(), 1
    for run in _greedy(op_column[n_op], rank, height, nodes, prod, cons, len(ops)):
        step += 1
        steps[run] = step
    if step - 1 >= len(pairs):  # no fewer groups than the depths make
        return depth, last_depth
    return steps, step


def _greedy(column: np.ndarray, rank: np.ndarray, height: np.ndarray, nodes: np.ndarray, prod: np.ndarray,
            cons: np.ndarray, columns: int) -> Iterator[list[int]]:
    """The steps' nodes, step after step (the module docstring's rule). Plain Python over lists:
    the loop does a few operations per node and edge, where NumPy would pay its call overhead on
    every one of the many small steps of a chain-shaped batch."""
    n = len(column)
    waiting = np.bincount(cons, minlength=n).tolist()  # inputs not yet run, per node
    order = np.argsort(prod, kind="stable")
    readers = cons[order].tolist()
    first = np.searchsorted(prod[order], np.arange(n + 1)).tolist()
    # Nodes not yet ready per (operation, rank); an operation's lowest such rank only grows.
    counts = np.zeros((columns, int(rank.max(initial=0)) + 2), np.int64)
    np.add.at(counts, (column[nodes], rank[nodes]), 1)
    blocked, lowest = counts.tolist(), [0] * columns
    col, ranks, heights = column.tolist(), rank.tolist(), height.tolist()
    ready: list[list[int]] = [[] for _ in range(columns)]
    top_rank, top_height = [0] * columns, [0] * columns  # highest rank and height of the ready

    def make_ready(new: list[int]) -> None:
        for c in new:
            k, r, h = col[c], ranks[c], heights[c]
            ready[k].append(c)
            blocked[k][r] -= 1
            if r > top_rank[k]:
                top_rank[k] = r
            if h > top_height[k]:
                top_height[k] = h

    make_ready([c for c in nodes.tolist() if not waiting[c]])
    while True:
        present = [k for k in range(columns) if ready[k]]
        if not present:
            return
        whole = []
        for k in present:
            row, low = blocked[k], lowest[k]
            while low < len(row) and not row[low]:
                low += 1
            lowest[k] = low
            if low > top_rank[k]:
                whole.append(k)
        k = max(whole or present, key=top_height.__getitem__)
        run, ready[k], top_rank[k], top_height[k] = ready[k], [], 0, 0
        yield run
        new = []
        for r in run:
            for c in readers[first[r]:first[r + 1]]:
                w = waiting[c] - 1
                waiting[c] = w
                if not w:
                    new.append(c)
        make_ready(new)
