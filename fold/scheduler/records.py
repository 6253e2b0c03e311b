"""Examples walked once and kept as arrays, so that later batches skip the host walk.

Walking an example (running the model's host plan over it) is most of
what building a batch costs, and in training it gives the same result
every epoch. ``record`` walks every example once and keeps what each
recorded (its values, operation calls, constants, metric entries and
root ids, numbered from 0 within the example) in flat arrays, one set
for all examples, with each example's start offsets. A batch of recorded
examples is then a gather of their ranges plus the offsets that renumber
ids into the batch (``RecordedExamples.merged``), all vectorised NumPy.

A merged batch computes what a batch built from the same examples
computes. It is not identical array for array: each recorded example
keeps its own copy of constants that a batch shares between examples
(the zeros of an empty ``Fold``, say), so a merged batch may use a few
more rows.
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from fold.blocks.tensors import flatten_value
from fold.scheduler.builder import BatchBuilder, Recorded, gc_paused
from fold.scheduler.schedule import check_constants
from fold.typing import PyObject

if TYPE_CHECKING:
    from fold.scheduler.program import Program

__all__ = ["RecordedExamples", "ByReference", "record", "next_serial"]


class _Data(NamedTuple):
    """Recorded examples' arrays, ids local to each example; ``*_start`` (one more row than there
    are examples) are where each example's entries begin."""

    rec: Recorded            # metric_examples empty
    roots: np.ndarray        # (examples, root leaves): value id of each root leaf
    val_start: np.ndarray
    node_start: np.ndarray
    in_start: np.ndarray
    const_start: np.ndarray  # (examples + 1, types)
    metric_start: dict[str, np.ndarray]  # per metric name


def _ranges(starts: np.ndarray, sel: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Positions of the entries of examples ``sel`` (in that order), and each one's count."""
    lo = starts[sel]
    n = starts[sel + 1] - lo
    return np.repeat(lo - (np.cumsum(n) - n), n) + np.arange(int(n.sum())), n


def _starts(counts: np.ndarray) -> np.ndarray:
    out = np.zeros((len(counts) + 1, *counts.shape[1:]), np.int64)
    np.cumsum(counts, 0, out=out[1:])
    return out


def _subset(d: _Data, sel: np.ndarray) -> _Data:
    """Examples ``sel`` of ``d``, in that order."""
    rec = d.rec
    vi, vn = _ranges(d.val_start, sel)
    ni, nn = _ranges(d.node_start, sel)
    ii, inn = _ranges(d.in_start, sel)
    consts, const_counts = [], np.zeros((len(sel), len(rec.consts)), np.int64)
    for t, (values, filled) in enumerate(rec.consts):
        ci, const_counts[:, t] = _ranges(d.const_start[:, t], sel)
        consts.append((values[ci], filled[ci]))
    metric_values, metric_start, metric_labels = {}, {}, {}
    for name, vids in rec.metric_values.items():
        mi, mn = _ranges(d.metric_start[name], sel)
        metric_values[name], metric_start[name] = vids[mi], _starts(mn)
        if name in rec.metric_labels:
            labels = rec.metric_labels[name]
            metric_labels[name] = [labels[j] for j in mi.tolist()]
    sub = Recorded(rec.v_type[vi], rec.v_node[vi], rec.v_pos[vi], rec.n_op[ni], rec.n_depth[ni], rec.n_inputs[ii],
                   consts, metric_values, {}, metric_labels)
    return _Data(sub, d.roots[sel], _starts(vn), _starts(nn), _starts(inn), _starts(const_counts), metric_start)


def _renumber(d: _Data, sign: int) -> tuple[Recorded, np.ndarray]:
    """``d``'s recorded work and roots with ids numbered across all its examples (``sign=1``) or,
    from such numbering, local to each example (``sign=-1``)."""
    rec = d.rec
    example_of_value = np.repeat(np.arange(len(d.roots)), np.diff(d.val_start))
    val_first = d.val_start[:-1]
    is_const = rec.v_node < 0
    v_pos = np.where(is_const, rec.v_pos + sign * d.const_start[example_of_value, rec.v_type], rec.v_pos)
    v_node = np.where(is_const, rec.v_node, rec.v_node + sign * d.node_start[example_of_value])
    n_inputs = rec.n_inputs + sign * np.repeat(val_first, np.diff(d.in_start))
    metric_values, metric_examples = {}, {}
    for name, vids in rec.metric_values.items():
        counts = np.diff(d.metric_start[name])
        metric_values[name] = vids + sign * np.repeat(val_first, counts)
        if sign > 0:  # the batch's metrics say which example each entry belongs to
            metric_examples[name] = np.repeat(np.arange(len(d.roots)), counts)
    out = rec._replace(v_node=v_node, v_pos=v_pos, n_inputs=n_inputs, metric_values=metric_values,
                       metric_examples=metric_examples)
    return out, d.roots + sign * val_first[:, None]


# The recordings alive in this process, by serial number. A worker forked after a recording was made
# holds a copy of it, so the consumer can send that worker indices instead of arrays (``ByReference``).
_recordings: weakref.WeakValueDictionary[int, _Store] = weakref.WeakValueDictionary()
_serials = itertools.count()


def next_serial() -> int:
    """A number above the serial of every recording made so far in this process."""
    return next(_serials)


class _Store:
    """One recording's arrays, registered under a serial number while alive."""

    __slots__ = ("data", "serial", "__weakref__")

    def __init__(self, data: _Data):
        self.data = data
        self.serial = next_serial()
        _recordings[self.serial] = self


class ByReference(NamedTuple):
    """Recorded examples named by their recording's serial number and their indices: what a worker
    forked after the recording was made needs (``RecordedExamples.by_reference``)."""

    serial: int
    owner: str
    index: np.ndarray  # type: ignore[assignment]  # a NamedTuple field named like tuple's method

    def resolve(self) -> RecordedExamples:
        """The recorded examples, in a process that holds the recording."""
        store = _recordings.get(self.serial)
        if store is None:
            raise RuntimeError(f"recording {self.serial} is not in this process")
        return RecordedExamples(store, self.owner, self.index)


class RecordedExamples:
    """Examples recorded by ``compiler.record``: pass them (or a slice, or an index array) to
    ``build_batch`` and ``batches`` in place of the examples.

    Indexing with an int, a slice, or an array of ints (or a boolean mask)
    gives the recorded examples it selects, in that order, without copying.
    Pickling stores only the selected examples; ``batches(..., num_workers=n)``
    sends workers forked after the recording was made only the indices. Recorded examples belong to the compiler
    that recorded them; another compiler refuses them, even one made from
    the same model.
    """

    @property
    def owner(self) -> str:
        """The token of the compiler that recorded these examples."""
        return self._owner

    def __init__(self, store: _Store, owner: str, index: np.ndarray | None = None):
        self._store = store
        self._owner = owner
        self._index = np.arange(len(store.data.roots)) if index is None else index

    @property
    def _data(self) -> _Data:
        return self._store.data

    @property
    def indices(self) -> np.ndarray:
        """The positions in the recording of the examples these select, in order."""
        return self._index

    def by_reference(self, before: int) -> ByReference | None:
        """These examples as a ``ByReference`` if their recording was made before serial ``before``
        (so a process forked then has it), else None."""
        return ByReference(self._store.serial, self._owner, self._index) if self._store.serial < before else None

    def __len__(self) -> int:
        return len(self._index)

    def node_counts(self) -> np.ndarray:
        """Operation calls (nodes) of each selected example, in order: what a step spends on it."""
        return np.diff(self._data.node_start)[self._index]

    def __repr__(self) -> str:
        return f"RecordedExamples({len(self)} examples)"

    def __getitem__(self, key: int | slice | Sequence[int] | np.ndarray) -> RecordedExamples:
        if isinstance(key, slice):
            return RecordedExamples(self._store, self._owner, self._index[key])
        if isinstance(key, (int, np.integer)):
            if not -len(self) <= key < len(self):
                raise IndexError(f"example {key} is out of range for {len(self)} recorded examples")
            key = [key]
        key = np.asarray(key)
        if key.dtype == bool:
            if key.shape != (len(self),):
                raise IndexError(f"a boolean mask over {len(self)} recorded examples needs shape ({len(self)},), "
                                 f"got {key.shape}")
            key = np.flatnonzero(key)
        elif key.size == 0:
            key = key.astype(np.int64)
        elif key.ndim != 1 or key.dtype.kind not in "iu":
            raise TypeError(f"recorded examples are indexed by an int, a slice, or a 1-d array of ints or bools, "
                            f"got {key!r}")
        return RecordedExamples(self._store, self._owner, self._index[key])

    def _selected(self) -> _Data:
        d = self._data
        whole = len(self._index) == len(d.roots) and np.array_equal(self._index, np.arange(len(d.roots)))
        return d if whole else _subset(d, self._index)

    def __getstate__(self) -> tuple[_Data, str]:
        return self._selected(), self._owner

    def __setstate__(self, state: tuple[_Data, str]) -> None:
        data, owner = state
        self.__init__(_Store(data), owner)  # type: ignore[misc]

    def merged(self) -> tuple[Recorded, list[np.ndarray]]:
        """The selected examples as one batch's recorded work, and its root ids per root leaf."""
        rec, roots = _renumber(self._selected(), 1)
        return rec, [roots[:, leaf] for leaf in range(roots.shape[1])]


def record(program: Program, examples: Iterable[PyObject], owner: str,
           dataset_indices: Sequence[int] | None = None) -> RecordedExamples:
    """Walks every example once (see ``Compiler.record``); ``owner`` identifies the compiler;
    errors name an example by its ``dataset_indices`` entry if given. Raises ``InvalidConstant``
    if a layer rejects a constant input."""
    builder = BatchBuilder(program)
    builder.dataset_indices = dataset_indices
    counts, outputs = [], []
    with gc_paused():
        for i, x in enumerate(examples):
            builder.unshare()
            counts.append(_sizes(builder))
            builder.example_index = i
            outputs.append(builder.run(x))
        counts.append(_sizes(builder))
        builder.example_index = None
        builder.finish()
        rec = builder.arrays()
    check_constants(program, rec)
    n_leaves = len(program.root_leaves)
    roots = np.asarray([flatten_value(v) for v in outputs] if n_leaves else [], np.int64)
    starts = np.asarray(counts, np.int64)
    n_types = len(program.types)
    val_start, node_start, in_start = starts[:, :3].T
    data = _Data(rec, roots.reshape(len(outputs), n_leaves), val_start, node_start, in_start, starts[:, 3:3 + n_types],
                 {name: starts[:, 3 + n_types + k] for k, name in enumerate(rec.metric_values)})
    local, roots = _renumber(data, -1)
    # Ids within one example fit in 32 bits; stored for a whole dataset, 64 would double the memory.
    small = local._replace(**{f: getattr(local, f).astype(np.int32)
                              for f in ("v_type", "v_node", "v_pos", "n_op", "n_depth", "n_inputs")},
                           metric_values={k: v.astype(np.int32) for k, v in local.metric_values.items()})
    return RecordedExamples(_Store(data._replace(rec=small, roots=roots.astype(np.int32))), owner)


def _sizes(b: BatchBuilder) -> list[int]:
    """How many values, nodes, inputs, constants per type and entries per metric ``b`` holds."""
    return [len(b.v_depth), len(b.n_op), len(b.n_inputs), *(len(c) for c in b.consts),
            *(len(v) for v in b.metric_values.values())]
