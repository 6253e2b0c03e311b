"""No write of padded rows ever lands on a row something reads: replayed on the host.

Loop items write ``C`` rows per output and per saved buffer whatever their count, hoisted and
tail groups write their real rows. These tests replay every write a batch's executor makes, in
its order, tagging each row with the node that wrote it (or as padding), and check that every
row read (by a later node, a root, a metric, or the backward pass from the final arenas and
saved buffers) holds what its producer wrote. They cover the models the gradient tests use,
weave, and random models from ``benchmarks.random_models``, in the ``save`` mode with every saving
operation in one shared buffer (the most sharing a batch can have).
"""

from __future__ import annotations

import numpy as np
import pytest

import fold as fd
from benchmarks.random_models import random_model
from examples import weave
from fold.compiler.executor import _SavedBuffers
from fold.scheduler.schedule import item_sizes
from tests.models import MODELS

PAD, INITIAL = -1, -2  # tags of rows holding padding, and of rows as initialised (constants, zeros)


class _Arenas:
    """Row tags per arena type; every real write is checked to be a row's only one. Rows past the
    ``used`` rows of a type (its dump rows, and in a padded layout the rows the batch leaves
    empty) take the writes of outputs that nothing reads, tagged as padding."""

    def __init__(self, sizes: list[int], used: tuple[int, ...]):
        self.tags = [np.full(n, INITIAL, np.int64) for n in sizes]
        self.used = used
        self.written: list[set] = [set() for _ in sizes]
        self.reads: list[tuple] = []  # (type, row, tag it held when read)

    def write(self, t: int, start: int, nodes: np.ndarray, drop: bool = False) -> None:
        """Rows from ``start`` on written with ``nodes``; with ``drop`` (the scatter of a whole
        group), rows past the arena's end are dropped, else they are an error."""
        rows = start + np.arange(len(nodes))
        if drop:
            rows, nodes = rows[rows < len(self.tags[t])], nodes[rows < len(self.tags[t])]
        assert not len(rows) or rows[-1] < len(self.tags[t]), f"type {t}: write past the arena's end"
        nodes = np.where(rows < self.used[t], nodes, PAD)
        real = rows[nodes >= 0].tolist()
        assert not self.written[t].intersection(real), f"type {t}: rows {real} written twice"
        self.written[t].update(real)
        self.tags[t][rows] = nodes

    def read(self, t: int, rows: np.ndarray) -> None:
        tags = self.tags[t][rows]
        assert np.all(tags != PAD), f"type {t}: rows {rows[tags == PAD]} read while holding padding"
        self.reads.extend(zip([t] * len(rows), rows.tolist(), tags.tolist()))

    def check_final(self) -> None:
        """The backward pass reads every input again from the final arenas."""
        for t, row, tag in self.reads:
            assert self.tags[t][row] == tag, f"type {t}: row {row} overwritten after it was read"


def replay_writes(compiler: fd.Compiler, batch: fd.Batch) -> int:
    """Replays ``batch``'s writes (see the module docstring); asserts on the first bad one and
    returns the number of row reads it checked."""
    arrays, layout = batch.arrays, batch.layout
    C, ops, slot = layout.chunk, compiler.program.ops, compiler.program.slot_index
    in_idx = np.asarray(arrays.in_idx)
    arenas = _Arenas([layout.arena_rows[t] + C for t in range(len(compiler.program.types))],
                     batch.built_stats().type_rows)

    def run_groups(which: str, group_ops: tuple) -> None:
        groups = getattr(arrays, which)
        for h, o in enumerate(group_ops):
            node, count = int(groups.node[h]), int(groups.count[h])
            nodes = node + np.arange(count)
            for j, t in enumerate(ops[o].in_tidx):
                arenas.read(t, in_idx[nodes, j])
            for t, k in ops[o].out_slots:
                arenas.write(t, int(groups.out[h, slot[(t, k)]]), nodes, drop=True)

    run_groups("hoist", layout.hoist_ops)
    sizes = item_sizes(C, layout.num_examples)
    slots_of_type: dict = {}  # every item writes a chunk per output slot any loop operation has
    for o in layout.loop_ops:
        for t, k in ops[o].out_slots:
            slots_of_type[t] = max(slots_of_type.get(t, 0), k + 1)
    loop_slots = [(t, k) for t, n in slots_of_type.items() for k in range(n)]
    saving = {q: ((0, (1,), np.float32),) for q, rows in enumerate(layout.saved_rows) if rows}
    buffers = _SavedBuffers.of(saving, layout.saved_rows, C) if saving else None
    saved = np.full(buffers.rows[0] + C, INITIAL, np.int64) if buffers else None
    saved_reads = []
    for i in range(int(arrays.n_items)):
        q = int(arrays.items_branch[i]) // len(sizes)
        o, first, count = layout.loop_ops[q], int(arrays.items_node[i]), int(arrays.items_count[i])
        size = sizes[int(arrays.items_branch[i]) % len(sizes)]
        assert count <= size <= C
        nodes = np.where(np.arange(C) < count, first + np.arange(C), PAD)
        for j, t in enumerate(ops[o].in_tidx):
            arenas.read(t, in_idx[first:first + count, j])
        for t, k in loop_slots:  # the operation's outputs, or padding
            arenas.write(t, int(arrays.items_out[i, slot[(t, k)]]), nodes if (t, k) in ops[o].out_slots
                         else np.full(C, PAD))
        if buffers and buffers.first_rows[0][q] >= 0:
            start = int(buffers.first_rows[0][q]) + int(arrays.items_saved[i])
            saved[start:start + C] = nodes
            saved_reads.append((start, nodes[:count]))
        elif buffers:  # an operation that saves nothing writes its zeros to the dump rows
            saved[buffers.rows[0]:] = PAD
    run_groups("tail", layout.tail_ops)
    for rows, t in zip(arrays.roots, [compiler.program.type_index[leaf] for leaf in compiler.program.root_leaves]):
        arenas.read(t, np.asarray(rows))
    for name, m in arrays.metrics.items():
        arenas.read(compiler.program.type_index[compiler.program.metric_types[name]], m.rows[m.mask])
    arenas.check_final()
    for start, nodes in saved_reads:  # the backward pass reads each item's saved rows back
        np.testing.assert_array_equal(saved[start:start + len(nodes)], nodes, "saved rows overwritten")
    return len(arenas.reads) + sum(len(nodes) for _, nodes in saved_reads)


def _weave(n: int) -> tuple:
    return weave.build_weave(4, modules=2), None, [weave.random_molecule(np.random.default_rng(k), 3, 6)
                                                     for k in range(n)]


@pytest.mark.parametrize("chunk", [8, 32])
@pytest.mark.parametrize("name", [*sorted(MODELS), "weave"])
def test_no_padded_write_lands_on_a_row_that_is_read(name, chunk):
    block, _, examples = (_weave if name == "weave" else MODELS[name])(n=12)
    compiler = fd.Compiler.create(block, backward="save", chunk_size=chunk)
    batch = compiler.build_batch(examples, exact_layout=True)  # no headroom to hide a bad write
    if name in ("rnn", "tree_lstm", "weave"):  # loop matmuls to save
        assert batch.layout.saved_rows
    assert replay_writes(compiler, batch) >= batch.stats.num_nodes


@pytest.mark.parametrize("seed", range(40))
def test_no_padded_write_lands_on_a_row_that_is_read_in_random_models(seed):
    model = random_model(seed, n=10)
    compiler = fd.Compiler.create(model.block, backward="save", chunk_size=(8, 16, 32)[seed % 3])
    batch = compiler.build_batch(model.examples, exact_layout=True)
    assert replay_writes(compiler, batch) >= batch.stats.num_nodes  # every node's inputs, at least
