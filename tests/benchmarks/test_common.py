"""``benchmarks.common.interleaved_medians``: turns, untimed calls, settling."""

from __future__ import annotations

import time

from benchmarks.common import interleaved_medians


def test_each_round_times_one_call_after_an_untimed_one():
    calls: list[str] = []
    medians = interleaved_medians({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, repeats=3,
                                  warmup=1)
    assert calls == ["a", "b"] + ["a", "a", "b", "b"] * 3
    assert set(medians) == {"a", "b"} and all(m >= 0 for m in medians.values())


def test_settle_repeats_the_untimed_calls_until_they_have_run_that_long():
    calls = {"slow": 0, "fast": 0}

    def slow() -> None:
        calls["slow"] += 1
        time.sleep(0.02)

    def fast() -> None:
        calls["fast"] += 1
        time.sleep(0.001)

    medians = interleaved_medians({"slow": slow, "fast": fast}, repeats=2, settle=0.01)
    # The slow call's untimed run lasts past the settling time: one untimed call a round, as without it.
    assert calls["slow"] == 2 * 2
    # The fast one repeats until 10 ms have passed (at least 10 calls of 1 ms), then its timed call.
    assert calls["fast"] >= 2 * (10 + 1)
    assert medians["slow"] >= 0.02 and medians["fast"] < 0.02
