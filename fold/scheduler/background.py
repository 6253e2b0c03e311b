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
consumer) stops the workers.

Why not ``concurrent.futures.ProcessPoolExecutor``: it funnels every
result through one pipe shared by all workers, read by a manager thread.
A worker killed while writing a result leaves half a message in that
pipe, and the manager thread waits forever for the rest (the parent and
the other workers keep the pipe open), so the consumer hangs instead of
seeing ``BrokenProcessPool``. Here each worker has its own pipe whose
writing end only that worker holds: its death is an end of file on the
consumer's side, whatever it was doing.
"""

from __future__ import annotations

import multiprocessing
import pickle
import signal
import sys
import time
import traceback
import warnings
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection, wait
from typing import Any

__all__ = ["build_ahead", "uses_processes"]

_JOIN_SECONDS = 2.0  # how long a stopping worker may take to finish its batch before it is killed


def uses_processes() -> bool:
    """Whether ``build_ahead`` uses worker processes here (else threads)."""
    return sys.platform.startswith("linux") and "fork" in multiprocessing.get_all_start_methods()


class _RemoteTraceback(Exception):
    """Carries a worker's formatted traceback as the ``__cause__`` of its re-raised exception."""

    def __str__(self) -> str:
        return self.args[0]


def _picklable(error: BaseException) -> BaseException:
    """``error`` itself if it survives pickling, else a RuntimeError with its message."""
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:
        return RuntimeError(f"{type(error).__name__}: {error}")


def _worker(conn: Connection, inherited: list[Connection], compiler: Any, chunks: Sequence[list]) -> None:
    """A worker's life: build the chunk of every index received (until None) and send back
    ``(ok, batch or exception, traceback)``."""
    for c in inherited:
        c.close()  # earlier workers' parent ends: holding them would hide those pipes' end of file
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the consumer's to handle; it stops us
    try:
        while (i := conn.recv()) is not None:
            try:
                message = (True, compiler._build_batch(chunks[i]), None)
            except Exception as e:
                message = (False, _picklable(e), traceback.format_exc())
            conn.send(message)
    except (EOFError, OSError):
        pass  # the consumer is gone or closed our pipe mid-send: stop


class _Workers:
    """Forked workers with one duplex pipe each; chunk ``i`` goes to worker ``i % n``.

    Each worker handles its requests in order, so the next message on a
    worker's pipe is the result of its oldest request, and reading the
    pipes round-robin yields the batches in chunk order.
    """

    def __init__(self, compiler: Any, chunks: Sequence[list], n: int):
        ctx = multiprocessing.get_context("fork")
        self.conns: list[Connection] = []
        self.procs: list[Any] = []
        with warnings.catch_warnings():
            # JAX warns that forking a multithreaded process may deadlock; the
            # workers never call into JAX, only the host walk and NumPy.
            warnings.filterwarnings("ignore", message=r".*os\.fork\(\)", category=RuntimeWarning)
            warnings.filterwarnings("ignore", message=r".*fork\(\) may lead to deadlocks", category=DeprecationWarning)
            try:
                for _ in range(n):
                    mine, theirs = ctx.Pipe()
                    proc = ctx.Process(target=_worker, args=(theirs, list(self.conns), compiler, chunks),
                                       daemon=True, name="fold-batch-builder")
                    proc.start()
                    theirs.close()  # only the worker holds its writing end, so its death reads as end of file
                    self.conns.append(mine)
                    self.procs.append(proc)
            except BaseException:
                self.stop()
                raise

    def submit(self, i: int) -> None:
        try:
            self.conns[i % len(self.conns)].send(i)
        except OSError as e:
            raise self._died(i % len(self.conns)) from e

    def result(self, i: int) -> Any:
        w = i % len(self.conns)
        conn, proc = self.conns[w], self.procs[w]
        while True:
            ready = wait([conn, proc.sentinel])
            if conn in ready:
                try:
                    ok, value, remote_tb = conn.recv()
                except (EOFError, OSError) as e:
                    raise self._died(w) from e
                if ok:
                    return value
                value.__cause__ = _RemoteTraceback(f"\n\"\"\"\n{remote_tb}\"\"\"")
                raise value
            if not conn.poll():  # dead, and nothing (not even half a message) left to read
                raise self._died(w)

    def _died(self, w: int) -> RuntimeError:
        proc = self.procs[w]
        proc.join(timeout=_JOIN_SECONDS)
        how = f"exit code {proc.exitcode}" if proc.exitcode is not None else "closed its pipe"
        return RuntimeError(
            f"a batch-building worker process died ({how}: killed, or out of memory?); "
            "use num_workers=0 to build in this process and see the error")

    def stop(self) -> None:
        """Tells idle workers to stop, closes the pipes, and kills any worker still busy after a grace period."""
        for conn in self.conns:
            try:
                conn.send(None)
            except OSError:
                pass  # already dead
            conn.close()
        deadline = time.monotonic() + _JOIN_SECONDS
        for proc in self.procs:
            proc.join(timeout=max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                proc.kill()
                proc.join()


def _in_order(n: int, window: int, submit: Any, result: Any) -> Iterator[Any]:
    """``result(i)`` for ``i`` in ``range(n)``, keeping up to ``window`` chunks submitted ahead."""
    submitted = 0
    for i in range(n):
        while submitted < n and submitted - i < window:
            submit(submitted)
            submitted += 1
        yield result(i)


def _with_threads(compiler: Any, chunks: Sequence[list], num_workers: int, ahead: int) -> Iterator[Any]:
    pool = ThreadPoolExecutor(num_workers)
    pending: deque = deque()
    try:
        yield from _in_order(len(chunks), num_workers + ahead,
                             lambda j: pending.append(pool.submit(compiler._build_batch, chunks[j])),
                             lambda i: pending.popleft().result())
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _with_processes(compiler: Any, chunks: Sequence[list], num_workers: int, ahead: int) -> Iterator[Any]:
    workers = _Workers(compiler, chunks, num_workers)
    try:
        yield from _in_order(len(chunks), num_workers + ahead, workers.submit, workers.result)
    finally:
        workers.stop()


def build_ahead(compiler: Any, chunks: Sequence[list], num_workers: int, ahead: int = 2) -> Iterator[Any]:
    """Yields the batch of every chunk, in order, built in the background (``compiler._build_batch``)."""
    if not chunks:
        return
    build = _with_processes if uses_processes() else _with_threads
    yield from build(compiler, chunks, num_workers, ahead)
