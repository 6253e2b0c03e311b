"""Background batch building in worker processes or on a thread: order, errors, dead workers, shutdown,
reuse."""

from __future__ import annotations

import gc
import itertools
import multiprocessing
import os
import pathlib
import pickle
import signal
import subprocess
import sys
import threading
import time
import warnings

import jax
import numpy as np
import pytest

import fold as fd
from fold.scheduler import background, builder, layouts


def _model() -> fd.Compiler:
    # A lambda on purpose: forked workers need no pickling of the model.
    return fd.Compiler.create(fd.Map(fd.Scalar() >> fd.Function(lambda x: x * 3.0)) >> fd.Sum())


def _arrays_equal(a: fd.Batch, b: fd.Batch) -> bool:
    la, lb = jax.tree_util.tree_leaves(a.arrays), jax.tree_util.tree_leaves(b.arrays)
    return a.layout == b.layout and len(la) == len(lb) and all(np.array_equal(x, y) for x, y in zip(la, lb))


def test_workers_build_the_same_batches_in_order():
    compiler = _model()
    data = [[float(i)] * (i % 7) for i in range(101)]
    sequential = list(compiler.batches(data, 8))
    parallel = list(compiler.batches(data, 8, num_workers=2))
    assert len(parallel) == len(sequential) == 13
    assert all(_arrays_equal(a, b) for a, b in zip(parallel, sequential))
    params = compiler.init(jax.random.key(0))
    out = np.concatenate([np.asarray(compiler.apply(params, b).outputs) for b in parallel])
    np.testing.assert_allclose(out, [3.0 * i * (i % 7) for i in range(101)])


@pytest.mark.parametrize("num_workers, prefetch", [(0, False), (0, True), (2, True)])
def test_an_endless_stream_of_examples_is_read_only_as_far_as_the_batches_need(num_workers, prefetch):
    """``batches`` once made a list of its examples first, so an endless generator never gave a
    batch while its memory grew. It reads them lazily now, in the caller's thread, a few batches
    ahead at most; indices, outputs and a bad example's error count from the stream's start."""
    compiler = _model()
    read = []

    def stream():
        for i in itertools.count():
            assert i < 1000, "batches read the stream far past what its batches need"
            read.append(threading.current_thread())
            yield [float(i)] * (i % 5) if i != 60 else ["bad"]

    batches = compiler.batches(stream(), 4, num_workers=num_workers, prefetch=prefetch)
    taken = [next(batches) for _ in range(5)]
    assert [b.example_indices.tolist() for b in taken] == [list(range(4 * k, 4 * k + 4)) for k in range(5)]
    params = compiler.init(jax.random.key(0))
    out = np.concatenate([np.asarray(compiler.apply(params, b).outputs) for b in taken])
    np.testing.assert_allclose(out, [3.0 * i * (i % 5) for i in range(20)])
    # The layouts' first plan samples PLAN_AHEAD batches; building ahead adds a few more.
    assert 20 <= len(read) <= 4 * (layouts.PLAN_AHEAD + 5 + num_workers + 2)
    assert set(read) == {threading.current_thread()}
    with pytest.raises(ValueError, match="example 60 "):
        for _ in range(20):
            next(batches)


@pytest.mark.parametrize("num_workers, prefetch", [(0, False), (0, True), (2, True)])
def test_an_error_reading_the_examples_comes_after_the_batches_before_it(num_workers, prefetch):
    compiler = _model()

    def stream():
        for i in range(30):
            if i == 10:
                raise OSError("the file is gone")
            yield [float(i)]

    got = []
    with pytest.raises(OSError, match="the file is gone"):
        for batch in compiler.batches(stream(), 4, num_workers=num_workers, prefetch=prefetch):
            got.append(batch.example_indices.tolist())
    assert got == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_a_generator_gives_the_batches_a_list_gives():
    compiler = _model()
    data = [[float(i)] * (i % 3) for i in range(11)]
    for options in ({}, {"drop_remainder": True}, {"shuffle": True, "seed": 4}, {"num_workers": 2}):
        from_list = list(compiler.batches(data, 4, **options))
        from_generator = list(compiler.batches((x for x in data), 4, **options))
        assert [b.example_indices.tolist() for b in from_generator] == [b.example_indices.tolist() for b in from_list]
        assert all(_arrays_equal(a, b) for a, b in zip(from_generator, from_list)), options


def test_two_interleaved_streams_each_get_their_own_batches():
    # Two pools alive at once (say training and evaluation batches): the second
    # pool's workers are forked while the first pool's pipes are open.
    compiler = _model()
    a = [[float(i)] * (i % 5) for i in range(40)]
    b = [[float(-i)] * (i % 3 + 1) for i in range(40)]
    pairs = list(zip(compiler.batches(a, 4, num_workers=2), compiler.batches(b, 8, num_workers=2)))
    assert len(pairs) == 5
    for (x, y), ra, rb in zip(pairs, compiler.batches(a, 4), compiler.batches(b, 8)):
        assert _arrays_equal(x, ra) and _arrays_equal(y, rb)


def test_a_bad_example_raises_in_the_consumer_with_its_natural_type():
    compiler = _model()
    data = [[1.0]] * 20 + [[1.0, "x"]] + [[2.0]] * 20
    got = []
    with pytest.raises(ValueError, match=r"example 20 \(position 0 in its batch\): at Map.1. > Scalar: expected"):
        for batch in compiler.batches(data, 4, num_workers=2):
            got.append(batch)
    assert len(got) == 5  # every batch before the bad one arrived
    # Batches were still in flight when it raised: that pool is gone, and the next call works.
    good = [[float(i)] for i in range(30)]
    assert all(_arrays_equal(x, y) for x, y in zip(compiler.batches(good, 4, num_workers=2),
                                                   compiler.batches(good, 4), strict=True))


@pytest.mark.skipif(not background.uses_processes(), reason="worker processes need fork")
def test_a_dead_worker_raises_instead_of_hanging():
    compiler = _model()
    data = [[1.0] * 50] * 400
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="worker process died"):
        for i, _ in enumerate(compiler.batches(data, 4, num_workers=2)):
            if i == 1:
                for child in multiprocessing.active_children():
                    os.kill(child.pid, signal.SIGKILL)
    assert time.monotonic() - start < 60


@pytest.mark.skipif(not background.uses_processes(), reason="worker processes need fork")
def test_a_worker_killed_halfway_through_sending_a_batch_raises(monkeypatch):
    # Batches far larger than a pipe's buffer: while the consumer is not
    # reading, each worker blocks halfway through writing its next batch.
    # Killing it there leaves half a message, which must read as a dead
    # worker (ProcessPoolExecutor's result thread hung on this forever).
    monkeypatch.setattr(layouts, "PLAN_AHEAD", 2)
    compiler = _model()
    data = [[1.0] * 50_000] * (4 * (layouts.PLAN_AHEAD + 4))
    assert len(pickle.dumps(compiler.build_batch(data[:4]))) > 4 * 2**20
    gen = compiler.batches(data, 4, num_workers=2)
    for _ in range(layouts.PLAN_AHEAD):  # the first layout is planned from PLAN_AHEAD batches, read at once
        next(gen)
    workers = [p for p in multiprocessing.active_children() if p.name == "fold-batch-builder"]
    assert len(workers) == 2
    time.sleep(3.0)  # both workers build their next batch and block writing it
    for p in workers:
        os.kill(p.pid, signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="worker process died .exit code -9"):
        next(gen)
    assert time.monotonic() - start < 30
    gen.close()


class _TwoArgError(Exception):
    def __init__(self, what, where):  # pickles, but cannot be unpickled from its one-element args
        super().__init__(f"{what} at {where}")


def _raise_two_arg_error(x):
    if x == 13.0:
        raise _TwoArgError("bad thirteen", "leaf")
    return x


def test_an_exception_that_cannot_travel_arrives_as_runtime_error_with_its_message():
    compiler = fd.Compiler.create(fd.Map(fd.InputTransform(_raise_two_arg_error) >> fd.Scalar()) >> fd.Sum())
    with pytest.raises((RuntimeError, _TwoArgError), match="bad thirteen at leaf") as info:
        list(compiler.batches([[1.0], [2.0], [13.0]], 1, num_workers=2))
    if background.uses_processes():
        assert info.type is RuntimeError and "_TwoArgError" in str(info.value)
        assert "Traceback" in str(info.value.__cause__)  # the worker's traceback comes along


@pytest.mark.skipif(not background.uses_processes(), reason="worker processes need fork")
def test_leaving_early_shuts_the_workers_down():
    compiler = _model()
    before = {p.pid for p in multiprocessing.active_children()}
    gen = compiler.batches([[1.0]] * 400, 4, num_workers=2)
    next(gen)
    workers = {p.pid for p in multiprocessing.active_children()} - before
    assert len(workers) == 2
    gen.close()
    assert not workers & {p.pid for p in multiprocessing.active_children()}


def _builders() -> set[int]:
    return {p.pid for p in multiprocessing.active_children() if p.name == "fold-batch-builder"}


@pytest.mark.skipif(not background.uses_processes(), reason="worker processes need fork")
def test_a_finished_stream_keeps_its_workers_for_the_next_call():
    # Forking costs the parent copy-on-write faults on its whole heap: once per compiler, not per
    # epoch. The next call's examples were made after the fork, so they must travel to the workers.
    compiler = _model()
    before = _builders()
    first = list(compiler.batches([[1.0, 2.0]] * 12, 4, num_workers=2))
    assert len(first) == 3
    workers = _builders() - before
    assert len(workers) == 2
    later = [[float(i)] * (i % 4) for i in range(33)]
    stream = compiler.batches(later, 4, num_workers=2)
    got = [next(stream)]
    assert _builders() - before == workers  # the same processes, no new fork
    got += list(stream)
    assert all(_arrays_equal(x, y) for x, y in zip(got, compiler.batches(later, 4), strict=True))
    # Asking for another number of workers replaces them.
    list(compiler.batches(later, 4, num_workers=1))
    assert len(_builders() - before) == 1 and not workers & _builders()


@pytest.mark.skipif(not background.uses_processes(), reason="worker processes need fork")
def test_kept_workers_stop_with_their_compiler():
    compiler = _model()
    before = _builders()
    list(compiler.batches([[1.0]] * 8, 4, num_workers=2))
    workers = _builders() - before
    assert len(workers) == 2
    del compiler
    gc.collect()
    assert not workers & _builders()


@pytest.mark.skipif(not background.uses_processes(), reason="worker processes need fork")
def test_examples_that_cannot_be_pickled_raise_a_clear_error():
    compiler = fd.Compiler.create(fd.Map(fd.InputTransform(lambda f: f()) >> fd.Scalar()) >> fd.Sum())
    data = [[lambda: 1.0, lambda: 2.0]] * 4
    with pytest.raises(TypeError, match="batch 0's examples cannot be pickled.*num_workers=0"):
        list(compiler.batches(data, 2, num_workers=1))
    batch = next(compiler.batches(data, 2))
    np.testing.assert_allclose(compiler.apply(compiler.init(jax.random.key(0)), batch).outputs, [3.0, 3.0])


def test_large_examples_and_large_batches_do_not_block_each_other():
    # Chunks of examples and built batches both far larger than a pipe's buffer: a worker blocked
    # writing a batch while the consumer is blocked writing it examples deadlocked.
    compiler = _model()
    data = [[float(i)] * 50_000 for i in range(16)]
    got = list(compiler.batches(data, 2, num_workers=2))
    assert all(_arrays_equal(x, y) for x, y in zip(got, compiler.batches(data, 2), strict=True))


class _Unpicklable(ValueError):
    """A user's exception whose constructor takes two arguments: pickling rebuilds it with one."""

    def __init__(self, what: str, where: str):
        super().__init__(f"{what} at {where}")


class _Odd(Exception):
    def __init__(self, a: int, b: int):
        super().__init__(a + b)


def _raise_unpicklable(x: float) -> float:
    if x > 1:
        raise _Unpicklable("bad value", "here")
    if x < 0:
        raise _Odd(1, 2)
    return x


@pytest.mark.skipif(not background.uses_processes(), reason="worker processes need fork")
@pytest.mark.parametrize("bad, cls, fragments", [
    (5.0, ValueError, ["_Unpicklable: example 5 (position 1 in its batch): at InputTransform: bad value at here"]),
    (-1.0, RuntimeError, ["_Odd: 3", "example 5 (position 1 in its batch): at InputTransform"]),
])
def test_an_exception_a_worker_cannot_send_keeps_its_kind_message_index_and_path(bad, cls, fragments):
    compiler = fd.Compiler.create(fd.InputTransform(_raise_unpicklable) >> fd.Scalar())
    data = [1.0] * 5 + [bad] + [1.0] * 2
    with pytest.raises(cls) as info:
        list(compiler.batches(data, 4, num_workers=1))
    assert all(f in str(info.value) for f in fragments), str(info.value)


# ------------------------------------------------------------ one thread of the caller's process


def _thread_recording_model(threads: list) -> fd.Compiler:
    def note(x):
        threads.append(threading.current_thread())
        return x
    return fd.Compiler.create(fd.Map(fd.InputTransform(note) >> fd.Scalar()) >> fd.Sum())


def test_without_workers_a_thread_builds_the_same_batches_in_order():
    threads: list = []
    compiler = _thread_recording_model(threads)
    data = [[float(i)] * (i % 7) for i in range(101)]
    in_caller = list(compiler.batches(data, 8, prefetch=False))
    assert threads and all(t is threading.main_thread() for t in threads)
    threads.clear()
    ahead = list(compiler.batches(data, 8))
    assert threads and all(t is not threading.main_thread() for t in threads)
    assert len(ahead) == len(in_caller) == 13
    assert all(_arrays_equal(a, b) for a, b in zip(ahead, in_caller))
    assert [b.example_indices.tolist() for b in ahead] == [list(range(i, min(i + 8, 101))) for i in range(0, 101, 8)]


def test_the_thread_builds_the_next_batch_while_the_caller_holds_one(monkeypatch):
    monkeypatch.setattr(layouts, "PLAN_AHEAD", 1)  # the first layout is planned from the first batch alone
    threads: list = []
    compiler = _thread_recording_model(threads)
    gen = compiler.batches([[1.0]] * 40, 4)
    next(gen)
    deadline = time.monotonic() + 30
    while len(threads) < 8 and time.monotonic() < deadline:  # the second batch's 4 examples, unasked
        time.sleep(0.01)
    assert len(threads) >= 8
    gen.close()


def test_a_bad_example_built_on_the_thread_raises_in_the_caller_naming_its_index():
    compiler = _model()
    data = [[1.0]] * 20 + [[1.0, "x"]] + [[2.0]] * 20
    got = []
    with pytest.raises(ValueError, match=r"example 20 \(position 0 in its batch\): at Map.1. > Scalar: expected"):
        for batch in compiler.batches(data, 4):
            got.append(batch)
    assert len(got) == 5


def test_leaving_early_stops_the_thread():
    compiler = _model()
    before = threading.active_count()
    gen = compiler.batches([[1.0] * 100] * 400, 4)
    next(gen)
    assert threading.active_count() > before
    gen.close()
    assert threading.active_count() == before


def test_builds_on_two_threads_pause_the_collector_until_the_last_ends():
    assert gc.isenabled()
    first, second = builder.gc_paused(), builder.gc_paused()
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)
    assert not gc.isenabled()  # the second build is still under way
    second.__exit__(None, None, None)
    assert gc.isenabled()


def _report_gc(conn) -> None:
    with builder.gc_paused():
        pass
    conn.send(gc.isenabled())


@pytest.mark.skipif(not background.uses_processes(), reason="needs fork")
def test_a_worker_forked_during_a_build_on_another_thread_collects_garbage():
    started, release = threading.Event(), threading.Event()

    def build() -> None:
        with builder.gc_paused():
            started.set()
            release.wait()

    thread = threading.Thread(target=build)
    thread.start()
    started.wait()
    try:
        mine, theirs = multiprocessing.get_context("fork").Pipe()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # JAX warns about forking a threaded process
            child = multiprocessing.get_context("fork").Process(target=_report_gc, args=(theirs,))
            child.start()
        assert mine.poll(30) and mine.recv() is True
        child.join()
    finally:
        release.set()
        thread.join()
    assert gc.isenabled()


_CONSUMER = """
import sys, time
import fold as fd
compiler = fd.Compiler.create(fd.Map(fd.Scalar() >> fd.Function(lambda x: x * 3.0)) >> fd.Sum())
batches = compiler.batches([[1.0] * 50] * 4000, 4, num_workers=2)
next(batches)
import multiprocessing
print(*[p.pid for p in multiprocessing.active_children()], flush=True)
time.sleep(600)
"""


@pytest.mark.skipif(not background.uses_processes(), reason="worker processes need fork")
def test_workers_exit_when_their_consumer_is_killed(tmp_path):
    """Each worker kept its consumer's end of its own pipe open, so a consumer killed by SIGKILL
    left workers that never saw an end of file, never exited, and held the consumer's stdout
    open: whatever read that output waited forever."""
    import subprocess
    import sys

    script = tmp_path / "consumer.py"
    script.write_text(_CONSUMER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(p) for p in map(os.path.abspath, ["."])])}
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            env=env, cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    assert proc.stdout is not None
    workers = [int(pid) for pid in proc.stdout.readline().split()]
    assert len(workers) == 2
    proc.kill()
    proc.wait()
    start = time.monotonic()
    for pid in workers:
        while time.monotonic() - start < 30:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        else:
            for orphan in workers:
                os.kill(orphan, signal.SIGKILL)
            pytest.fail(f"worker {pid} outlived its consumer by 30 s")
    assert proc.stdout.read() == b""  # returns once no process holds the pipe's writing end


@pytest.mark.skipif(not background.uses_processes(), reason="worker processes need fork")
def test_a_stopped_worker_raises_instead_of_blocking_forever(monkeypatch):
    monkeypatch.setattr(background, "STOPPED_SECONDS", 1.5)
    compiler = _model()
    gen = compiler.batches([[1.0] * 50] * 400, 4, num_workers=2)
    before = _builders()
    next(gen)
    # This stream's workers only: idle ones that other tests' compilers keep are not this stream's to stop.
    workers = [p for p in multiprocessing.active_children() if p.name == "fold-batch-builder" and p.pid not in before]
    for p in workers:
        os.kill(p.pid, signal.SIGSTOP)
    start = time.monotonic()
    try:
        with pytest.raises(RuntimeError, match=r"worker process \d+ has been stopped .*kill -CONT"):
            for _ in gen:
                pass
        assert time.monotonic() - start < 30
    finally:
        gen.close()  # kills the stopped workers
    assert not any(p.is_alive() for p in workers)


@pytest.mark.skipif(not background.uses_processes(), reason="worker processes need fork")
def test_a_batch_that_cannot_travel_back_says_so():
    """A labeled metric whose label does not pickle killed the worker sending its batch: the
    consumer read "worker died (killed, or out of memory?)"."""
    label = fd.InputTransform(lambda name: threading.Lock())  # made in the worker: the examples pickle
    compiler = fd.Compiler.create(fd.Map(fd.Record((fd.Scalar(), label)) >> fd.Metric("m")) >> fd.Void())
    examples = [[(1.0, "a")]] * 8
    assert isinstance(compiler.build_batch(examples[:4]).metric_labels["m"][0], type(threading.Lock()))
    with pytest.raises(TypeError, match=r"sends each built batch back .* cannot be pickled .* labeled Metric"):
        list(compiler.batches(examples, 4, num_workers=2))


def _exit_on_seven(x):
    if x == 7.0:
        sys.exit(3)
    return x


@pytest.mark.skipif(not background.uses_processes(), reason="worker processes need fork")
def test_sys_exit_in_a_users_function_reaches_the_consumer_as_in_this_process():
    compiler = fd.Compiler.create(fd.Map(fd.InputTransform(_exit_on_seven) >> fd.Scalar()) >> fd.Sum())
    examples = [[float(i)] for i in range(12)]
    for workers in (0, 2):
        with pytest.raises(SystemExit) as e:
            list(compiler.batches(examples, 4, num_workers=workers))
        assert e.value.code == 3


@pytest.mark.skipif(not background.uses_processes(), reason="worker processes need fork")
def test_a_stream_left_open_at_exit_stops_its_workers_quietly(tmp_path):
    """Regression: a stream still holding workers when the interpreter exited stopped them while
    multiprocessing was being torn down (AttributeError: 'NoneType' object has no attribute
    'dumps', printed at every exit of a script that stopped reading its batches)."""
    script = tmp_path / "left_open.py"
    script.write_text(
        "import fold as fd\n"
        "compiler = fd.Compiler.create(fd.Map(fd.Scalar() >> fd.Function(lambda x: x * 3.0)) >> fd.Sum())\n"
        "stream = compiler.batches([[1.0]] * 400, 4, num_workers=2)\n"
        "next(stream)\n"
        "print('read one batch')\n")
    # The checkout under test, as the tests import it (not whatever fold the interpreter has installed).
    root = pathlib.Path(fd.__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(root)})
    assert done.returncode == 0, done.stderr
    assert "read one batch" in done.stdout
    assert "Traceback" not in done.stderr and "Error" not in done.stderr, done.stderr
