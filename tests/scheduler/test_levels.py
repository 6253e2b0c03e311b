"""Loop steps (``fold/scheduler/levels.py``): valid orders with fewer groups than depths make."""

from __future__ import annotations

import random
from collections import Counter

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fold as fd
from fold.schedule_plot import schedule_profile
from fold.scheduler.levels import loop_steps


def _random_dag(rng: np.random.Generator, nodes: int, ops: int) -> tuple[np.ndarray, ...]:
    """A random DAG in topological order: ``(n_op, depth, producer, consumer, loop)``, each node
    reading 0-3 earlier nodes (sometimes one twice), the loop nodes those above depth 1."""
    n_op = rng.integers(0, ops, nodes)
    producer, consumer = [], []
    for c in range(1, nodes):
        for p in rng.integers(max(0, c - 12), c, rng.integers(0, 4)):
            producer.append(p)
            consumer.append(c)
    producer, consumer = np.asarray(producer, np.int64), np.asarray(consumer, np.int64)
    depth = np.ones(nodes, np.int64)
    for p, c in zip(producer, consumer):
        depth[c] = max(depth[c], depth[p] + 1)
    return n_op, depth, producer, consumer, depth > 1


def _groups(n_op: np.ndarray, level: np.ndarray, loop: np.ndarray) -> int:
    return len(set(zip(level[loop].tolist(), n_op[loop].tolist())))


@pytest.mark.parametrize("seed", range(40))
def test_steps_keep_every_input_before_its_reader_and_make_no_more_groups(seed):
    rng = np.random.default_rng(seed)
    n_op, depth, producer, consumer, loop = _random_dag(rng, int(rng.integers(2, 300)), int(rng.integers(1, 5)))
    steps, last = loop_steps(n_op, depth, producer, consumer, loop)
    assert np.all(steps[producer] < steps[consumer])
    np.testing.assert_array_equal(steps[~loop], depth[~loop])
    assert np.all(steps[loop] >= 2) and last == steps[loop].max(initial=1)
    assert _groups(n_op, steps, loop) <= _groups(n_op, depth, loop)
    if steps is not depth:  # the steps replaced the depths: one operation per step
        assert _groups(n_op, steps, loop) == len(np.unique(steps[loop]))


def test_one_operation_per_depth_keeps_the_depths():
    # Two chains of one operation each, interleaved at depths: 0 -> 1 -> 2 (op 0), 3 -> 4 (op 0).
    n_op = np.zeros(5, np.int64)
    depth = np.array([1, 2, 3, 1, 2])
    steps, last = loop_steps(n_op, depth, np.array([0, 1, 3]), np.array([1, 2, 4]), depth > 1)
    assert steps is depth and last == 3


def test_an_operation_waits_for_its_wave():
    # Sums of 1, 2, 4 and 8 elements (balanced trees of adds, op 1, of heights 0 to 3), each read
    # by a layer (op 2) whose outputs a chain (op 3) reads in turn. Depths put the layer on four
    # depths; the steps run every add level, then the layer once, then the chain.
    n_op, producer, consumer = [], [], []

    def node(op, *inputs):
        n_op.append(op)
        for i in inputs:
            producer.append(i)
            consumer.append(len(n_op) - 1)
        return len(n_op) - 1

    def total(xs):
        return xs[0] if len(xs) == 1 else node(1, total(xs[:len(xs) // 2]), total(xs[len(xs) // 2:]))

    layers = [node(2, total([node(0) for _ in range(n)])) for n in (1, 2, 4, 8)]
    state = node(0)
    for layer in layers:
        state = node(3, state, layer)
    n_op, producer, consumer = (np.asarray(a, np.int64) for a in (n_op, producer, consumer))
    depth = np.ones(len(n_op), np.int64)
    for p, c in zip(producer, consumer):
        depth[c] = max(depth[c], depth[p] + 1)
    loop = depth > 1
    steps, _ = loop_steps(n_op, depth, producer, consumer, loop)
    assert len({d for d, o in zip(depth[loop], n_op[loop]) if o == 2}) == 4
    ops_by_step = [sorted(set(n_op[steps == s].tolist())) for s in range(2, steps.max() + 1)]
    assert ops_by_step == [[1], [1], [1], [2], [3], [3], [3], [3]]


def _sums_into_a_chain(width: int) -> fd.Block:
    """Each example a list of lists of 2-vectors: each inner list summed and put through ``inner``,
    then folded left to right by ``cell`` on the concatenated (state, element)."""
    inner = fd.Map(fd.Vector(2)) >> fd.Sum() >> fd.FC(width, activation="tanh", name="inner")
    cell = fd.Concat() >> fd.FC(width, activation="tanh", name="cell")
    return fd.Map(inner) >> fd.Fold(cell, fd.Zeros(width))


def _reference(p: dict, example: list) -> jax.Array:
    """The model on one example in plain JAX."""
    state = jnp.zeros(p["cell"]["b"].shape)
    for xs in example:
        x = jnp.tanh(jnp.sum(jnp.asarray(xs, jnp.float32), 0) @ p["inner"]["w"] + p["inner"]["b"])
        state = jnp.tanh(jnp.concatenate([state, x]) @ p["cell"]["w"] + p["cell"]["b"])
    return state


def _examples(rng: random.Random, n: int) -> list:
    return [[[[rng.uniform(-1, 1), rng.uniform(-1, 1)] for _ in range(rng.randint(1, 9))]
             for _ in range(rng.randint(2, 6))] for _ in range(n)]


def test_a_layer_after_sums_of_different_lengths_runs_in_one_group_and_stays_exact():
    compiler = fd.Compiler.create(_sums_into_a_chain(3))
    examples = _examples(random.Random(0), 12)
    groups, _ = schedule_profile(compiler, examples)
    layer = next(o for o, op in enumerate(compiler.program.ops) if getattr(op.spec.layer, "name", None) == "inner")
    loop_groups = Counter(g.op for g in groups if g.stage == "loop")
    # The sums' heights reach 4 levels of adds: depths would run the layer at up to 5 depths.
    assert loop_groups[layer] == 1
    params = compiler.init(jax.random.key(0))
    out = jax.jit(compiler.apply)(params, compiler.build_batch(examples)).outputs
    np.testing.assert_allclose(out, [_reference(params, e) for e in examples], rtol=1e-5, atol=1e-6)


def test_gradients_through_merged_groups_match_the_reference():
    compiler = fd.Compiler.create(_sums_into_a_chain(3))
    examples = _examples(random.Random(1), 6)
    params = compiler.init(jax.random.key(1))
    batch = compiler.build_batch(examples)
    got = jax.jit(jax.grad(lambda p: compiler.apply(p, batch).outputs.sum()))(params)

    want = jax.grad(lambda p: sum(_reference(p, e).sum() for e in examples))(params)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)

