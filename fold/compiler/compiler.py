"""``Compiler``: validates a block tree and runs batches of examples through it.

Examples:
    >>> import fold as fd, jax
    >>> model = fd.Map(fd.Scalar() >> fd.Function(lambda x: 2 * x)) >> fd.Sum()
    >>> compiler = fd.Compiler.create(model)
    >>> batch = compiler.build_batch([[1, 2], [3]])
    >>> compiler.apply(compiler.init(jax.random.key(0)), batch).outputs.tolist()
    [6.0, 6.0]
"""

from __future__ import annotations

import functools
import itertools
import uuid
import weakref
import zlib
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, NoReturn, overload

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from fold.blocks.base import Repeat
from fold.blocks.tensors import flatten_value, unflatten_value
from fold.blocks.types import (
    BroadcastSequenceType,
    SequenceType,
    TensorType,
    TupleType,
    Type,
    VoidType,
)
from fold.compiler import numerics, sharding
from fold.compiler.executor import Executor
from fold.compiler.program import Program, build_program, root_is_tensors
from fold.compiler.result import MetricValues, Result
from fold.compiler.saving import BACKWARDS, SAVE_LIMIT, SavePolicy, abstract_params
from fold.compiler.sharding import ShardedBatch
from fold.compiler.stats import CompilerStats, StatsRecorder
from fold.errors import InvalidConstant, check_examples, check_int
from fold.scheduler.background import IdlePool, build_ahead
from fold.scheduler.batch import Batch
from fold.scheduler.builder import DEFAULT_LIMITS, BatchBuilder, ExampleChunk, ExampleLimits, gc_paused, run_examples
from fold.scheduler.layouts import LayoutPolicy
from fold.scheduler.records import RecordedExamples, record
from fold.scheduler.schedule import MIN_ITEM, schedule
from fold.scheduler.walk import walk

__all__ = ["Compiler"]

# C candidates: 32 for tiny batches (single trees), 128 for most, 512 for large batches of large
# trees (``pick_chunk`` prices each; docs/performance.md has the measurements).
CHUNK_SIZES = (32, 128, 512)
# Layouts (compilations of each jitted function taking batches) a compiler hands out before it pads
# batches into any layout they fit (fold/scheduler/layouts.py).
MAX_LAYOUTS = 8


class Compiler:
    """Compiles a block into operations and runs batches of examples.

    Create with ``Compiler.create(block)``; then ``init(key)`` makes the
    parameters, ``build_batch(examples)`` builds a schedule on the host and
    ``apply(params, batch)`` runs it (pure and jittable).
    """

    def __init__(self, program: Program, chunk_size: int | Sequence[int] = CHUNK_SIZES, backward: str = "auto",
                 save_limit: int = SAVE_LIMIT, max_layouts: int = MAX_LAYOUTS):
        """A compiler of a built ``Program``; most code calls ``Compiler.create(block)``, which
        builds the program and takes the same options (documented there)."""
        if not isinstance(program, Program):
            raise TypeError("use fd.Compiler.create(block) to make a Compiler")
        sizes = (chunk_size,) if isinstance(chunk_size, (int, np.integer)) else tuple(chunk_size)
        if not sizes or any(not isinstance(c, (int, np.integer)) or c < MIN_ITEM or c & (c - 1) for c in sizes):
            raise ValueError(f"chunk_size must be a power of two >= {MIN_ITEM} or a sequence of them, "
                             f"got {chunk_size!r}")
        if backward not in BACKWARDS:
            raise ValueError(f"backward must be one of {BACKWARDS}, got {backward!r}")
        if isinstance(save_limit, bool) or not isinstance(save_limit, (int, np.integer)) or save_limit < 0:
            raise ValueError(f"save_limit must be a number of bytes >= 0, got {save_limit!r}")
        check_int("max_layouts", max_layouts, 1)
        self.chunk_sizes = tuple(sorted({int(c) for c in sizes}))
        self.program = program
        self.backward = backward
        self.save_limit = int(save_limit)
        self._stats = StatsRecorder()
        self._layouts = LayoutPolicy([(t.shape, t.dtype) for t in program.types], int(max_layouts))
        self._token = uuid.uuid4().hex  # marks the examples and batches this compiler makes
        # Worker processes of ``batches(num_workers=...)``, kept between calls and stopped with the compiler.
        self._idle_workers = IdlePool()
        weakref.finalize(self, self._idle_workers.close)
        self.executor = Executor(program)
        self._param_structs_by_x64: dict[bool, Any] = {}
        self._saving = SavePolicy(backward, self.save_limit, self.executor, lambda: self._param_structs)
        self._arenas_jit = jax.jit(self._arenas)
        self._apply_jit = jax.jit(self._apply)
        self._shared_layouts = sharding.SharedLayouts([(t.shape, t.dtype) for t in program.types])

    def __repr__(self) -> str:
        p = self.program
        return (f"Compiler(root={p.root!r}: {p.root.input_type} -> {p.output_type}, {len(p.ops)} operations, "
                f"layers={sorted(p.layers)}, metrics={list(p.metric_types)}, chunk_size={self.chunk_sizes}, "
                f"backward={self.backward!r})")

    @classmethod
    def create(cls, root_block: Any, chunk_size: int | Sequence[int] = CHUNK_SIZES,
               backward: str = "auto", save_limit: int = SAVE_LIMIT, max_layouts: int = MAX_LAYOUTS,
               fuse: bool = True, max_example_nodes: int = DEFAULT_LIMITS.max_nodes,
               max_recursion: int = DEFAULT_LIMITS.max_recursion) -> Compiler:
        """Validates and type-checks ``root_block`` and enumerates its operations.

        ``chunk_size`` is C, the most rows a loop iteration runs, or several
        candidates: each batch then uses the one whose loop items cost least,
        an item of C rows costing a fixed overhead plus C (``pick_chunk``):
        512 where most of its items would be full (large batches of large
        trees), 32 where it adds few items to a tiny batch (a single tree),
        else 128. Each C a stream of batches uses is one more layout to
        compile.
        ``backward`` picks how gradients of the loop are computed:
        ``"recompute"`` runs each loop item's forward pass again before its
        ``vjp`` (memory stays at the arenas), ``"save"`` keeps each item's
        matmul outputs from the forward pass, one row per loop row (fewer
        FLOPs, more memory: about twice the temporaries for LSTM cells), and
        ``"auto"`` saves only for operations whose forward pass costs at
        least ``SAVE_INTENSITY`` (64) FLOPs per byte saved, and decides per
        batch: it saves when those buffers take at most ``save_limit``
        bytes. On the CPUs we measured, saving was faster while the buffers
        stayed small and slower once they grew large, and slower for narrow
        matmuls (docs/performance.md); ``batch.layout.saved_rows`` is
        non-empty when a batch saves.

        Every distinct ``batch.layout`` compiles each jitted function that
        takes batches once. Batches are padded into layouts handed out
        before where they fit (see ``fold/scheduler/layouts.py``);
        ``batches`` plans the first layout from a few batches ahead, with
        room for the sizes still to come; a batch that fits none gets a new
        layout, which grows the last one of its
        kind so that later batches fit. Past ``max_layouts`` layouts, batches
        are padded into any layout they fit, and only one that fits none
        (a new number of examples or C) compiles, with a warning (logged
        once to the ``fold`` logger, which logs every new layout at INFO).
        ``compiler.stats()`` reports layouts, compile seconds and padding.

        ``fuse`` runs each run of operations in a pipe (``Concat() >>
        FC(n)``, ``Function(f) >> FC(n)``) as one operation, at most one
        layer each (``fold/compiler/fusion.py``): fewer nodes, loop
        iterations and branches to compile, the same numbers. Depths then
        count a fused run once; ``fuse=False`` gives Fold's depths.

        ``max_example_nodes`` and ``max_recursion`` bound one example's
        host work (operation calls, nested ``ForwardDeclaration`` calls):
        an example past either raises ValueError naming it, where an input
        that recursed without end would otherwise fill the memory.

        Args:
          root_block: the model: a block, or anything ``convert_to_block``
            takes (a function, a tuple or dict of blocks).
          chunk_size: C, or candidates for it (powers of two >= 8).
          backward: ``"auto"``, ``"save"`` or ``"recompute"``.
          save_limit: bytes a batch may save under ``"auto"``.
          max_layouts: layouts handed out before batches are padded into
            any layout they fit.
          fuse: run runs of operations in a pipe as one operation.
          max_example_nodes: most operation calls of one example.
          max_recursion: most nested recursive calls in one example.

        Returns:
          A ``Compiler`` holding the model's ``Program``.

        Raises:
          TypeError: a type cannot be inferred or does not check (the
            message names the blocks and types), the root outputs
            something other than tensors, tuples of them or void, a
            ``ForwardDeclaration`` is unresolved, or a ``Composition``'s
            output is unwired or a block's output unread (as in Fold).
          ValueError: a cycle in a ``Composition``, two layers with one
            name, or a bad option.
        """
        if not isinstance(fuse, bool):
            raise TypeError(f"fuse must be True or False, got {fuse!r}")
        limits = ExampleLimits(check_int("max_example_nodes", max_example_nodes, 1),
                               check_int("max_recursion", max_recursion, 1))
        return cls(build_program(root_block, fuse=fuse, limits=limits), chunk_size, backward, save_limit,
                   max_layouts)

    @classmethod
    def for_eval(cls, block: Any) -> Compiler:
        """A compiler for ``block.eval`` and ``block.max_depth``: any root type (sequences and
        Python objects come back as values), small chunks (one branch per operation keeps a
        notebook's compilations quick), a recomputing backward pass, and no fused operations
        (``max_depth`` counts every operation, as Fold does)."""
        return cls(build_program(block, any_root=True, fuse=False), chunk_size=8, backward="recompute")

    # ---------------------------------------------------------- parameters
    def init(self, key: jax.Array) -> dict:
        """Parameters for every layer: ``{layer name: params}``.

        Each layer's key is derived from ``key`` and its name, so adding a
        layer does not change the others' initial values.

        Args:
          key: a PRNG key, e.g. ``jax.random.key(0)``.

        Returns:
          ``{layer name: that layer's parameter pytree}``.

        Raises:
          TypeError: ``key`` is not a PRNG key.
        """
        if not _is_key(key):
            raise TypeError(f"init needs a PRNG key such as jax.random.key(0), got {key!r}")
        params = {}
        for name, (layer, t) in sorted(self.program.layers.items()):
            params[name] = layer.init(jax.random.fold_in(key, zlib.crc32(name.encode())), t)
        return params

    def prepare_params(self, params: Any) -> dict:
        """Checks ``params`` and stops gradients of non-trainable layers (``apply`` calls this).

        Raises:
          TypeError: ``params`` is not a dict, or a layer's parameters have
            another structure, shape or dtype than ``init`` gives them.
          KeyError: a layer has no entry.
        """
        if not isinstance(params, dict):
            raise TypeError(f"params must be the dict from compiler.init, got {type(params).__name__}")
        missing = [n for n in self.program.layers if n not in params]
        if missing:
            raise KeyError(f"params has no entry for layer(s) {missing}; make them with compiler.init")
        self._check_param_shapes(params)
        out = dict(params)
        for name, (layer, _) in self.program.layers.items():
            if not layer.trainable:
                out[name] = jax.lax.stop_gradient(params[name])
        return out

    @property
    def _param_structs(self) -> Any:
        """What ``init`` gives: per layer, its parameters' shapes and dtypes (which depend on
        whether 64-bit types are on)."""
        x64 = bool(jax.config.read("jax_enable_x64"))
        if x64 not in self._param_structs_by_x64:
            self._param_structs_by_x64[x64] = abstract_params(self.init)
        return self._param_structs_by_x64[x64]

    def _check_param_shapes(self, params: dict) -> None:
        """Every layer's parameters have the structure, shapes and dtypes ``init`` gives them: a
        bias of shape (1,) for (4,) or int32 weights would otherwise broadcast or cast silently.
        Runs where ``apply`` is traced (shapes are static), so once per layout."""
        for name in sorted(self.program.layers):
            want, got = self._param_structs[name], params[name]
            want_leaves, want_tree = jax.tree_util.tree_flatten_with_path(want)
            got_leaves, got_tree = jax.tree_util.tree_flatten_with_path(got)
            if want_tree != got_tree:  # type: ignore[operator]  # jaxlib's stubs omit PyTreeDef.__ne__
                raise TypeError(f"params[{name!r}] has structure {got_tree}, but layer {name!r} has "
                                f"{want_tree}; make params with compiler.init")
            for (path, w), (_, g) in zip(want_leaves, got_leaves):
                shape, dtype = np.shape(g), (g.dtype if hasattr(g, "dtype") else np.asarray(g).dtype)
                if shape != w.shape or np.dtype(dtype) != np.dtype(w.dtype):
                    raise TypeError(f"params[{name!r}]{jax.tree_util.keystr(path)} has shape {shape} and dtype "
                                    f"{np.dtype(dtype)}, but layer {name!r} needs shape {w.shape} and dtype "
                                    f"{np.dtype(w.dtype)}; make params with compiler.init")

    # -------------------------------------------------------------- batches
    def saved_row_bytes(self, chunk: int) -> tuple[int, ...]:
        """Per operation (in ``ops`` order), the bytes this compiler's backward pass keeps per loop
        row with chunk size ``chunk`` when a batch saves (``SavePolicy.row_bytes``)."""
        return self._saving.row_bytes(chunk)

    def _build(self, examples: Sequence[Any], keep_host: bool = False,
               dataset_indices: Sequence[int] | None = None) -> tuple[Batch, BatchBuilder, list]:
        builder, outputs = run_examples(self.program, examples, dataset_indices=dataset_indices)
        with gc_paused():
            roots = self._roots(outputs)
            try:
                batch = schedule(self.program, builder.arrays(), roots, len(examples), self.chunk_sizes, keep_host,
                                 owner=self._token)
            except InvalidConstant as e:
                self._raise_invalid_constant(examples, e, dataset_indices)
        return batch, builder, outputs

    def _roots(self, outputs: list) -> list[np.ndarray]:
        """Per root tensor leaf, the value id it has in each example's host output."""
        if not self.program.root_leaves:
            return []
        ids = np.asarray([flatten_value(v) for v in outputs], np.int64).reshape(len(outputs), -1)
        return [ids[:, leaf] for leaf in range(len(self.program.root_leaves))]

    def _raise_invalid_constant(self, examples: Sequence[Any], e: InvalidConstant,
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

    @overload
    def build_batch(self, examples: Iterable[Any] | RecordedExamples, exact_layout: bool = False,
                    devices: None = None, axis: str = sharding.AXIS) -> Batch: ...

    @overload
    def build_batch(self, examples: Iterable[Any] | RecordedExamples, exact_layout: bool = False, *,
                    devices: int | Mesh | Sequence[Any], axis: str = sharding.AXIS) -> ShardedBatch: ...

    def build_batch(self, examples: Iterable[Any] | RecordedExamples, exact_layout: bool = False,
                    devices: int | Mesh | Sequence[Any] | None = None,
                    axis: str = sharding.AXIS) -> Batch | ShardedBatch:
        """Walks every example on the host and builds its schedule (NumPy only).

        With ``devices`` (a device count, a list of devices or a ``Mesh``), it
        builds a ``ShardedBatch`` instead: the examples split over the devices
        of mesh axis ``axis``, balanced by node count, in one layout
        (``fold/compiler/sharding.py``; docs/scaling.md). In a multi-process
        run, each process passes its own examples.

        A malformed example raises KeyError, TypeError or ValueError naming
        the example's index, the block path and what was expected. Examples
        recorded with ``record`` skip the walk.

        The batch is padded into a layout this compiler handed out before
        where it fits (see ``Compiler.create``); ``exact_layout=True`` gives
        it the layout that fits it exactly instead, outside that set: one
        compilation per distinct layout, for measuring a batch on its own.

        Args:
          examples: Python examples the root block takes, or examples
            recorded with ``record`` (a slice or index array of them).
          exact_layout: give the batch its own layout (see above).

        Returns:
          A ``Batch`` for ``apply``; ``batch.stats`` counts its nodes,
          depths and rows.

        Raises:
          KeyError, TypeError, ValueError, OverflowError: a malformed
            example, with its index and block path in the message.
          ValueError: no examples, or examples another compiler recorded.
          TypeError: ``examples`` is a string, dict or set, or not iterable.
        """
        if not isinstance(examples, RecordedExamples):
            examples = list(check_examples(examples, "build_batch"))
        if devices is not None:
            if exact_layout:
                raise ValueError("exact_layout and devices do not go together: a sharded batch's parts share a layout")
            return self._build_sharded(examples, devices, axis, None)
        batch = self._saving.decide(self._build_batch(examples))
        if not exact_layout:
            batch = self._layouts.assign(batch)
        batch.example_indices = (examples.indices if isinstance(examples, RecordedExamples)
                                 else np.arange(len(examples)))
        self._stats.built(batch)
        return batch

    def _build_batch(self, examples: Iterable[Any] | RecordedExamples | ExampleChunk,
                     chunk_sizes: tuple[int, ...] | None = None) -> Batch:
        """The batch of ``examples`` in its own layout, before the save policy and the layout
        policy see it, and not counted in ``stats``: NumPy only (workers run this). ``C`` is
        picked among ``chunk_sizes`` (recorded examples only; default: the compiler's)."""
        if isinstance(examples, RecordedExamples):
            self._check_owner(examples)
            if not len(examples):
                raise ValueError("build_batch needs at least one example")
            rec, roots = examples.merged()
            return schedule(self.program, rec, roots, len(examples), chunk_sizes or self.chunk_sizes, check=False,
                            owner=self._token)
        if isinstance(examples, ExampleChunk):
            return self._build(examples.examples, dataset_indices=examples.indices)[0]
        examples = examples if isinstance(examples, list) else list(examples)  # build_batch listed them
        if not examples:
            raise ValueError("build_batch needs at least one example")
        return self._build(examples)[0]

    def _check_owner(self, recorded: RecordedExamples) -> None:
        if recorded.owner != self._token:
            raise ValueError("these examples were recorded by another compiler; record them with this one")

    def _build_sharded(self, examples: list | RecordedExamples | ExampleChunk, devices: Any, axis: str,
                       dataset_indices: Sequence[int] | None) -> ShardedBatch:
        """This process's examples as its share of a ``ShardedBatch`` over ``devices``."""
        mesh = sharding.device_mesh(devices, axis)
        if isinstance(examples, RecordedExamples):
            recorded = examples
        else:
            listed = examples.examples if isinstance(examples, ExampleChunk) else list(examples)
            try:
                recorded = record(self.program, listed, self._token, dataset_indices)
            except InvalidConstant as e:
                self._raise_invalid_constant(listed, e, dataset_indices)
        if not len(recorded):
            raise ValueError("build_batch needs at least one example")
        self._check_owner(recorded)
        local = sharding.local_devices(mesh, axis)
        if not local:
            raise ValueError(f"no device of the mesh belongs to process {jax.process_index()}")
        costs = recorded.node_counts()
        members = sharding.partition(costs, len(local))
        # A device with no example of its own runs the cheapest one again, its rows marked padding.
        filler = np.asarray([int(np.argmin(costs))])
        shares = [recorded[m if len(m) else filler] for m in members]
        parts = [self._build_batch(share) for share in shares]
        # Each part picks its own C (a small part may take a smaller one); the step's parts, here
        # and in every other process, share a layout, so they all take the largest.
        chunk = int(sharding.gather_counts(max(p.layout.chunk for p in parts)).max())
        parts = [self._saving.decide(p if p.layout.chunk == chunk else self._build_batch(share, chunk_sizes=(chunk,)))
                 for p, share in zip(parts, shares)]
        parts = self._shared_layouts.pad(parts, sharding.gather_layouts)
        counts = sharding.gather_counts(len(recorded))
        offset = int(counts[:jax.process_index()].sum())
        rows = parts[0].layout.num_examples
        example_map = np.full((len(local), rows), -1, np.int32)
        positions = np.zeros(len(recorded), np.int32)
        for k, (d, m) in enumerate(zip(local, members)):
            example_map[k, :len(m)] = offset + m
            positions[m] = d * rows + np.arange(len(m))
        batch = sharding.assemble(parts, example_map, sharding.gather_positions(positions, counts), mesh, axis,
                                  self._token)
        batch.nodes = np.asarray([costs[m].sum() for m in members])
        batch.example_indices = np.arange(len(recorded)) if dataset_indices is None else np.asarray(dataset_indices)
        for part in parts:
            self._stats.built(part)
        return batch

    def record(self, examples: Iterable[Any] | RecordedExamples, progress: bool = False) -> RecordedExamples:
        """Walks every example on the host once and keeps what it records as arrays.

        ``build_batch`` and ``batches`` take the result (or a slice or index
        array of it) in place of the examples, and then only gather and
        renumber arrays instead of walking each example: for a dataset seen
        every epoch, the walk is paid once. Errors in the examples raise here,
        as ``build_batch`` would raise them. The recording is a snapshot:
        it does not see later changes to the examples, and host functions
        (``InputTransform``, ``OneOf`` keys) ran once per example, so do not
        record examples whose host functions draw random numbers.
        ``progress=True`` shows a tqdm progress bar. Examples this compiler
        recorded already come back as they are.

        Args:
          examples: the examples, walked in order.
          progress: show a progress bar.

        Returns:
          ``RecordedExamples``: indexable like a list (ints, slices, index
          arrays), accepted by this compiler's ``build_batch`` and
          ``batches``.

        Raises:
          KeyError, TypeError, ValueError, OverflowError: the first malformed
            example, as ``build_batch`` raises it (its index and block path in
            the message).
          ValueError: ``examples`` were recorded by another compiler.

        Example::

            train = compiler.record(train_trees)
            for epoch in range(10):
                for batch in compiler.batches(train, 64, shuffle=True):
                    ...
        """
        if isinstance(examples, RecordedExamples):  # recorded already (a notebook cell run twice)
            self._check_owner(examples)
            return examples
        examples = list(check_examples(examples, "record"))
        walked: Iterable[Any] = examples
        if progress:
            from tqdm.auto import tqdm

            walked = tqdm(examples, desc="recording examples", unit="ex")
        try:
            return record(self.program, walked, self._token)
        except InvalidConstant as e:
            self._raise_invalid_constant(examples, e)

    @overload
    def batches(self, examples: Iterable[Any] | RecordedExamples, batch_size: int, shuffle: bool = False,
                num_workers: int = 0, drop_remainder: bool = False, seed: int | None = None,
                devices: None = None, axis: str = sharding.AXIS, prefetch: bool = True) -> Iterator[Batch]: ...

    @overload
    def batches(self, examples: Iterable[Any] | RecordedExamples, batch_size: int, shuffle: bool = False,
                num_workers: int = 0, drop_remainder: bool = False, seed: int | None = None, *,
                devices: int | Mesh | Sequence[Any], axis: str = sharding.AXIS,
                prefetch: bool = True) -> Iterator[ShardedBatch]: ...

    def batches(self, examples: Iterable[Any] | RecordedExamples, batch_size: int, shuffle: bool = False,
                num_workers: int = 0, drop_remainder: bool = False, seed: int | None = None,
                devices: int | Mesh | Sequence[Any] | None = None, axis: str = sharding.AXIS,
                prefetch: bool = True) -> Iterator[Batch] | Iterator[ShardedBatch]:
        """Yields built batches of ``batch_size`` examples.

        With ``devices`` (a device count, a list of devices or a ``Mesh``), each
        batch is a ``ShardedBatch``: its examples split over the devices of mesh
        axis ``axis``, balanced by node count (see ``build_batch``). With several
        processes, each passes its own examples and ``batch_size`` counts its
        own share of a step; every process must yield as many batches.

        ``examples`` may be any iterable, a generator or an endless stream too:
        it is read lazily, as far as the batches taken (and the few built
        ahead) need, in the calling thread. ``shuffle`` permutes the examples
        with ``numpy.random.default_rng(seed)`` (fresh entropy when ``seed`` is
        None), which reads them all first. ``examples`` may also be examples
        recorded with ``record``. The last partial batch is yielded unless
        ``drop_remainder``.

        By default (``prefetch``, ``num_workers=0``) a background thread of this
        process builds the next batches, in order, while the caller runs its
        step, so a loop that waits for its loss every step (to log it) does not
        wait for the host too, wherever the step leaves a core free: beside a GPU
        or TPU always, on the CPU when XLA does not use every core
        (docs/performance.md). The examples' Python code (``InputTransform``
        functions and the like) then runs on that thread: one that draws from a
        random generator the loop draws from too makes the draws depend on the
        threads' timing (give it its own generator). ``prefetch=False`` builds
        each batch in the caller when it asks for it.

        ``num_workers > 0`` builds batches ahead, in order, in that many
        forked worker processes while the caller computes (threads where
        ``fork`` is unavailable; see ``fold/scheduler/background.py``). The
        examples travel to the workers by pickle. A malformed example raises
        in the caller with its natural type, naming its index in
        ``examples`` (and its position in its batch); a worker that dies raises
        ``RuntimeError``; leaving the loop early shuts the workers down.
        Workers that delivered every batch are kept for the compiler's next
        call: a fork costs the caller a copy-on-write page fault for every
        page of its heap it writes afterwards (docs/performance.md), so it
        is paid once, not once per epoch. Workers need spare cores to pay off.

        Args:
          examples: an iterable of Python examples, or ``RecordedExamples``.
          batch_size: examples per batch (> 0).
          shuffle: permute the examples first.
          num_workers: worker processes building ahead (0: this process builds,
            see ``prefetch``).
          drop_remainder: skip the last batch when it is partial.
          seed: seed of the permutation (None: fresh entropy).
          prefetch: with ``num_workers=0``, build ahead on a background thread
            (False: in the caller, when it asks for the next batch). Batches
            built with ``devices`` are built in the caller.

        Yields:
          ``Batch``es, in the (shuffled) order of the examples;
          ``batch.example_indices`` gives each row's position in ``examples``.

        Raises:
          ValueError: ``batch_size`` is not an int >= 1, or ``num_workers`` not an int >= 0.
          TypeError: ``examples`` is a string, dict or set, or not iterable.
          KeyError, TypeError, ValueError, OverflowError: a malformed example,
            as ``build_batch`` raises it, naming its index in ``examples``.
          RuntimeError: a worker process died.
        """
        batch_size, num_workers = check_int("batch_size", batch_size, 1), check_int("num_workers", num_workers, 0)
        if devices is not None and num_workers:
            raise ValueError("batches(devices=...) builds in the calling process: pass num_workers=0 "
                             "(several processes each build their own share)")
        if not isinstance(examples, RecordedExamples):
            check_examples(examples, "batches")
        pieces = self._pieces(examples, batch_size, shuffle, drop_remainder, seed)
        indices: deque[np.ndarray] = deque()

        def chunks() -> Iterator[RecordedExamples | ExampleChunk]:
            # Read lazily as batches are built ahead: a stream of examples is taken only as far as
            # the batches need. Each chunk's indices wait for its batch in ``indices``.
            for chunk, idx in pieces:
                indices.append(idx)
                yield chunk

        if devices is not None:
            for chunk, idx in pieces:
                yield self._build_sharded(chunk, devices, axis, idx.tolist())
            return
        built = ((self._build_batch(chunk) for chunk in chunks()) if num_workers == 0 and not prefetch
                 else build_ahead(self._build_batch, chunks(), num_workers, self._idle_workers))
        # Saving is decided and layouts are handed out here, in the batches' order, the first
        # layouts planned from a few batches ahead.
        for batch in self._layouts.stream(map(self._saving.decide, built)):
            batch.example_indices = indices.popleft()
            self._stats.built(batch)  # counted here: workers have their own copy of the counters
            yield batch

    @staticmethod
    def _pieces(examples: Iterable[Any] | RecordedExamples, batch_size: int, shuffle: bool, drop_remainder: bool,
                seed: int | None) -> Iterator[tuple[RecordedExamples | ExampleChunk, np.ndarray]]:
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

    # ---------------------------------------------------------------- apply
    @functools.cached_property
    def apply(self) -> Callable[..., Result]:
        """``apply(params, batch, key=None) -> Result``: runs a built batch; pure and jittable,
        differentiable in ``params`` in reverse mode (``jax.grad``, ``jax.vjp``) and forward over
        reverse (``jax.hessian``, ``jax.jvp`` of ``jax.grad``), not in forward mode alone nor
        reverse over reverse (docs/errors.md).

        ``key`` (a PRNG key) switches stochastic layers such as ``Dropout``
        on, with draws that depend only on ``key`` and the batch; without it
        they are deterministic (use that for evaluation). Pass a fresh key
        per training step, e.g. ``jax.random.fold_in(key, step)``.

        Called with concrete arrays, it runs a jitted copy of itself kept by
        the compiler (one compilation per layout). ``compiler.apply`` is the
        same object every time, so ``jax.jit(compiler.apply)`` written inline
        in a loop reuses JAX's cache instead of tracing again.

        Args (of the function):
          params: the dict ``init`` made (or a trained copy).
          batch: a ``Batch`` this compiler built.
          key: a PRNG key for stochastic layers, or None.

        Returns (of the function):
          ``Result(outputs, metrics)``: ``outputs`` the root's tensors with
          one row per example (a tuple for a tuple root, None for void);
          ``metrics`` per name a ``MetricValues`` (padded values, ``mask``,
          ``example``).

        Raises (of the function):
          TypeError: ``batch`` is not a ``Batch``, ``key`` not a PRNG key,
            or ``params`` do not match ``init`` (see ``prepare_params``).
          ValueError: the batch was built by another compiler.
        """
        return self._apply

    def _apply(self, params: Any, batch: Batch | ShardedBatch, key: jax.Array | None = None) -> Result:
        if isinstance(batch, ShardedBatch):
            if batch.owner != self._token:
                raise ValueError("this batch was built by another compiler: its rows hold another model's values; "
                                 "build it with this compiler's build_batch or batches")
            if not any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves((params, batch, key))):
                return self._apply_jit(params, batch, key)
            return sharding.apply_sharded(self._apply, params, batch, key)
        if not isinstance(batch, Batch):
            raise TypeError(f"apply needs a Batch from compiler.build_batch, got {type(batch).__name__}")
        if batch.owner != self._token:
            raise ValueError("this batch was built by another compiler: its rows hold another model's values; "
                             "build it with this compiler's build_batch or batches")
        if key is not None and not _is_key(key):
            raise TypeError(f"key must be a PRNG key such as jax.random.key(0), got {key!r}")
        if not any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves((params, batch, key))):
            return self._apply_jit(params, batch, key)
        if isinstance(batch.arrays.n_items, jax.core.Tracer):
            self._stats.traced(batch.layout)
        arenas = self._arenas(params, batch, key)
        arrays = batch.arrays
        program = self.program
        leaves = [arenas[program.type_index[t]][rows] for t, rows in zip(program.root_leaves, arrays.roots)]
        out_type = program.output_type
        outputs = unflatten_value(out_type, leaves)[0] if root_is_tensors(out_type) else None
        metrics = {}
        for name, t in program.metric_types.items():
            m = arrays.metrics[name]
            metrics[name] = MetricValues.zero_padded(arenas[program.type_index[t]][m.rows], jnp.asarray(m.mask),
                                                     jnp.asarray(m.example))
        return Result(outputs, metrics)

    def _arenas(self, params: Any, batch: Batch, key: jax.Array | None = None) -> dict:
        return self.executor.arenas(self.prepare_params(params), batch, key)

    def check_numerics(self, params: Any, examples: Iterable[Any],
                       loss: Callable[[Result], jax.Array] | None = None,
                       dataset_indices: Sequence[int] | None = None) -> None:
        """Raises FloatingPointError naming the first example whose values or gradients are not
        finite (a debugging aid: run it on the examples of a step whose loss or gradients are NaN).

        One NaN in one example makes every gradient of a batched step NaN,
        even when that example is masked out of the loss. This builds
        ``examples`` into one batch, runs it and reads every value: the first
        NaN or inf, in the order the walk made them, is reported with its
        example and what made it (an input value, or an operation such as
        ``Function(FC)``). If all values are finite, it takes the gradient of
        each example's loss in a batch of its own (one step per example, in
        the few layouts of a second compiler of the same program, so this
        compiler's layouts and statistics are untouched) and names the first
        example whose gradient is not finite, and which parameters.

        Args:
          params: the parameters the step used.
          examples: the examples to check (those of the bad batch).
          loss: ``loss(result) -> [examples in the batch]``, each example's
            loss (called on batches of one example); by default the sum of
            its outputs and metric values.
          dataset_indices: each example's index in the dataset, for the
            message (e.g. ``range(start, stop)`` for a slice).

        Raises:
          FloatingPointError: a value or a gradient is NaN or infinite.
          ValueError: no examples, or ``loss`` returns another shape.
        """
        if isinstance(examples, RecordedExamples):
            raise TypeError("check_numerics walks the examples themselves to name the blocks: pass the examples, "
                            "not examples recorded with compiler.record")
        examples = list(check_examples(examples, "check_numerics"))
        numerics.check_arguments(examples, dataset_indices)
        batch, builder, _ = self._build(examples, keep_host=True, dataset_indices=dataset_indices)
        numerics.check_values(self.program, builder, batch, self._arenas_jit(params, batch), dataset_indices)
        # A second compiler of the program builds the one-example batches: this one's layouts stay as they were.
        alone = Compiler(self.program, self.chunk_sizes, self.backward, self.save_limit)
        numerics.check_gradients(alone, params, examples, loss, dataset_indices)

    def summary(self) -> str:
        """What the model is made of: its layers with their parameters' shapes and counts, its
        operations (each batched across a whole batch) with their types, and its arena types.

        Examples:
            >>> import fold as fd
            >>> print(fd.Compiler.create(fd.Map(fd.Vector(2) >> fd.FC(3, name="dense")) >> fd.Max()).summary())
            root Pipe: PyObjectType() -> TensorType((3,), 'float32')
            layers (9 parameters):
              dense  FC  takes TensorType((2,), 'float32')  b (3,), w (2, 3)  9
            operations (2; one batched call per depth each):
              0  Function(FC)       TensorType((2,), 'float32') -> TensorType((3,), 'float32')
              1  Function(maximum)  TupleType(TensorType((3,), 'float32'), TensorType((3,), 'float32')) -> ...
            tensor types (arenas): TensorType((3,), 'float32'), TensorType((2,), 'float32')
        """
        p = self.program
        structs = self._param_structs
        layers = []
        for name, (layer, t) in sorted(p.layers.items()):
            leaves = jax.tree_util.tree_flatten_with_path(structs[name])[0]
            shapes = ", ".join(f"{jax.tree_util.keystr(path).strip('[]').strip(chr(39))} {tuple(x.shape)}"
                               for path, x in leaves)
            count = sum(int(np.prod(x.shape)) for _, x in leaves)
            layers.append((name, type(layer).__name__, f"takes {t}", shapes or "no parameters", str(count)))
        total = sum(int(row[-1]) for row in layers)
        lines = [f"root {p.root!r}: {p.root.input_type} -> {p.output_type}", f"layers ({total:,} parameters):"]
        lines += _table(layers) or ["  (none)"]
        lines.append(f"operations ({len(p.ops)}; one batched call per depth each):")
        lines += _table([(str(o), op.spec.label, f"{op.spec.in_type} -> {op.spec.out_type}")
                         for o, op in enumerate(p.ops)]) or ["  (none)"]
        if p.metric_types:
            lines.append("metrics: " + ", ".join(f"{n} {t}" for n, t in p.metric_types.items()))
        lines.append("tensor types (arenas): " + ", ".join(str(t) for t in p.types))
        return "\n".join(lines)

    def stats(self, reset: bool = False) -> CompilerStats:
        """Counts of what this compiler has built and traced (see ``CompilerStats``).

        Every distinct ``BatchLayout`` costs one compilation of each jitted
        function that takes batches; ``traces`` counts how often ``apply``
        was actually traced. ``reset=True`` starts counting afresh.
        """
        return self._stats.snapshot(reset)

    # ------------------------------------------------------------- notebook
    def max_depth(self, example: Any) -> int:
        """Depth of one example's schedule (no device work)."""
        return run_examples(self.program, [example], indexed=False)[0].max_depth

    def eval_one(self, example: Any, params: Any = None) -> Any:
        """Evaluates one example; see ``Block.eval``."""
        if params is None:
            params = self.init(jax.random.key(0))
        builder, (value,) = run_examples(self.program, [example], indexed=False)
        try:
            batch = schedule(self.program, builder.arrays(), [], 1, self.chunk_sizes, keep_host=True, owner=self._token)
        except InvalidConstant as e:
            self._raise_invalid_constant([example], e)
        host = batch.host
        assert host is not None  # kept: keep_host=True
        arenas = {t: np.asarray(a) for t, a in self._arenas_jit(params, batch).items()}

        def convert(v: Any, t: Type) -> Any:
            if isinstance(t, TensorType):
                return np.array(arenas[int(host.v_type[v])][int(host.v_row[v])])
            if isinstance(t, TupleType):
                return tuple(convert(i, it) for i, it in zip(v, t))
            if isinstance(t, BroadcastSequenceType):
                return itertools.repeat(convert(v.value if isinstance(v, Repeat) else v, t.element_type))
            if isinstance(t, SequenceType):
                return [convert(i, t.element_type) for i in v]
            if isinstance(t, VoidType):
                return None
            return v

        out = convert(value, self.program.output_type)
        if not self.program.metric_types:
            return out
        metrics = {name: [convert(vid, t) for vid in builder.metric_values[name]]
                   for name, t in self.program.metric_types.items()}
        return out, metrics


def _table(rows: Sequence[tuple[str, ...]]) -> list[str]:
    """``rows`` as indented lines with aligned columns (the last one ragged)."""
    if not rows:
        return []
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return ["  " + "  ".join([*(c.ljust(w) for c, w in zip(r, widths)), r[-1]]) for r in rows]


def _is_key(key: Any) -> bool:
    """A typed PRNG key (``jax.random.key``) or a raw one (``jax.random.PRNGKey``: two uint32s)."""
    if not isinstance(key, (jax.Array, np.ndarray)):
        return False
    return bool(jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key) or (key.shape == (2,) and key.dtype == np.uint32))


def check_compiler(value: Any, where: str) -> Compiler:
    """``value`` if it is a ``Compiler``; else a TypeError saying ``where`` takes one (a block is
    the usual mistake)."""
    if not isinstance(value, Compiler):
        raise TypeError(f"{where} takes a Compiler (fd.Compiler.create(model)), got {type(value).__name__}")
    return value
