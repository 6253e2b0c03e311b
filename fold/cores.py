"""``reserve_host_cores``: leave CPU cores to the host work that builds batches.

fold builds each batch on the host (``compiler.batches`` on a thread, or in worker processes)
while the device runs the step before it. On a CPU backend, both want the same cores: XLA's
CPU client starts one thread per core it may use, and when a builder takes one of those cores,
XLA's threads and the builder slow each other down. For a model of many small operations (a
chain's LSTM steps, batches of a few examples), XLA's extra threads do little for the step
itself. Measured on 2 cores (``benchmarks.host_cores``; docs/performance.md, "Leaving a core to
the host"): a BiLSTM tagger's step at batch 16 took 6.1 ms with XLA on both cores and 6.2 ms on
one, but its training loop, building beside the steps, 10.5 ms a batch against 8.5 ms. A model
of large matmuls is the opposite: an SST Tree-LSTM step at batch 64 took 1.17x as long on one
core, and its loop 1.07x.

XLA sizes its thread pools, and fixes where their threads may run, when JAX first starts a
backend, from the cores the process may use then. ``reserve_host_cores`` starts the backends
with ``n`` cores fewer and then gives the process all of them back: JAX's threads keep to the
others, every thread started later (the batch builder's, worker processes) may use all.
"""

from __future__ import annotations

import os
import warnings

import jax

from fold.errors import check_int

__all__ = ["reserve_host_cores"]


def reserve_host_cores(n: int = 1) -> tuple[int, ...]:
    """Starts JAX's backends on all but ``n`` of this process's CPU cores (Linux only).

    Call it first, before anything starts JAX's backends (the first array,
    ``jax.devices()``, jitted call or ``compiler.init``). JAX's threads
    (XLA's CPU client, its thread pools) then run on the other cores, while
    threads and processes started later, such as the one
    ``compiler.batches`` builds batches on, may run anywhere. It pays where a
    step is many small operations (chains, small batches) and the host
    builds the next batch while the step runs; it costs where large matmuls
    would have used every core, and XLA compiles on the cores it keeps (an
    SST step's first call took 1.7-1.9x as long on 1 of 2 cores:
    docs/performance.md, "Leaving a core to the host").

    Example (a script's first lines)::

        import fold as fd
        fd.reserve_host_cores(1)

    Args:
      n: how many cores to leave to the host (at least 1).

    Returns:
      The cores JAX's threads may use: all of the process's, with a
      warning, where it may use no more than ``n``; an empty tuple, with a
      warning, where the platform cannot restrict threads to cores (only
      Linux can), and JAX then uses all of them.

    Raises:
      ValueError: ``n`` is not a positive int.
      RuntimeError: JAX's backends have already started.
    """
    n = check_int("n", n, 1)
    if _backends_started():
        raise RuntimeError("reserve_host_cores must run before JAX starts its backends (before the first array, "
                           "jax.devices() or jitted call): call it first in the program")
    if not hasattr(os, "sched_setaffinity"):
        warnings.warn("reserve_host_cores: this platform cannot restrict threads to cores; JAX uses all of them",
                      RuntimeWarning, stacklevel=2)
        jax.devices()
        return ()
    cores = os.sched_getaffinity(0)
    if len(cores) <= n:
        warnings.warn(f"reserve_host_cores({n}): this process may use {len(cores)} core(s), too few to reserve "
                      f"{n}; JAX uses all of them", RuntimeWarning, stacklevel=2)
        jax.devices()
        return tuple(sorted(cores))
    kept = tuple(sorted(cores)[:len(cores) - n])
    # Threads take the cores of the thread that starts them: JAX's are started now, on ``kept``.
    os.sched_setaffinity(0, kept)
    try:
        jax.devices()
    finally:
        os.sched_setaffinity(0, cores)
    return kept


def _backends_started() -> bool:
    """Whether JAX has started its backends (``jax._src.xla_bridge``; JAX has no public test)."""
    from jax._src import xla_bridge

    started = getattr(xla_bridge, "backends_are_initialized", None)
    return bool(started()) if callable(started) else False
