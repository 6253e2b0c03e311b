"""``compiler.stats()``: how many batch shapes (compilations) a stream of batches costs.

Every array size in a batch derives from its size class ``A`` (rows of the
fullest arena, rounded up to a power of two), so batches share a
``BatchLayout`` -- and a compilation -- when they fall in the same bucket.
These counters show how many layouts a stream produced and how full the
buckets were.
"""

from __future__ import annotations

import collections
import threading
from typing import Any, NamedTuple

__all__ = ["CompilerStats", "StatsRecorder"]


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
    ``"auto"`` under its ``save_limit``).
    """

    batches: int
    layouts: int
    size_classes: dict[int, int]
    traces: int
    nodes: int
    occupancy: float
    min_occupancy: float
    saving: int


class StatsRecorder:
    """Thread-safe counters behind ``compiler.stats()``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reset()

    def _reset(self) -> None:
        self._layouts: collections.Counter = collections.Counter()
        self._traces = 0
        self._nodes = 0
        self._occupancy: list[float] = []

    def built(self, batch: Any) -> None:
        with self._lock:
            self._layouts[batch.layout] += 1
            self._nodes += batch.stats.num_nodes
            self._occupancy.append(batch.stats.rows / batch.layout.size_class)

    def traced(self) -> None:
        with self._lock:
            self._traces += 1

    def snapshot(self, reset: bool) -> CompilerStats:
        with self._lock:
            sizes: collections.Counter = collections.Counter()
            for layout, n in self._layouts.items():
                sizes[layout.size_class] += n
            occ = self._occupancy
            out = CompilerStats(sum(self._layouts.values()), len(self._layouts), dict(sorted(sizes.items())),
                                self._traces, self._nodes, sum(occ) / len(occ) if occ else 0.0,
                                min(occ) if occ else 0.0,
                                sum(n for layout, n in self._layouts.items() if layout.saved_rows))
            if reset:
                self._reset()
            return out
