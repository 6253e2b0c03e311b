"""``benchmarks.common``: ``interleaved_medians`` (turns, untimed calls, settling) and the train step."""

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


def test_a_donating_train_step_updates_in_place_to_the_same_values():
    import jax
    import numpy as np
    import optax

    import fold as fd

    compiler = fd.Compiler.create(fd.Map(fd.Vector(3) >> fd.FC(2) >> fd.Function(lambda y: y.sum(-1))
                                         >> fd.Metric("loss")) >> fd.Void())
    batch = compiler.build_batch([[[1.0, 2.0, 3.0], [0.5, -1.0, 2.0]], [[0.0, 1.0, -1.0]]])
    optimizer = optax.adam(0.1)
    params = compiler.init(jax.random.key(0))
    expected = common.make_train_step(compiler, optimizer)(params, optimizer.init(params), batch, None)
    mine = jax.tree_util.tree_map(np.array, params)
    given = jax.tree_util.tree_map(jax.numpy.asarray, mine)
    got = common.make_train_step(compiler, optimizer, donate=True)(given, optimizer.init(given), batch, None)
    for a, b in zip(jax.tree_util.tree_leaves(expected), jax.tree_util.tree_leaves(got)):
        np.testing.assert_array_equal(a, b)
    assert all(leaf.is_deleted() for leaf in jax.tree_util.tree_leaves(given))
