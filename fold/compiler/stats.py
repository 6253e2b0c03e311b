"""``compiler.stats()``: how many batch shapes (compilations) a stream of batches costs.

Batches share a ``BatchLayout`` -- and a compilation -- when the compiler pads
them into the same one (``fold/scheduler/layouts.py``). These counters show
how many layouts a stream produced, how long their compilations took, how
full the buckets were and how much padding cost.

Compile seconds come from ``jax.monitoring``: when ``apply`` is traced, the
tracing, lowering and XLA compilation that JAX reports next on that thread
(up to its backend compilation) are counted for the compiler that traced,
and logged (INFO, ``fold`` logger) with the batch layout it was for.
"""

from __future__ import annotations

import collections
import logging
import threading
import weakref
from typing import NamedTuple

import jax

from fold.fields import documented
from fold.scheduler.batch import Batch, BatchLayout
from fold.scheduler.layouts import computed_rows

__all__ = ["CompilerStats", "StatsRecorder"]

logger = logging.getLogger("fold")


@documented
class CompilerStats(NamedTuple):
    """A snapshot of ``compiler.stats()``.

    ``batches``: batches built (by ``build_batch`` or ``batches``, including
    worker-built ones); ``layouts``: distinct ``BatchLayout``s among them,
    i.e. compilations of a jitted training step; ``size_classes``: batches
    per size class ``A``; ``traces``: times ``apply`` was traced under
    ``jit``/``grad``; ``nodes``: operation calls built; ``occupancy``: mean
    over batches of (rows used by the fullest arena) / A, and
    ``min_occupancy`` the lowest -- the share of each bucket that is real
    work, the rest being padding; ``saving``: batches whose backward pass
    keeps their loop items' matmul outputs (``backward="save"``, or
    ``"auto"`` under its ``save_limit``); ``compile_seconds``: seconds JAX
    spent tracing, lowering and compiling jitted functions that call
    ``apply`` (as ``jax.monitoring`` reports them); ``padding``: rows the
    device computed over rows the batches needed (their nodes), >= 1: work
    items and hoisted and tail groups run padded row counts, and a batch
    padded into a larger layout runs larger groups.
    """

    batches: int  # batches built
    layouts: int  # distinct layouts among them: compilations of a jitted step
    size_classes: dict[int, int]  # batches per size class
    traces: int  # times apply was traced
    nodes: int  # operation calls built
    occupancy: float  # mean share of a bucket that is real work
    min_occupancy: float  # the lowest such share
    saving: int  # batches whose backward pass keeps their loop items' matmul outputs
    compile_seconds: float = 0.0  # seconds spent tracing, lowering and compiling steps that call apply
    padding: float = 1.0  # rows the device computed over rows the batches needed


class StatsRecorder:
    """Thread-safe counters behind ``compiler.stats()``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reset()

    def _reset(self) -> None:
        self._layouts: collections.Counter[BatchLayout] = collections.Counter()
        self._traces = 0
        self._nodes = 0
        self._computed = 0
        self._compile_seconds = 0.0
        self._occupancy: list[float] = []

    def built(self, batch: Batch) -> None:
        computed, stats = computed_rows(batch), batch.built_stats()
        with self._lock:
            self._layouts[batch.layout] += 1
            self._nodes += stats.num_nodes
            self._computed += computed
            self._occupancy.append(stats.rows / batch.layout.size_class)

    def traced(self, layout: BatchLayout) -> None:
        """``apply`` is being traced for a batch of ``layout``: count it, and the compile seconds
        JAX reports next."""
        with self._lock:
            self._traces += 1
        _listen()
        _pending.recorder = weakref.ref(self)
        _pending.layout = layout
        _pending.seconds = 0.0

    def compiled(self, seconds: float) -> None:
        with self._lock:
            self._compile_seconds += seconds

    def snapshot(self, reset: bool) -> CompilerStats:
        with self._lock:
            sizes: collections.Counter[int] = collections.Counter()
            for layout, n in self._layouts.items():
                sizes[layout.size_class] += n
            occ = self._occupancy
            out = CompilerStats(sum(self._layouts.values()), len(self._layouts), dict(sorted(sizes.items())),
                                self._traces, self._nodes, sum(occ) / len(occ) if occ else 0.0,
                                min(occ) if occ else 0.0,
                                sum(n for layout, n in self._layouts.items() if layout.saved_rows),
                                self._compile_seconds, self._computed / self._nodes if self._nodes else 1.0)
            if reset:
                self._reset()
            return out


# The recorder whose ``apply`` this thread traced last, until JAX reports its backend compilation.
_pending = threading.local()
_COMPILE_EVENTS = ("/jax/core/compile/jaxpr_trace_duration", "/jax/core/compile/jaxpr_to_mlir_module_duration",
                   "/jax/core/compile/backend_compile_duration")
_listening: list[bool] = []
_listening_lock = threading.Lock()


def _on_duration(event: str, seconds: float, **_: object) -> None:
    ref = getattr(_pending, "recorder", None)
    recorder = ref() if ref is not None else None
    if recorder is None or event not in _COMPILE_EVENTS:
        return
    recorder.compiled(seconds)
    _pending.seconds += seconds
    if event == _COMPILE_EVENTS[-1]:
        _pending.recorder = None
        layout = _pending.layout
        logger.info("fold: compiled a function that calls apply in %.1f s (tracing, lowering and XLA) for a batch "
                    "layout of A=%d, B=%d, C=%d, %d loop operations", _pending.seconds, layout.size_class,
                    layout.num_examples, layout.chunk, len(layout.loop_ops))


def _listen() -> None:
    """Registers ``_on_duration`` with ``jax.monitoring`` once per process (JAX keeps listeners
    for the process's life; this one only reads ``_pending``)."""
    with _listening_lock:
        if not _listening:
            _listening.append(True)
            jax.monitoring.register_event_duration_secs_listener(_on_duration)  # type: ignore[arg-type]
