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
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import overload

import jax
import jax.numpy as jnp
import numpy as np

from fold.blocks.host import DEFAULT_LIMITS, BlockLike, ExampleLimits
from fold.blocks.sharing import Shared
from fold.blocks.tensors import unflatten_value
from fold.compiler import numerics, sharding
from fold.compiler.batching import Batcher
from fold.compiler.build import _all_blocks, build_program, root_is_tensors
from fold.compiler.executor import Arenas, Executor, take_rows
from fold.compiler.params import LayerParams, is_key
from fold.compiler.result import MetricValues, Result
from fold.compiler.saving import BACKWARDS, SAVE_LIMIT, SavePolicy
from fold.compiler.sharding import Devices, ShardedBatch
from fold.compiler.stats import CompilerStats, StatsRecorder
from fold.compiler.summary import summary
from fold.errors import check_examples, check_int
from fold.host_memory import keep_by_default
from fold.scheduler.batch import Batch
from fold.scheduler.builder import run_examples
from fold.scheduler.program import Program
from fold.scheduler.records import RecordedExamples
from fold.scheduler.schedule import MIN_ITEM
from fold.typing import Params, PyObject

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

    The first compiler of a process keeps freed host memory for reuse
    (``fd.keep_host_memory``; ``FOLD_KEEP_HOST_MEMORY=0`` or the program's
    own glibc settings leave it alone): on a CPU backend a step's
    temporaries then stay in the heap instead of faulting in fresh pages
    every step.
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
        keep_by_default()  # a step's temporaries stay in the heap (fold/host_memory.py)
        self.chunk_sizes = tuple(sorted({int(c) for c in sizes}))
        self.program = program
        self.backward = backward
        self.save_limit = int(save_limit)
        self._stats = StatsRecorder()
        self.executor = Executor(program)
        self._params = LayerParams(program.layers, program.layer_seeds)
        self._saving = SavePolicy(backward, self.save_limit, self.executor, lambda: self._params.structs)
        self._batcher = Batcher(program, self.chunk_sizes, self._saving, int(max_layouts), self._stats)
        self._arenas_jit = jax.jit(self._arenas)
        self._apply_jit = jax.jit(self._apply)

    def __repr__(self) -> str:
        p = self.program
        return (f"Compiler(root={p.root!r}: {p.root.input_type} -> {p.output_type}, {len(p.ops)} operations, "
                f"layers={sorted(p.layers)}, metrics={list(p.metric_types)}, chunk_size={self.chunk_sizes}, "
                f"backward={self.backward!r})")

    def __deepcopy__(self, memo: dict[int, object] | None = None) -> Compiler:
        raise TypeError("a Compiler holds compiled functions, layouts and worker processes, which do not copy: "
                        "make another with fd.Compiler.create(block) (blocks deep-copy), or share this one")

    __copy__ = __deepcopy__

    @classmethod
    def create(cls, root_block: BlockLike, chunk_size: int | Sequence[int] = CHUNK_SIZES,
               backward: str = "auto", save_limit: int = SAVE_LIMIT, max_layouts: int = MAX_LAYOUTS,
               fuse: bool = True, max_example_nodes: int = DEFAULT_LIMITS.max_nodes,
               max_recursion: int = DEFAULT_LIMITS.max_recursion) -> Compiler:
        """Validates and type-checks ``root_block`` and enumerates its operations.

        ``chunk_size`` is C, the most rows a loop iteration runs, or several
        candidates: each batch then uses the one whose loop items cost least,
        an item of C rows costing a fixed overhead plus C (``pick_chunk``):
        512 where most of its items would be full (large batches of large
        trees), 32 where it adds few items to a tiny batch (a single tree),
        else 128. ``batches`` prices them once, over its first batches, and
        builds the whole stream with one C (``stream_chunk``). Each C a
        loop's batches use is one more layout to compile.
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
    def for_eval(cls, block: BlockLike) -> Compiler:
        """A compiler for ``block.eval`` and ``block.max_depth``: any root type (sequences and
        Python objects come back as values), small chunks (one branch per operation keeps a
        notebook's compilations quick), a recomputing backward pass, and no fused operations
        (``max_depth`` counts every operation, as Fold does)."""
        return cls(build_program(block, any_root=True, fuse=False), chunk_size=8, backward="recompute")

    # ---------------------------------------------------------- parameters
    def init(self, key: jax.Array) -> Params:
        """Parameters for every layer: ``{layer name: params}``.

        Each layer's key is derived from ``key`` and its name if it was
        given one, else its class's numbered within the model
        (``program.layer_seeds``): adding a named layer does not change the
        others' initial values, and none depend on how many layers the
        process made before the model.

        Args:
          key: a PRNG key, e.g. ``jax.random.key(0)``.

        Returns:
          ``{layer name: that layer's parameter pytree}``.

        Raises:
          TypeError: ``key`` is not a PRNG key.
        """
        return self._params.init(key)

    def prepare_params(self, params: Params) -> Params:
        """Checks ``params`` and stops gradients of non-trainable layers (``apply`` calls this).

        Raises:
          TypeError: ``params`` is not a dict, or a layer's parameters have
            another structure, shape or dtype than ``init`` gives them.
          KeyError: a layer has no entry.
        """
        return self._params.prepare(params)

    # -------------------------------------------------------------- batches
    def saved_row_bytes(self, chunk: int) -> tuple[int, ...]:
        """Per operation (in ``ops`` order), the bytes this compiler's backward pass keeps per loop
        row with chunk size ``chunk`` when a batch saves (``SavePolicy.row_bytes``)."""
        return self._saving.row_bytes(chunk)

    @overload
    def build_batch(self, examples: Iterable[PyObject] | RecordedExamples, exact_layout: bool = False,
                    devices: None = None, axis: str = sharding.AXIS) -> Batch: ...

    @overload
    def build_batch(self, examples: Iterable[PyObject] | RecordedExamples, exact_layout: bool = False, *,
                    devices: Devices, axis: str = sharding.AXIS) -> ShardedBatch: ...

    def build_batch(self, examples: Iterable[PyObject] | RecordedExamples, exact_layout: bool = False,
                    devices: Devices | None = None,
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
        return self._batcher.build_batch(examples, exact_layout, devices, axis)

    def record(self, examples: Iterable[PyObject] | RecordedExamples, progress: bool = False) -> RecordedExamples:
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

        A ``Shared(..., across_examples=True)`` block shares only within each recorded example
        (batches gather examples recorded apart): the values are the same, the work is not, and
        a ``UserWarning`` says so.
        """
        across = [b for b in _all_blocks(self.program.root) if isinstance(b, Shared) and b.across_examples]
        if across and not isinstance(examples, RecordedExamples):
            warnings.warn(f"{across[0]!r} shares nodes across examples, but examples recorded apart share only within "
                          "themselves (their batches gather them): build batches from the examples themselves "
                          "(build_batch, or batches without record) to share across them", stacklevel=2)
        return self._batcher.record(examples, progress)

    @overload
    def batches(self, examples: Iterable[PyObject] | RecordedExamples, batch_size: int, shuffle: bool = False,
                num_workers: int = 0, drop_remainder: bool = False, seed: int | None = None,
                devices: None = None, axis: str = sharding.AXIS, prefetch: bool = True) -> Iterator[Batch]: ...

    @overload
    def batches(self, examples: Iterable[PyObject] | RecordedExamples, batch_size: int, shuffle: bool = False,
                num_workers: int = 0, drop_remainder: bool = False, seed: int | None = None, *,
                devices: Devices, axis: str = sharding.AXIS,
                prefetch: bool = True) -> Iterator[ShardedBatch]: ...

    def batches(self, examples: Iterable[PyObject] | RecordedExamples, batch_size: int, shuffle: bool = False,
                num_workers: int = 0, drop_remainder: bool = False, seed: int | None = None,
                devices: Devices | None = None, axis: str = sharding.AXIS,
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
        or TPU always, on the CPU when XLA does not use every core (on a CPU
        with few cores, ``fd.reserve_host_cores`` keeps one for it; see
        docs/performance.md). The examples' Python code (``InputTransform``
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
        return self._batcher.batches(examples, batch_size, shuffle, num_workers, drop_remainder, seed, devices, axis,
                                     prefetch)

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

    def _apply(self, params: Params, batch: Batch | ShardedBatch, key: jax.Array | None = None) -> Result:
        if isinstance(batch, ShardedBatch):
            if batch.owner != self._batcher.token:
                raise ValueError("this batch was built by another compiler: its rows hold another model's values; "
                                 "build it with this compiler's build_batch or batches")
            if not _traced(params, batch, key):
                jitted: Result = self._apply_jit(params, batch, key)
                return jitted
            return sharding.apply_sharded(self._apply, params, batch, key)
        if not isinstance(batch, Batch):
            raise TypeError(f"apply needs a Batch from compiler.build_batch, got {type(batch).__name__}")
        if batch.owner != self._batcher.token:
            raise ValueError("this batch was built by another compiler: its rows hold another model's values; "
                             "build it with this compiler's build_batch or batches")
        if key is not None and not is_key(key):
            raise TypeError(f"key must be a PRNG key such as jax.random.key(0), got {key!r}")
        if not _traced(params, batch, key):
            result: Result = self._apply_jit(params, batch, key)
            return result
        if isinstance(batch.arrays.n_items, jax.core.Tracer):
            self._stats.traced(batch.layout)
        arenas = self._arenas(params, batch, key)
        arrays = batch.arrays
        program = self.program
        leaves = [take_rows(arenas[program.type_index[t]], rows) for t, rows in zip(program.root_leaves, arrays.roots)]
        out_type = program.output_type
        outputs = unflatten_value(out_type, leaves)[0] if root_is_tensors(out_type) else None
        metrics = {}
        for name, t in program.metric_types.items():
            m = arrays.metrics[name]
            metrics[name] = MetricValues.zero_padded(arenas[program.type_index[t]][m.rows], jnp.asarray(m.mask),
                                                     jnp.asarray(m.example))
        return Result(outputs, metrics)

    def _arenas(self, params: Params, batch: Batch, key: jax.Array | None = None) -> Arenas:
        return self.executor.arenas(self.prepare_params(params), batch, key)

    def check_numerics(self, params: Params, examples: Iterable[PyObject],
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
        batch, builder, _ = self._batcher.build(examples, keep_host=True, dataset_indices=dataset_indices)
        numerics.check_values(self.program, builder, batch, self._arenas_jit(params, batch), dataset_indices)
        # A second compiler of the program builds the one-example batches: this one's layouts stay as they were.
        alone = Compiler(self.program, self.chunk_sizes, self.backward, self.save_limit)
        numerics.check_gradients(alone.apply, alone.build_batch, params, examples, loss, dataset_indices)

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
        return summary(self.program, self._params.structs)

    def stats(self, reset: bool = False) -> CompilerStats:
        """Counts of what this compiler has built and traced (see ``CompilerStats``).

        Every distinct ``BatchLayout`` costs one compilation of each jitted
        function that takes batches; ``traces`` counts how often ``apply``
        was actually traced. ``reset=True`` starts counting afresh.
        """
        return self._stats.snapshot(reset)

    # ------------------------------------------------------------- notebook
    def max_depth(self, example: PyObject) -> int:
        """Depth of one example's schedule (no device work)."""
        return run_examples(self.program, [example], indexed=False)[0].max_depth

    def eval_one(self, example: PyObject, params: Params | None = None) -> PyObject:
        """Evaluates one example; see ``Block.eval``."""
        if params is None:
            params = self.init(jax.random.key(0))
        batch, builder, (value,) = self._batcher.build([example], keep_host=True, indexed=False)
        host = batch.host
        assert host is not None  # kept: keep_host=True
        arenas = {t: np.asarray(a) for t, a in self._arenas_jit(params, batch).items()}
        out = host.read(value, self.program.output_type, arenas)
        if not self.program.metric_types:
            return out
        metrics = {name: [host.read(vid, t, arenas) for vid in builder.metric_values[name]]
                   for name, t in self.program.metric_types.items()}
        return out, metrics


def check_compiler(value: object, where: str) -> Compiler:
    """``value`` if it is a ``Compiler``; else a TypeError saying ``where`` takes one (a block is
    the usual mistake)."""
    if not isinstance(value, Compiler):
        raise TypeError(f"{where} takes a Compiler (fd.Compiler.create(model)), got {type(value).__name__}")
    return value


def _traced(*args: object) -> bool:
    """Whether ``apply`` runs inside a trace (its own jitted copy's, or the caller's), or eagerly under
    ``jax.disable_jit()``: else it calls its jitted copy, which would call it again forever."""
    disabled: bool = jax.config.jax_disable_jit  # type: ignore[attr-defined]  # set by jax.disable_jit()
    return disabled or any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves(args))
