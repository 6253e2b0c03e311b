"""Batch builders run nicer than the training loop: the thread and worker processes of
``compiler.batches`` add ``FOLD_BUILD_NICENESS`` (default ``BUILD_NICENESS``) to their niceness."""

from __future__ import annotations

import os
import sys
import threading

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


def _builders_niceness(**batches_kwargs) -> list[float]:
    """Per example, the niceness of the thread that walked it (read by the model's host code)."""
    compiler = fd.Compiler.create(fd.InputTransform(lambda _: float(_niceness())) >> fd.Scalar())
    params = compiler.init(jax.random.key(0))
    return [float(v) for b in compiler.batches(range(6), 3, **batches_kwargs)
            for v in np.asarray(compiler.apply(params, b).outputs)]


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


@linux
@pytest.mark.parametrize("kwargs", [{}, {"num_workers": 1}], ids=["thread", "worker process"])
def test_batches_are_built_nicer_than_the_caller(monkeypatch, kwargs):
    monkeypatch.delenv(priority.ENV, raising=False)
    assert _builders_niceness(**kwargs) == [_expected(priority.BUILD_NICENESS)] * 6
    monkeypatch.setenv(priority.ENV, "4")
    assert _builders_niceness(**kwargs) == [_expected(4)] * 6
    monkeypatch.setenv(priority.ENV, "0")
    assert _builders_niceness(**kwargs) == [_niceness()] * 6


def test_batches_built_in_the_caller_keep_its_priority(monkeypatch):
    monkeypatch.setenv(priority.ENV, "5")
    assert _builders_niceness(prefetch=False) == [_niceness()] * 6
    compiler = fd.Compiler.create(fd.InputTransform(lambda _: float(_niceness())) >> fd.Scalar())
    batch = compiler.build_batch(range(2))
    assert np.asarray(compiler.apply(compiler.init(jax.random.key(0)), batch).outputs).tolist() == [_niceness()] * 2
