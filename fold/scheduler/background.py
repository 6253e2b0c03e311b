"""Building batches ahead of the device in worker processes.

``build_ahead`` keeps up to ``num_workers + ahead`` batches in flight and
yields them in order. Workers are forked, so they inherit the compiler
and the examples (user models are full of lambdas, which cannot be
pickled); only chunk indices travel to them and built ``Batch``es (NumPy
arrays) travel back. Workers run host code only (the walk and NumPy),
never JAX, which is what makes forking a process that has JAX loaded safe.
Where ``fork`` is not available (Windows, and macOS where it is unsafe),
threads build ahead instead.

Failure handling: an exception raised while building (a malformed example)
is re-raised in the consumer with its natural type; a worker that dies
raises a ``RuntimeError`` in the consumer instead of hanging; and closing
the generator early (``break``, an exception or KeyboardInterrupt in the
consumer) cancels the pending work and shuts the pool down.
"""

from __future__ import annotations

import multiprocessing
import sys
import warnings
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

__all__ = ["build_ahead", "uses_processes"]

# What forked workers inherit: set by the parent just before the pool forks.
_JOB: tuple[Any, Sequence[list]] | None = None


def uses_processes() -> bool:
    """Whether ``build_ahead`` uses worker processes here (else threads)."""
    return sys.platform.startswith("linux") and "fork" in multiprocessing.get_all_start_methods()


def _build_in_worker(i: int) -> Any:
    compiler, chunks = _JOB  # type: ignore[misc]
    return compiler._build_batch(chunks[i])


def _pool(compiler: Any, chunks: Sequence[list], num_workers: int) -> Executor:
    global _JOB
    if not uses_processes():
        return ThreadPoolExecutor(num_workers)
    _JOB = (compiler, chunks)
    pool = ProcessPoolExecutor(num_workers, mp_context=multiprocessing.get_context("fork"))
    # Fork all workers now, while _JOB holds this job's compiler and chunks.
    with warnings.catch_warnings():
        # JAX warns that forking a multithreaded process may deadlock; the
        # workers never call into JAX, only the host walk and NumPy.
        warnings.filterwarnings("ignore", message=r".*os\.fork\(\)", category=RuntimeWarning)
        warnings.filterwarnings("ignore", message=r".*fork\(\) may lead to deadlocks", category=DeprecationWarning)
        for f in [pool.submit(int, 0) for _ in range(num_workers)]:
            f.result()
    _JOB = None  # the workers have their copy; do not keep the examples alive here
    return pool


def build_ahead(compiler: Any, chunks: Sequence[list], num_workers: int, ahead: int = 2) -> Iterator[Any]:
    """Yields the batch of every chunk, in order, built in the background (``compiler._build_batch``)."""
    if not chunks:
        return
    pool = _pool(compiler, chunks, num_workers)
    threads = isinstance(pool, ThreadPoolExecutor)
    pending: deque = deque()
    submitted = 0
    try:
        while submitted < len(chunks) or pending:
            while submitted < len(chunks) and len(pending) < num_workers + ahead:
                task = (compiler._build_batch, chunks[submitted]) if threads else (_build_in_worker, submitted)
                pending.append(pool.submit(*task))
                submitted += 1
            future = pending.popleft()
            try:
                batch = future.result()
            except BrokenProcessPool as e:
                raise RuntimeError(
                    "a batch-building worker process died (killed, or out of memory?); "
                    "use num_workers=0 to build in this process and see the error"
                ) from e
            yield batch
    finally:
        for f in pending:
            f.cancel()
        pool.shutdown(wait=True, cancel_futures=True)
