"""``benchmarks.loop_ops`` times loops of known bodies and counts the kernels of fold's loops."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import optax
import pytest
from jax import lax

import fold as fd
from benchmarks import loop_ops
from benchmarks.common import make_train_step


def test_kernels_are_counted_per_loop_and_branch():
    def f(x):
        def body(state):
            i, x = state
            y = lax.switch(i % 2, [lambda x: jnp.tanh(x) @ x, lambda x: x * 2.0], x)
            return i + 1, y

        return lax.while_loop(lambda s: s[0] < 3, body, (0, x))[1]

    text = jax.jit(f).lower(jnp.ones((4, 4))).compile().as_text()
    [loop] = loop_ops.loop_kernels(text)
    assert loop["phase"] == "forward"
    low, high = loop["branches"]
    assert 1 <= low <= high and high >= 2  # the matmul branch runs a tanh and a matmul
    assert loop["body"] >= 2  # the switch and the counter's increment


def test_a_training_step_has_a_forward_and_a_backward_loop():
    last = fd.Map(fd.Vector(3)) >> fd.Fold(fd.Concat() >> fd.FC(3, name="cell"), fd.Zeros(3))
    model = last >> fd.Function(lambda h: jnp.sum(h, axis=-1)) >> fd.Metric("loss")
    compiler = fd.Compiler.create(model)
    optimizer = optax.sgd(0.1)
    step = make_train_step(compiler, optimizer)
    params = compiler.init(jax.random.key(0))
    batch = compiler.build_batch([[[1.0, 2.0, 3.0]] * 5, [[0.5, 0.5, 0.5]] * 3])
    loops = loop_ops.loop_kernels(step.lower(params, optimizer.init(params), batch, None).compile().as_text())
    assert [lp["phase"] for lp in loops] == ["forward", "backward"]
    assert all(lp["body"] > 0 and lp["branches"][0] > 0 for lp in loops)


def test_the_layouts_run_and_are_counted():
    result = loop_ops.layout_items(repeats=1, rows=4, items=6)
    assert set(result) == {"per_type", "in_branch", "one_arena"}
    assert all(r["us_per_item"] > 0 and r["body"] > 0 and r["copies"] >= 0 for r in result.values())
    # Five chunk writes an item against one.
    assert result["per_type"]["body"] > result["one_arena"]["body"]


def test_known_bodies_take_time():
    assert loop_ops.loop_us(2, chained=True, rows=4, width=8, repeats=1) > 0
    assert loop_ops.loop_us(2, chained=False, rows=4, width=8, repeats=1) > 0


def test_the_item_and_its_parts_take_time():
    us = loop_ops.item_us(repeats=1, rows=4, iterations=3)
    assert set(us) == set(loop_ops.ITEM_PARTS) and min(us.values()) > 0


@pytest.mark.slow
def test_quick_run_writes_both_tables(tmp_path):
    result = loop_ops.main(["--quick", "--json", str(tmp_path / "l.json")])
    assert [(r["writes"], r["chained"]) for r in result["known_bodies"]] == [(1, False), (1, True), (4, False),
                                                                           (4, True)]
    assert set(result["layouts"]) == {"per_type", "in_branch", "one_arena"}
    threads = result["item_on_threads"]
    assert set(threads["threads"]) == set(loop_ops.ITEM_PARTS) and min(threads["threads"].values()) > 0
    if hasattr(os, "sched_setaffinity"):  # the child pinned to one core ran
        assert set(threads["one_core"]) == set(loop_ops.ITEM_PARTS) and min(threads["one_core"].values()) > 0
        assert threads["beyond_parts"]["one_core"] == pytest.approx(
            threads["one_core"]["whole"] - threads["one_core"]["matmuls"] - threads["one_core"]["rest"]
            + threads["one_core"]["neither"])
    assert [r["model"] for r in result["fold_items"]] == ["tagger", "sst"]
    for r in result["fold_items"]:
        assert [lp["phase"] for lp in r["loops"]] == ["forward", "backward"]
    assert (tmp_path / "l.json").exists() and (tmp_path / "l.png").exists()
