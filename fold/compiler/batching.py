"""``Batcher``: a compiler's batch stream, from Python examples to batches in handed-out layouts.

It walks the examples on the host (or gathers recorded ones), schedules them, lets the save
policy decide what the backward pass keeps, pads each batch into a layout handed out before
(``fold/scheduler/layouts.py``), and counts it. ``Compiler.build_batch``, ``record`` and
``batches`` are this module's entry points with their public documentation; sharded batches are
assembled here from the pieces of ``fold/compiler/sharding.py``.
"""

from __future__ import annotations

import itertools
import uuid
import weakref
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from typing import NoReturn

import jax
import numpy as np

from fold.blocks.host import HostValue
from fold.blocks.tensors import flatten_value
from fold.compiler import sharding
from fold.compiler.progress import tqdm_class
from fold.compiler.saving import SavePolicy
from fold.compiler.sharding import Devices, ShardedBatch
from fold.compiler.stats import StatsRecorder
from fold.errors import InvalidConstant, check_examples, check_int
from fold.scheduler import layouts
from fold.scheduler.background import Chunk, ChunkSizes, IdlePool, Job, build_ahead
from fold.scheduler.batch import Batch
from fold.scheduler.builder import BatchBuilder, ExampleChunk, gc_paused, run_examples
from fold.scheduler.layouts import LayoutPolicy, sample_ahead
from fold.scheduler.program import Program
from fold.scheduler.records import RecordedExamples, record
from fold.scheduler.schedule import schedule, stream_chunk
from fold.scheduler.walk import walk
from fold.typing import PyObject

__all__ = ["Batcher"]


class Batcher:
    """Builds one compiler's batches (see ``Compiler.build_batch``, ``record`` and ``batches``).

    Attributes:
      program: the model.
      chunk_sizes: the candidates for C.
      token: marks the examples and batches this batcher makes (``apply`` checks it).
    """

    def __init__(self, program: Program, chunk_sizes: tuple[int, ...], saving: SavePolicy, max_layouts: int,
                 stats: StatsRecorder):
        self.program = program
        self.chunk_sizes = chunk_sizes
        self.token = uuid.uuid4().hex
        self._saving = saving
        self._stats = stats
        type_shapes = [(t.shape, t.dtype) for t in program.types]
        self._layouts = LayoutPolicy(type_shapes, max_layouts)
        self._shared_layouts = sharding.SharedLayouts(type_shapes)
        # Per batch size, the C its streams build with (``_stream``).
        self._stream_chunks: dict[int, int] = {}
        # Worker processes of ``batches(num_workers=...)``, kept between calls and stopped with the batcher.
        self._idle_workers = IdlePool()
        weakref.finalize(self, self._idle_workers.close)

    # -------------------------------------------------------------- one batch
    def build(self, examples: Sequence[PyObject], keep_host: bool = False, dataset_indices: Sequence[int] | None = None,
              indexed: bool = True, chunk_sizes: ChunkSizes = None) -> tuple[Batch, BatchBuilder, list[HostValue]]:
        """The batch of ``examples`` in its own layout, with the builder that recorded it and each
        example's host value; ``C`` is picked among ``chunk_sizes`` (default: the compiler's).
        Errors name each example by its position, its ``dataset_indices`` entry, or
        (``indexed=False``, one example on its own) as "the input"."""
        builder, outputs = run_examples(self.program, examples, indexed, dataset_indices)
        with gc_paused():
            try:
                batch = schedule(self.program, builder.arrays(), self._roots(outputs), len(examples),
                                 chunk_sizes or self.chunk_sizes, keep_host, owner=self.token)
            except InvalidConstant as e:
                self.raise_invalid_constant(examples, e, dataset_indices)
        return batch, builder, outputs

    def _roots(self, outputs: list[HostValue]) -> list[np.ndarray]:
        """Per root tensor leaf, the value id it has in each example's host output."""
        if not self.program.root_leaves:
            return []
        ids = np.asarray([flatten_value(v) for v in outputs], np.int64).reshape(len(outputs), -1)
        return [ids[:, leaf] for leaf in range(len(self.program.root_leaves))]

    def raise_invalid_constant(self, examples: Sequence[PyObject], e: InvalidConstant,
                               dataset_indices: Sequence[int] | None = None) -> NoReturn:
        """A layer rejected a constant input (checked for all calls at once): the walk, which checks
        call by call, runs the examples again to raise it like any malformed example, naming the
        first bad one and its block path."""
        for i, x in enumerate(examples):
            again = BatchBuilder(self.program)
            again.example_index, again.dataset_indices = i, dataset_indices
            try:
                walk(self.program.root, x, again)
            finally:
                again.finish()
        raise e.error from None

    def build_batch(self, examples: Iterable[PyObject] | RecordedExamples, exact_layout: bool = False,
                    devices: Devices | None = None, axis: str = sharding.AXIS) -> Batch | ShardedBatch:
        """``Compiler.build_batch``."""
        if not isinstance(examples, RecordedExamples):
            examples = list(check_examples(examples, "build_batch"))
        if devices is not None:
            if exact_layout:
                raise ValueError("exact_layout and devices do not go together: a sharded batch's parts share a layout")
            return self.build_sharded(examples, devices, axis, None)
        batch = self._saving.decide(self.build_own(examples))
        if not exact_layout:
            batch = self._layouts.assign(batch)
        batch.example_indices = (examples.indices if isinstance(examples, RecordedExamples)
                                 else np.arange(len(examples)))
        self._stats.built(batch)
        return batch

    def build_own(self, examples: Iterable[PyObject] | Chunk, chunk_sizes: ChunkSizes = None) -> Batch:
        """The batch of ``examples`` in its own layout, before the save policy and the layout
        policy see it, and not counted in ``stats``: NumPy only (workers run this). ``C`` is
        picked among ``chunk_sizes`` (default: the compiler's)."""
        if isinstance(examples, RecordedExamples):
            self.check_owner(examples)
            if not len(examples):
                raise ValueError("build_batch needs at least one example")
            rec, roots = examples.merged()
            return schedule(self.program, rec, roots, len(examples), chunk_sizes or self.chunk_sizes, check=False,
                            owner=self.token)
        if isinstance(examples, ExampleChunk):
            return self.build(examples.examples, dataset_indices=examples.indices, chunk_sizes=chunk_sizes)[0]
        examples = examples if isinstance(examples, list) else list(examples)  # build_batch listed them
        if not examples:
            raise ValueError("build_batch needs at least one example")
        return self.build(examples, chunk_sizes=chunk_sizes)[0]

    def check_owner(self, recorded: RecordedExamples) -> None:
        """Raises ValueError unless this batcher recorded ``recorded``."""
        if recorded.owner != self.token:
            raise ValueError("these examples were recorded by another compiler; record them with this one")

    # ---------------------------------------------------------------- sharded
    def build_sharded(self, examples: list[PyObject] | Chunk, devices: Devices, axis: str,
                      dataset_indices: Sequence[int] | None) -> ShardedBatch:
        """This process's examples as its share of a ``ShardedBatch`` over ``devices``."""
        mesh = sharding.device_mesh(devices, axis)
        recorded = self._recorded(examples, dataset_indices)
        local = sharding.local_devices(mesh, axis)
        if not local:
            raise ValueError(f"no device of the mesh belongs to process {jax.process_index()}")
        costs = recorded.node_counts()
        members = sharding.partition(costs, len(local))
        # A device with no example of its own runs the cheapest one again, its rows marked padding.
        filler = np.asarray([int(np.argmin(costs))])
        parts = self._shared_parts([recorded[m if len(m) else filler] for m in members])
        counts = sharding.gather_counts(len(recorded))
        offset = int(counts[:jax.process_index()].sum())
        rows = parts[0].layout.num_examples
        example_map = np.full((len(local), rows), -1, np.int32)
        positions = np.zeros(len(recorded), np.int32)
        for k, (d, m) in enumerate(zip(local, members)):
            example_map[k, :len(m)] = offset + m
            positions[m] = d * rows + np.arange(len(m))
        batch = sharding.assemble(parts, example_map, sharding.gather_positions(positions, counts), mesh, axis,
                                  self.token)
        batch.nodes = np.asarray([costs[m].sum() for m in members])
        batch.example_indices = np.arange(len(recorded)) if dataset_indices is None else np.asarray(dataset_indices)
        for part in parts:
            self._stats.built(part)
        return batch

    def _recorded(self, examples: list[PyObject] | Chunk, dataset_indices: Sequence[int] | None) -> RecordedExamples:
        """``examples`` recorded by this batcher (at least one)."""
        if isinstance(examples, RecordedExamples):
            recorded = examples
        else:
            listed = examples.examples if isinstance(examples, ExampleChunk) else list(examples)
            recorded = self._record(listed, listed, dataset_indices)
        if not len(recorded):
            raise ValueError("build_batch needs at least one example")
        self.check_owner(recorded)
        return recorded

    def _shared_parts(self, shares: list[RecordedExamples]) -> list[Batch]:
        """The batches of each device's share, in one layout shared with every other process."""
        parts = [self.build_own(share) for share in shares]
        # Each part picks its own C (a small part may take a smaller one); the step's parts, here
        # and in every other process, share a layout, so they all take the largest.
        chunk = int(sharding.gather_counts(max(p.layout.chunk for p in parts)).max())
        parts = [self._saving.decide(p if p.layout.chunk == chunk else self.build_own(share, chunk_sizes=(chunk,)))
                 for p, share in zip(parts, shares)]
        return self._shared_layouts.pad(parts, sharding.gather_layouts)

    # ----------------------------------------------------------------- stream
    def record(self, examples: Iterable[PyObject] | RecordedExamples, progress: bool = False) -> RecordedExamples:
        """``Compiler.record``."""
        if isinstance(examples, RecordedExamples):  # recorded already (a notebook cell run twice)
            self.check_owner(examples)
            return examples
        examples = list(check_examples(examples, "record"))
        walked: Iterable[PyObject] = examples
        if progress:
            walked = tqdm_class()(examples, desc="recording examples", unit="ex")
        return self._record(examples, walked)

    def _record(self, examples: list[PyObject], walked: Iterable[PyObject],
                dataset_indices: Sequence[int] | None = None) -> RecordedExamples:
        """``examples`` (iterated as ``walked``, a progress bar's wrapper, say) recorded; a rejected
        constant raises as ``build_batch`` raises it."""
        try:
            return record(self.program, walked, self.token, dataset_indices)
        except InvalidConstant as e:
            self.raise_invalid_constant(examples, e, dataset_indices)

    def batches(self, examples: Iterable[PyObject] | RecordedExamples, batch_size: int, shuffle: bool = False,
                num_workers: int = 0, drop_remainder: bool = False, seed: int | None = None,
                devices: Devices | None = None, axis: str = sharding.AXIS,
                prefetch: bool = True) -> Iterator[Batch] | Iterator[ShardedBatch]:
        """``Compiler.batches``: the arguments are checked when it is called, not when it is first
        iterated."""
        batch_size, num_workers = check_int("batch_size", batch_size, 1), check_int("num_workers", num_workers, 0)
        if devices is not None and num_workers:
            raise ValueError("batches(devices=...) builds in the calling process: pass num_workers=0 "
                             "(several processes each build their own share)")
        if not isinstance(examples, RecordedExamples):
            check_examples(examples, "batches")
        pieces = _pieces(examples, batch_size, shuffle, drop_remainder, seed)
        if devices is not None:
            return (self.build_sharded(chunk, devices, axis, idx.tolist()) for chunk, idx in pieces)
        return self._stream(pieces, num_workers, prefetch, batch_size)

    def _stream(self, pieces: Iterator[tuple[Chunk, np.ndarray]], num_workers: int, prefetch: bool,
                batch_size: int) -> Iterator[Batch]:
        """The batches of ``pieces``, built in the caller, on a thread or in workers, all with the
        ``C`` that ``stream_chunk`` picks from the first ``layouts.PLAN_AHEAD`` (kept for later streams of
        ``batch_size``): a batch built before it was picked is built again if it took another."""
        indices: deque[np.ndarray] = deque()
        waiting: deque[Chunk] = deque()
        chunk = self._stream_chunks.get(batch_size)

        def jobs() -> Iterator[Job]:
            # Read lazily as batches are built ahead: a stream of examples is taken only as far as
            # the batches need. Each chunk waits for its batch in ``waiting``, its indices in ``indices``.
            for examples, idx in pieces:
                indices.append(idx)
                waiting.append(examples)
                yield examples, None if chunk is None else (chunk,)

        def one_chunk(built: Iterator[Batch]) -> Iterator[Batch]:
            nonlocal chunk
            sample, error = sample_ahead(built, layouts.PLAN_AHEAD) if chunk is None else ([], None)
            if sample:
                chunk = stream_chunk([np.asarray(b.built_stats().group_rows, np.int64) for b in sample],
                                     self.chunk_sizes)
                if len(sample) == layouts.PLAN_AHEAD:  # a short stream's pick is its own
                    self._stream_chunks[batch_size] = chunk
            for batch in itertools.chain(sample, built):
                examples = waiting.popleft()
                if batch.layout.chunk != chunk:  # built before the stream picked its C
                    batch = self.build_own(examples, None if chunk is None else (chunk,))
                yield batch
            if error is not None:
                raise error

        built = ((self.build_own(*job) for job in jobs()) if num_workers == 0 and not prefetch
                 else build_ahead(self.build_own, jobs(), num_workers, self._idle_workers))
        # Saving is decided and layouts are handed out here, in the batches' order, the first
        # layouts planned from a few batches ahead.
        for batch in self._layouts.stream(map(self._saving.decide, one_chunk(built))):
            batch.example_indices = indices.popleft()
            self._stats.built(batch)  # counted here: workers have their own copy of the counters
            yield batch


def _pieces(examples: Iterable[PyObject] | RecordedExamples, batch_size: int, shuffle: bool, drop_remainder: bool,
            seed: int | None) -> Iterator[tuple[Chunk, np.ndarray]]:
    """``batches``' examples cut into batches, each with its examples' indices in ``examples``:
    lazily, reading ``examples`` as far as the batches taken need, unless they are shuffled
    (a permutation needs them all)."""
    if isinstance(examples, RecordedExamples) or shuffle:
        every = examples if isinstance(examples, RecordedExamples) else list(examples)
        order = np.random.default_rng(seed).permutation(len(every)) if shuffle else np.arange(len(every))
        for start in range(0, len(order), batch_size):
            idx = order[start:start + batch_size]
            if drop_remainder and len(idx) < batch_size:
                return
            yield (every[idx] if isinstance(every, RecordedExamples)
                   else ExampleChunk([every[j] for j in idx], idx.tolist())), idx
        return
    stream = iter(examples)
    for start in itertools.count(0, batch_size):
        piece = list(itertools.islice(stream, batch_size))
        if not piece or (drop_remainder and len(piece) < batch_size):
            return
        idx = np.arange(start, start + len(piece))
        yield ExampleChunk(piece, idx.tolist()), idx
