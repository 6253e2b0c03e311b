"""``benchmarks.common.interleaved_medians``: turns, untimed calls, settling."""

from __future__ import annotations

from benchmarks import common


def test_each_round_times_one_call_after_an_untimed_one():
    calls: list[str] = []
    medians = common.interleaved_medians({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")},
                                         repeats=3, warmup=1)
    assert calls == ["a", "b"] + ["a", "a", "b", "b"] * 3
    assert set(medians) == {"a", "b"} and all(m >= 0 for m in medians.values())


def test_settle_repeats_the_untimed_calls_until_they_have_run_that_long(monkeypatch):
    clock = [0.0]  # a clock the calls advance, so the counts do not depend on the machine's load
    monkeypatch.setattr(common.time, "perf_counter", lambda: clock[0])
    calls = {"slow": 0, "fast": 0}

    def call(name: str, seconds: float) -> None:
        calls[name] += 1
        clock[0] += seconds

    ms = 2.0 ** -10  # about a millisecond, exact in binary: the clock's sums are exact
    medians = common.interleaved_medians({"slow": lambda: call("slow", 20 * ms), "fast": lambda: call("fast", ms)},
                                         repeats=2, settle=10 * ms)
    # A call longer than the settling time runs untimed once a round, as without settling.
    assert calls["slow"] == 2 * 2
    # A 1 ms call repeats until 10 ms have passed (10 calls), then comes its timed call.
    assert calls["fast"] == 2 * (10 + 1)
    assert medians == {"slow": 20 * ms, "fast": ms}
