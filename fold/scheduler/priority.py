"""The CPU priority of the thread or worker processes that build batches ahead.

``compiler.batches`` builds the next batches while the device runs the step. On a CPU backend
the step's own threads (XLA's) and the builder share the cores, and at the same priority the
operating system gives the builder its share of a core whenever they compete, though the step
is what the training loop waits for. Where the builder has time to spare (it idles most of the
time, waiting for the loop to take a batch) it need not compete: a builder that is *nicer*
(Linux's niceness, a lower priority) runs on what the step leaves idle, and the step's threads
get a core whenever they are ready to run. Where building is what the loop waits for (a chain
model's many small nodes at small batches), a nicer builder would only make the loop slower.

So a builder starts at the caller's priority and becomes ``BUILD_NICENESS`` nicer, once and for
good, when over its last ``WINDOW`` batches it was busy less than ``DUTY`` of the time
(``Pacer``). The first batches of a stream, built back to back before the first step, never
qualify. On a 2-core CPU, with the loss read after every step (docs/performance.md, "Building
ahead on a thread"), the SST Tree-LSTM's loop took batches 1.03-1.13x as fast at 25 to 64 trees.

Linux only: a Linux thread's niceness is its own, so only the builder changes. Elsewhere
``setpriority`` would change the whole process, and nothing is changed. The environment
variable ``FOLD_BUILD_NICENESS`` sets the niceness added (0 leaves the builders at the
caller's priority).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable

__all__ = ["BUILD_NICENESS", "DUTY", "ENV", "WINDOW", "Pacer", "build_niceness", "lower_priority"]

logger = logging.getLogger("fold")

ENV = "FOLD_BUILD_NICENESS"
"""An integer from 0 to 19: the niceness builders add to their own (default ``BUILD_NICENESS``)."""

BUILD_NICENESS = 10
"""What builders add to their niceness by default: enough that a step's threads win every
contest for a core (a niceness 10 higher weighs about a tenth as much with Linux's scheduler)."""

DUTY = 0.4
"""A builder busy less than this share of its time over its last ``WINDOW`` batches has time to
spare: it keeps up on the cycles the step leaves idle."""

WINDOW = 8
"""The batches over which a builder's share of busy time is measured."""

_MAX_NICENESS = 19


def build_niceness() -> int:
    """The niceness builders add: ``FOLD_BUILD_NICENESS`` if set, else ``BUILD_NICENESS``.

    Raises:
      ValueError: the variable is not an integer from 0 to 19.
    """
    value = os.environ.get(ENV)
    if value is None:
        return BUILD_NICENESS
    try:
        niceness = int(value)
    except ValueError:
        niceness = -1
    if not 0 <= niceness <= _MAX_NICENESS:
        raise ValueError(f"{ENV} must be an integer from 0 (builders at the caller's priority) to "
                         f"{_MAX_NICENESS}, got {value!r}")
    return niceness


def lower_priority(niceness: int) -> None:
    """Adds ``niceness`` to the calling thread's niceness (at most 19), on Linux; elsewhere, or
    for 0, does nothing. Threads it starts afterwards inherit the new niceness."""
    if not niceness or not sys.platform.startswith("linux"):
        return
    thread = threading.get_native_id()
    try:
        current = os.getpriority(os.PRIO_PROCESS, thread)
        os.setpriority(os.PRIO_PROCESS, thread, min(_MAX_NICENESS, current + niceness))
    except OSError as e:  # raising one's niceness needs no privilege, but a sandbox may forbid it
        logger.debug("fold: could not lower the batch builder's priority: %s", e)


class Pacer:
    """Lowers one builder's priority once it has time to spare (see the module docstring).

    The builder calls ``started`` before and ``finished`` after each batch it builds, on its own
    thread: the time between two batches is time it waited for work. ``clock`` is for tests.
    """

    def __init__(self, niceness: int, clock: Callable[[], float] = time.perf_counter):
        self.niceness = niceness
        self.lowered = not niceness
        self._clock = clock
        self._busy: deque[float] = deque(maxlen=WINDOW)
        self._spans: deque[float] = deque(maxlen=WINDOW)  # busy and the wait before it
        self._start = 0.0
        self._end: float | None = None

    def started(self) -> None:
        self._start = self._clock()

    def finished(self) -> None:
        end = self._clock()
        busy = end - self._start
        self._busy.append(busy)
        self._spans.append(busy + (self._start - self._end if self._end is not None else 0.0))
        self._end = end
        if not self.lowered and len(self._busy) == WINDOW and sum(self._busy) < DUTY * sum(self._spans):
            self.lowered = True
            logger.info("fold: the batch builder has time to spare (busy %.0f %% of its last %d batches): it runs "
                        "%d nicer", 100 * sum(self._busy) / sum(self._spans), WINDOW, self.niceness)
            lower_priority(self.niceness)
