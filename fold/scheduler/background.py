"""Building batches ahead of the device in worker processes, or on a thread.

``build_ahead`` keeps up to ``num_workers + ahead`` batches in flight and
yields them in order. Workers are forked, so they inherit the compiler
(user models are full of lambdas, which cannot be pickled); each batch's
examples travel to them by pickle and built ``Batch``es (NumPy arrays)
travel back. Workers run host code only (the walk and NumPy), never JAX,
which is what makes forking a process that has JAX loaded safe. Where
``fork`` is not available (Windows, and macOS where it is unsafe), threads
build ahead instead.

Without workers, one thread of the caller's process builds ahead: the
walk holds the GIL, but the caller's step does not (JAX releases it while
it waits for the device), so a thread hides the host's work wherever the
step leaves a core free: always beside an accelerator, and on the CPU when
XLA does not use every core.

Workers are forked once per compiler, not once per ``batches`` call: a
``WorkerPool`` that delivered every batch it was asked for goes back to
the compiler's ``IdlePool`` for the next call. Forking is cheap, but for as
long as a child lives, every page of the parent's heap is shared
copy-on-write, and the parent pays a page fault and a copy for each page
it writes afterwards (about 0.4 s for a training process of 850 MB, once
per fork; docs/performance.md). The examples therefore cannot be
inherited: a later call's examples did not exist at fork time.

Failure handling: an exception raised while building (a malformed example)
is re-raised in the consumer with its natural type; a worker that dies
raises a ``RuntimeError`` in the consumer instead of hanging, and so does one
stopped (SIGSTOP) for ``STOPPED_SECONDS``; workers whose consumer dies, even
by SIGKILL, read an end of file and exit; and closing
the generator early (``break``, an exception or KeyboardInterrupt in the
consumer) stops the workers. A pool is only reused when nothing is left
in flight, so a later call never reads an earlier call's batches.

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
import queue
import signal
import sys
import threading
import time
import traceback
import warnings
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import TypeAlias

from fold.scheduler.batch import Batch
from fold.scheduler.builder import ExampleChunk
from fold.scheduler.records import ByReference, RecordedExamples, next_serial

__all__ = ["build_ahead", "uses_processes", "IdlePool", "WorkerPool", "Chunk", "ChunkSizes", "Job", "Build"]

Chunk: TypeAlias = RecordedExamples | ExampleChunk
"""One batch's examples as the stream carries them: recorded, or Python examples with their indices."""

ChunkSizes: TypeAlias = tuple[int, ...] | None
"""The candidates for ``C`` a batch is built with (None: its compiler's)."""

Job: TypeAlias = tuple[Chunk, ChunkSizes]
"""One batch to build: its examples and its candidates for ``C``."""

Build: TypeAlias = Callable[[Chunk, ChunkSizes], Batch]
"""Builds the batch of one chunk of examples (``Batcher.build_own``: NumPy only)."""

_JOIN_SECONDS = 2.0  # how long a stopping worker may take to finish its batch before it is killed
# How often the consumer, waiting for a batch, checks that its worker is not stopped (SIGSTOP, a
# debugger), and how long a worker may stay stopped before the consumer gives up on it.
_STOPPED_CHECK_SECONDS = 1.0
STOPPED_SECONDS = 10.0


def uses_processes() -> bool:
    """Whether ``build_ahead`` uses worker processes here (else threads)."""
    return sys.platform.startswith("linux") and "fork" in multiprocessing.get_all_start_methods()


class _RemoteTraceback(Exception):
    """Carries a worker's formatted traceback as the ``__cause__`` of its re-raised exception."""

    def __str__(self) -> str:
        return str(self.args[0])


# Built-in exceptions an error that cannot be pickled is sent as, the first it is an instance of.
_BUILTIN = (KeyError, TypeError, ValueError, OverflowError, ZeroDivisionError, ArithmeticError, LookupError)


def _picklable(error: BaseException) -> BaseException:
    """``error`` itself if it survives pickling, else the nearest built-in exception it is an
    instance of (RuntimeError if none) with its type name, message and notes (where the walk
    put the example and block path)."""
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:
        notes = "; ".join(getattr(error, "__notes__", ()))
        cls = next((c for c in _BUILTIN if isinstance(error, c)), RuntimeError)
        return cls(f"{type(error).__name__}: {error}" + (f" ({notes})" if notes else ""))


def _worker(conn: Connection, inherited: list[Connection], build: Build) -> None:
    """A worker's life: build every chunk of examples received (until None) and send back
    ``(ok, batch or exception, traceback)``.

    A thread reads the jobs as they come: otherwise a worker blocked writing a large batch that
    the consumer is not reading yet, while the consumer is blocked writing it a large chunk of
    examples, would wait for each other forever.
    """
    for c in inherited:
        # The parent's ends (ours and other workers'): holding them would hide those pipes' end of
        # file, and ours is how a worker learns that its consumer died (even by SIGKILL).
        c.close()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the consumer's to handle; it stops us
    jobs: queue.SimpleQueue[tuple[Chunk | ByReference, ChunkSizes] | None] = queue.SimpleQueue()

    def read() -> None:
        try:
            while (job := conn.recv()) is not None:
                jobs.put(job)
        except (EOFError, OSError):
            pass  # the consumer is gone: stop
        jobs.put(None)

    threading.Thread(target=read, daemon=True).start()
    try:
        while (job := jobs.get()) is not None:
            chunk, sizes = job
            try:
                if isinstance(chunk, ByReference):
                    chunk = chunk.resolve()
                message: tuple[bool, Batch | BaseException, str | None] = (True, build(chunk, sizes), None)
            except (Exception, SystemExit) as e:  # sys.exit in a user's function: the consumer's to raise
                message = (False, _picklable(e), traceback.format_exc())
            conn.send_bytes(_message_bytes(message))
    except OSError:
        pass  # the consumer is gone or closed our pipe mid-send: stop


def _message_bytes(message: tuple[bool, Batch | BaseException, str | None]) -> bytes:
    """``message`` pickled, or, for a batch that cannot be (a labeled metric's label that does not
    pickle, say), the error that says so: the worker would otherwise die sending it."""
    try:
        return pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as e:
        error = TypeError(f"num_workers > 0 sends each built batch back from its worker process by pickle, and "
                          f"this one cannot be pickled ({type(e).__name__}: {e}; a labeled Metric's labels travel "
                          "with it); build in this process with num_workers=0")
        return pickle.dumps((False, error, traceback.format_exc()), protocol=pickle.HIGHEST_PROTOCOL)


# Parent ends of every live pool's pipes: a newly forked worker closes its inherited copies.
_open_conns: set[Connection] = set()


class WorkerPool:
    """``n`` forked workers with one duplex pipe each; job ``i`` goes to worker ``i % n``.

    Each worker handles its jobs in order, so the next message on a
    worker's pipe is the result of its oldest job, and reading the pipes
    round-robin yields the batches in job order. ``in_flight`` counts jobs
    whose result has not been read.
    """

    def __init__(self, build: Build, n: int):
        ctx = multiprocessing.get_context("fork")
        self.conns: list[Connection] = []
        self.procs: list[BaseProcess] = []
        self.in_flight = 0
        self.born = next_serial()  # recordings made before this, the workers hold
        # A finalizer, so a pool still alive at exit stops before the interpreter tears
        # multiprocessing down: a stream left open (a loop that broke off) stops its pool when it is
        # collected, which at exit came after that teardown and failed.
        self._stop = weakref.finalize(self, _stop_workers, self.conns, self.procs)
        with warnings.catch_warnings():
            # JAX warns that forking a multithreaded process may deadlock; the
            # workers never call into JAX, only the host walk and NumPy.
            warnings.filterwarnings("ignore", message=r".*os\.fork\(\)", category=RuntimeWarning)
            warnings.filterwarnings("ignore", message=r".*fork\(\) may lead to deadlocks", category=DeprecationWarning)
            try:
                for _ in range(n):
                    mine, theirs = ctx.Pipe()
                    proc = ctx.Process(target=_worker, args=(theirs, [*_open_conns, mine], build),
                                       daemon=True, name="fold-batch-builder")
                    proc.start()
                    theirs.close()  # only the worker holds its writing end, so its death reads as end of file
                    _open_conns.add(mine)
                    self.conns.append(mine)
                    self.procs.append(proc)
            except BaseException:
                self.stop()
                raise

    def usable(self, n: int) -> bool:
        """Whether this pool has ``n`` live workers and nothing in flight."""
        return len(self.procs) == n and self.in_flight == 0 and all(p.is_alive() for p in self.procs)

    def submit(self, i: int, job: Job) -> None:
        """Sends job ``i``: build its chunk, a list of examples or recorded examples (by reference
        when the workers hold their recording: indices instead of arrays)."""
        chunk, sizes = job
        sent: Chunk | ByReference = chunk
        if isinstance(chunk, RecordedExamples):
            sent = chunk.by_reference(self.born) or chunk
        try:
            data = pickle.dumps((sent, sizes), protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as e:
            raise TypeError(
                f"num_workers > 0 sends each batch's examples to the worker processes by pickle, and "
                f"batch {i}'s examples cannot be pickled ({type(e).__name__}: {e}); "
                "build in this process with num_workers=0") from e
        try:
            self.conns[i % len(self.conns)].send_bytes(data)
        except OSError as e:
            raise self._died(i % len(self.conns)) from e
        self.in_flight += 1

    def result(self, i: int) -> Batch:
        """The batch of job ``i``, or its exception raised here."""
        w = i % len(self.conns)
        conn, proc = self.conns[w], self.procs[w]
        stopped_since: float | None = None
        while True:
            ready = wait([conn, proc.sentinel], timeout=_STOPPED_CHECK_SECONDS)
            if not ready:
                stopped_since = _stopped_since(proc, stopped_since)
                continue
            if conn in ready:
                try:
                    ok, value, remote_tb = conn.recv()
                except (EOFError, OSError) as e:
                    raise self._died(w) from e
                self.in_flight -= 1
                if ok:
                    assert isinstance(value, Batch)
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
        """Tells idle workers to stop, closes the pipes, and kills any worker still busy after a
        grace period. Stopping twice is harmless."""
        self._stop()


def _stop_workers(conns: list[Connection], procs: list[BaseProcess]) -> None:
    """``WorkerPool.stop``, on the pool's pipes and processes (its finalizer holds no pool)."""
    for conn in conns:
        _open_conns.discard(conn)
        try:
            conn.send(None)
        except OSError:
            pass  # already dead or closed
        conn.close()
    deadline = time.monotonic() + _JOIN_SECONDS
    for proc in procs:
        proc.join(timeout=max(0.0, deadline - time.monotonic()))
        if proc.is_alive():
            proc.kill()
            proc.join()


def _stopped_since(proc: BaseProcess, since: float | None) -> float | None:
    """When ``proc`` was first seen stopped in the wait under way (None while it runs); raises
    once it has stayed stopped for ``STOPPED_SECONDS``, instead of waiting for it forever."""
    if not _is_stopped(proc.pid):
        return None
    now = time.monotonic()
    if since is None:
        return now
    if now - since >= STOPPED_SECONDS:
        raise RuntimeError(
            f"batch-building worker process {proc.pid} has been stopped (SIGSTOP or a debugger) for "
            f"{now - since:.0f} s while this process waits for its batch; continue it (kill -CONT "
            f"{proc.pid}) and retry, or use num_workers=0 to build in this process")
    return since


def _is_stopped(pid: int | None) -> bool:
    """Whether process ``pid`` is stopped (state T or t in Linux's /proc; False where that is unknown)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            # The state follows the command name, which is in parentheses and may hold any character.
            return f.read().rpartition(")")[2].split()[0] in ("T", "t")
    except (OSError, IndexError):
        return False


class IdlePool:
    """The worker pool a compiler keeps between ``build_ahead`` calls (at most one)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pool: WorkerPool | None = None

    def take(self, build: Build, n: int) -> WorkerPool:
        """The kept pool if it has ``n`` live workers, else a newly forked one. Streams that run at
        the same time (training and evaluation batches, say) get a pool each."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None and pool.usable(n):
            return pool
        if pool is not None:
            pool.stop()
        return WorkerPool(build, n)

    def put(self, pool: WorkerPool) -> None:
        """Keeps ``pool`` (which must have nothing in flight) for the next call; a pool kept
        before is stopped."""
        with self._lock:
            kept, self._pool = self._pool, pool
        if kept is not None:
            kept.stop()

    def close(self) -> None:
        """Stops the kept pool, if any."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.stop()


def _in_order(jobs: Iterable[Job], window: int, submit: Callable[[int, Job], object],
              result: Callable[[int], Batch]) -> Iterator[Batch]:
    """``result(i)`` for the ``i``-th of ``jobs``, in order, keeping up to ``window`` jobs
    submitted ahead (``submit(i, job)``). ``jobs`` is read lazily, in the caller's thread:
    a stream of examples is taken only as far as the batches ahead need. An error reading it
    (the examples' own: a file gone) is raised after the batches read before it."""
    pending = iter(jobs)
    submitted = done = 0
    reading, error = True, None
    while True:
        while reading and submitted - done < window:
            try:
                job = next(pending, None)
            except Exception as e:
                job, error = None, e
            if job is None:
                reading = False
                break
            submit(submitted, job)
            submitted += 1
        if done == submitted:
            if error is not None:
                raise error
            return
        yield result(done)
        done += 1


def _with_threads(build: Build, jobs: Iterable[Job], num_workers: int, ahead: int) -> Iterator[Batch]:
    pool = ThreadPoolExecutor(num_workers)
    pending: deque[Future[Batch]] = deque()
    try:
        yield from _in_order(jobs, num_workers + ahead,
                             lambda _, job: pending.append(pool.submit(build, *job)),
                             lambda _: pending.popleft().result())
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _with_processes(build: Build, jobs: Iterable[Job], num_workers: int, ahead: int,
                    idle: IdlePool) -> Iterator[Batch]:
    pool = idle.take(build, num_workers)
    try:
        yield from _in_order(jobs, num_workers + ahead, pool.submit, pool.result)
    finally:
        # Kept only when every batch was read: anything still in flight would reach the next call.
        if pool.usable(num_workers):
            idle.put(pool)
        else:
            pool.stop()


def build_ahead(build: Build, jobs: Iterable[Job], num_workers: int, idle: IdlePool,
                ahead: int = 2) -> Iterator[Batch]:
    """Yields the batch of every job, in order, built in the background by ``build``: by
    ``num_workers`` workers of ``idle`` (threads where processes cannot be forked), or with
    ``num_workers == 0`` by one thread of this process, as one worker. ``jobs`` may be a lazy
    iterator; it is read in the caller's thread, each job when it is submitted (so a job's
    candidates for ``C`` may depend on the batches yielded before)."""
    if isinstance(jobs, Sequence) and not jobs:
        return
    if num_workers == 0:
        yield from _with_threads(build, jobs, 1, ahead)
    elif uses_processes():
        yield from _with_processes(build, jobs, num_workers, ahead, idle)
    else:
        yield from _with_threads(build, jobs, num_workers, ahead)
