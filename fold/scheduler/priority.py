"""The CPU priority of the thread or worker processes that build batches ahead.

``compiler.batches`` builds the next batches while the device runs the step. On a CPU backend
the step's own threads (XLA's) and the builder share the cores, and at the same priority the
operating system gives the builder its share of a core whenever they compete, though the step
is what the training loop waits for: the next batch is needed only once the step ends. A
builder that is *nicer* (a higher niceness, Linux's lower priority) runs on what the step
leaves idle, and the step's threads get a core whenever they are ready to run.

On a 2-core CPU, with the loss read after every step (docs/performance.md, "Building ahead
on a thread"), a niceness of ``BUILD_NICENESS`` made SST's training loop 1.06-1.12x as fast at
batches of 25 to 256, and the DyNet tagger's 1.05-1.07x at batch 16. It cannot slow a step:
the builder still gets every idle cycle, and a step waiting for its batch leaves the cores
idle.

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

__all__ = ["BUILD_NICENESS", "ENV", "build_niceness", "lower_priority"]

logger = logging.getLogger("fold")

ENV = "FOLD_BUILD_NICENESS"
"""An integer from 0 to 19: the niceness builders add to their own (default ``BUILD_NICENESS``)."""

BUILD_NICENESS = 10
"""What builders add to their niceness by default: enough that a step's threads win every
contest for a core (a niceness 10 higher weighs about a tenth as much with Linux's scheduler)."""

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
