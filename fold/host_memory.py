"""``keep_host_memory``: freed host memory kept for the next step instead of returned to the system.

On a CPU backend, XLA allocates every temporary buffer of a step with ``malloc`` and frees it
when the step ends. glibc serves a block above its *mmap threshold* (which adapts, up to 32 MiB)
with fresh pages from the kernel and unmaps it on ``free``, and it returns free memory at the
top of a heap to the kernel once more than its *trim threshold* is free there. A step whose
buffers take tens of MiB then pays a page fault for every 4 KiB page it touches, every step:
the kernel zeroes each page and maps it, on the step's threads.

``keep_host_memory`` raises both thresholds, so that such blocks come from the heap and stay
there for the next step, and glibc's *top pad* to the largest block kept: a heap then grows by at
least that much, and the heaps of XLA's threads (64 MiB each at most), which glibc unmaps once
entirely free whatever the thresholds, stay (without it, one process in three still faulted
9,000 times a step). Measured on a 2-core CPU (``benchmarks.host_allocator``;
docs/performance.md, "Host allocator"), an SST Tree-LSTM training step at batch 64 took 25 ms
without a page fault instead of 32-34 ms and 9,150 faults under glibc's defaults (two runs); at
batch 256, 90-92 ms instead of 100-101.

The price is memory: up to ``kept_free`` bytes per allocation arena stay mapped once freed, so
the process's resident size stays near its peak (as with any caching allocator).

``Compiler.create`` applies it with its defaults, once per process (``keep_by_default``), unless
the program chose first: it called ``keep_host_memory`` itself, set the environment variable
``FOLD_KEEP_HOST_MEMORY=0``, or set glibc's own thresholds (``MALLOC_MMAP_THRESHOLD_``,
``MALLOC_TRIM_THRESHOLD_``, or either in ``GLIBC_TUNABLES``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import os
import platform

from fold.errors import check_int

__all__ = ["ENV", "KEPT_BLOCK", "KEPT_FREE", "keep_by_default", "keep_host_memory"]

logger = logging.getLogger("fold")

ENV = "FOLD_KEEP_HOST_MEMORY"
"""``0`` leaves glibc's defaults to the program (``keep_by_default`` does nothing); ``1``, the
default, lets ``Compiler.create`` keep host memory."""

KEPT_BLOCK = 64 * 2**20
"""Default ``largest_block``: larger than any buffer of the steps measured (an SST arena at
batch 256 and H 300 is 24 MiB), small enough that a rare huge buffer still goes back."""

KEPT_FREE = 128 * 2**20
"""Default ``kept_free``: twice ``KEPT_BLOCK``, glibc's own ratio of the two thresholds."""

# mallopt parameters (glibc's malloc.h).
_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3

# Whether the process has chosen its thresholds (``keep_host_memory`` ran): the default then
# leaves them alone.
_chosen = False


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    """The C library, if it is glibc (the only one whose ``mallopt`` takes these parameters)."""
    if platform.libc_ver()[0] != "glibc":
        return None
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")


def keep_host_memory(largest_block: int = KEPT_BLOCK, kept_free: int = KEPT_FREE) -> bool:
    """Keeps freed host memory for reuse: blocks up to ``largest_block`` bytes come from the heap,
    heaps grow by at least ``largest_block`` and are not handed back whole, and up to
    ``kept_free`` free bytes stay at the top of each (glibc's ``M_MMAP_THRESHOLD``,
    ``M_TOP_PAD`` and ``M_TRIM_THRESHOLD``).

    It may be called at any time; it affects every allocation of the process after it (NumPy's,
    PyTorch's, XLA's). It pays on a CPU backend, where a step's temporary buffers are host
    memory; on an accelerator only host-side buffers are concerned.

    Example::

        import fold as fd
        fd.keep_host_memory()

    Args:
      largest_block: blocks larger than this are still mapped fresh and returned on ``free``.
      kept_free: free memory at the top of a heap beyond this is returned to the system.

    Returns:
      Whether the setting took effect: False where the C library is not glibc (macOS, musl,
      Windows), where this does nothing.

    Raises:
      ValueError: a size is not a positive int, or above 2**31 - 1 (``mallopt`` takes an ``int``).
    """
    largest_block = check_int("largest_block", largest_block, 1)
    kept_free = check_int("kept_free", kept_free, 1)
    for name, value in (("largest_block", largest_block), ("kept_free", kept_free)):
        if value > 2**31 - 1:
            raise ValueError(f"{name} must be at most 2**31 - 1 bytes (mallopt takes an int), got {value}")
    global _chosen
    _chosen = True
    libc = _glibc()
    if libc is None:
        return False
    settings = ((_M_MMAP_THRESHOLD, largest_block), (_M_TOP_PAD, largest_block), (_M_TRIM_THRESHOLD, kept_free))
    return all([bool(libc.mallopt(param, value)) for param, value in settings])


def keep_by_default() -> bool:
    """``keep_host_memory()`` the first time it is called in a process, unless the program chose
    otherwise (see the module docstring). ``Compiler.create`` calls it.

    Returns:
      Whether it changed glibc's thresholds now.

    Raises:
      ValueError: ``FOLD_KEEP_HOST_MEMORY`` is set to something other than ``0`` or ``1``.
    """
    setting = os.environ.get(ENV, "1")
    if setting not in ("0", "1"):
        raise ValueError(f"{ENV} must be 0 (leave glibc's defaults) or 1 (keep host memory), got {setting!r}")
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    if (_chosen or setting == "0" or "MALLOC_MMAP_THRESHOLD_" in os.environ or "MALLOC_TRIM_THRESHOLD_" in os.environ
            or "mmap_threshold" in tunables or "trim_threshold" in tunables):
        return False
    kept = keep_host_memory()
    if kept:
        logger.info("fold: freed host memory is kept for reuse (blocks up to %d MiB, %d MiB free per arena; "
                    "%s=0 leaves glibc's defaults)", KEPT_BLOCK >> 20, KEPT_FREE >> 20, ENV)
    return kept
