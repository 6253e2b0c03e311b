"""Batch builders run nicer than the training loop: the thread and worker processes of
``compiler.batches`` add ``FOLD_BUILD_NICENESS`` (default ``BUILD_NICENESS``) to their niceness."""

from __future__ import annotations

import gc
import logging
import os
import re
import sys
import threading
import time

import jax
import numpy as np
import pytest

import fold as fd
from fold.scheduler import priority

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a thread's own niceness is Linux's")


def _niceness() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


def _expected(added: int) -> int:
    return min(19, _niceness() + added)


def _builders_niceness(batches: int = 1, pause: float = 0.0, **batches_kwargs) -> list[float]:
    """Per batch of one example, the niceness of the thread that walked it (read by the model's
    host code into the batch's constant), the loop pausing ``pause`` seconds after each batch as a
    step would."""
    compiler = fd.Compiler.create(fd.InputTransform(lambda _: float(_niceness())) >> fd.Scalar())
    seen = []
    for b in compiler.batches(range(batches), 1, **batches_kwargs):
        (constants,) = b.arrays.consts.values()
        seen.append(float(constants[0]))
        time.sleep(pause)
    del compiler
    gc.collect()  # stops the compiler's idle workers now: other tests count the live ones
    return seen


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _pace(pacer: priority.Pacer, clock: _Clock, busy: float, idle: float, builds: int) -> None:
    for _ in range(builds):
        clock.now += idle
        pacer.started()
        clock.now += busy
        pacer.finished()


def test_the_default_niceness_and_the_variable(monkeypatch):
    monkeypatch.delenv(priority.ENV, raising=False)
    assert priority.build_niceness() == priority.BUILD_NICENESS == 10
    for value, expected in (("0", 0), ("7", 7), (" 19", 19)):
        monkeypatch.setenv(priority.ENV, value)
        assert priority.build_niceness() == expected


@pytest.mark.parametrize("value", ["-1", "20", "high", "", "1.5"])
def test_a_malformed_variable_is_a_clear_error(monkeypatch, value):
    monkeypatch.setenv(priority.ENV, value)
    with pytest.raises(ValueError, match=r"FOLD_BUILD_NICENESS must be an integer from 0 .* to 19"):
        priority.build_niceness()
    compiler = fd.Compiler.create(fd.Scalar())
    for kwargs in ({}, {"num_workers": 1}):
        with pytest.raises(ValueError, match="FOLD_BUILD_NICENESS"):
            next(iter(compiler.batches([1.0, 2.0], 1, **kwargs)))


@linux
def test_lower_priority_changes_the_calling_thread_only():
    before = _niceness()
    seen = {}

    def run() -> None:
        priority.lower_priority(3)
        seen["after"] = _niceness()
        priority.lower_priority(100)  # capped at 19
        seen["capped"] = _niceness()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert seen == {"after": min(19, before + 3), "capped": 19}
    assert _niceness() == before
    priority.lower_priority(0)  # nothing to do, even here
    assert _niceness() == before


@pytest.mark.parametrize("busy, idle, lowered", [(1.0, 9.0, True), (3.0, 5.0, True), (4.0, 6.0, False),
                                                (5.0, 5.0, False), (1.0, 0.0, False)])
def test_a_builder_with_time_to_spare_lowers_its_priority_once(monkeypatch, caplog, busy, idle, lowered):
    calls = []
    monkeypatch.setattr(priority, "lower_priority", calls.append)
    clock = _Clock()
    pacer = priority.Pacer(7, clock)
    with caplog.at_level(logging.INFO, logger="fold"):
        _pace(pacer, clock, busy, idle, priority.WINDOW - 1)
        assert calls == [] and not pacer.lowered  # too few batches to tell
        _pace(pacer, clock, busy, idle, 3 * priority.WINDOW)
    assert calls == ([7] if lowered else []) and pacer.lowered == lowered
    said = [r.getMessage() for r in caplog.records if "time to spare" in r.getMessage()]
    assert len(said) == lowered
    assert all(re.fullmatch(r"fold: the batch builder has time to spare \(busy \d+ % of its last 8 batches\): it "
                            r"runs 7 nicer", m) for m in said)


def test_busy_batches_first_then_time_to_spare(monkeypatch):
    """A stream's first batches are built back to back (before the first step): only the last
    ``WINDOW`` batches count."""
    calls = []
    monkeypatch.setattr(priority, "lower_priority", calls.append)
    clock = _Clock()
    pacer = priority.Pacer(5, clock)
    _pace(pacer, clock, 1.0, 0.0, 20)
    _pace(pacer, clock, 1.0, 9.0, 1)  # 8 s busy in 17
    assert calls == []
    _pace(pacer, clock, 1.0, 9.0, priority.WINDOW)
    assert calls == [5]
    assert priority.Pacer(0, clock).lowered  # nothing to lower: never calls


@linux
@pytest.mark.parametrize("kwargs", [{}, {"num_workers": 1}], ids=["thread", "worker process"])
def test_a_builder_that_waits_on_the_loop_becomes_nicer(monkeypatch, kwargs):
    monkeypatch.delenv(priority.ENV, raising=False)
    base = _niceness()
    seen = _builders_niceness(3 * priority.WINDOW, pause=0.02, **kwargs)
    assert seen[:priority.WINDOW] == [base] * priority.WINDOW
    assert seen[-1] == _expected(priority.BUILD_NICENESS)
    monkeypatch.setenv(priority.ENV, "3")
    assert _builders_niceness(3 * priority.WINDOW, pause=0.02, **kwargs)[-1] == _expected(3)
    monkeypatch.setenv(priority.ENV, "0")
    assert set(_builders_niceness(3 * priority.WINDOW, pause=0.02, **kwargs)) == {base}


def test_batches_built_in_the_caller_keep_its_priority(monkeypatch):
    monkeypatch.setenv(priority.ENV, "5")
    assert set(_builders_niceness(3 * priority.WINDOW, pause=0.02, prefetch=False)) == {_niceness()}
    compiler = fd.Compiler.create(fd.InputTransform(lambda _: float(_niceness())) >> fd.Scalar())
    batch = compiler.build_batch(range(2))
    params = compiler.init(jax.random.key(0))
    assert np.asarray(compiler.apply(params, batch).outputs).tolist() == [_niceness()] * 2
