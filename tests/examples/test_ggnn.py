"""The GGNN example: fold's shared (node, round) states against the dense segment_sum network."""

from __future__ import annotations

import json
import random

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fold as fd
from examples import ggnn

ROUNDS, HIDDEN = 3, 8


def _graphs(n: int = 5) -> list[ggnn.Graph]:
    return ggnn.make_data(random.Random(0), n, (4, 12), 0.5, ROUNDS)


def test_graphs_have_cycles_and_labels_are_distances():
    graphs = _graphs(20)
    # A tree has n - 1 edges: more close cycles (a random extra edge may repeat a tree edge).
    assert sum(sum(len(k) for k in g.neighbours) // 2 >= len(g.neighbours) for g in graphs) >= 15
    for g in graphs:
        assert g.labels[g.source] == 0
        for v, kids in enumerate(g.neighbours):
            assert v not in kids
            if v != g.source and g.labels[v] <= ROUNDS:
                assert min(g.labels[u] for u in kids) == g.labels[v] - 1


def test_losses_and_gradients_equal_the_dense_segment_sum_network():
    graphs = _graphs()
    compiler = fd.Compiler.create(ggnn.build_model(HIDDEN, ROUNDS))
    params = compiler.init(jax.random.key(0))
    batch = compiler.build_batch(graphs)
    # One state per (node, round), whatever the paths: per node an embedding, per node and round
    # deg - 1 additions, a message layer and a GRU call, per node the readout, its loss and its hit.
    assert batch.stats.num_nodes == sum(1 + ROUNDS * (len(kids) + 1) + 3 for g in graphs for kids in g.neighbours)
    dense = ggnn.dense_graphs(graphs)

    # Jitted, as training runs them: eager, every op of the step dispatches on its own.
    losses = jax.jit(compiler.apply)(params, batch).metrics["loss"].values
    np.testing.assert_allclose(losses, ggnn.dense_losses(params, dense, ROUNDS)[0], rtol=1e-5, atol=1e-6)
    got = jax.jit(jax.grad(lambda p, b: compiler.apply(p, b).metrics["loss"].sum()))(params, batch)
    want = jax.jit(jax.grad(lambda p: jnp.sum(ggnn.dense_losses(p, dense, ROUNDS)[0])))(params)
    for layer in want:
        for name in want[layer]:
            np.testing.assert_allclose(got[layer][name], want[layer][name], rtol=1e-4, atol=1e-6,
                                       err_msg=f"{layer}/{name}")


def test_one_state_per_node_and_round():
    g = ggnn.Graph([[1, 2], [0, 2], [0, 1]], 0, [0, 1, 1])  # a triangle: every state read by two neighbours
    compiler = fd.Compiler.create(ggnn.build_model(HIDDEN, ROUNDS))
    stats = compiler.build_batch([g]).stats
    # Per node: an embedding; per node and round, one addition (two neighbours), a message layer
    # and a GRU call; per node, the readout, its loss and its hit.
    assert stats.num_nodes == 3 * (1 + 3 * ROUNDS + 3)


@pytest.mark.slow
def test_quick_run_learns(tmp_path):
    out = tmp_path / "ggnn.json"
    report = ggnn.main(["--quick", "--quiet", "--checkpoint-dir", str(tmp_path), "--json", str(out)])
    assert report["test_accuracy"] > report["majority_baseline"] + 0.2
    assert json.loads(out.read_text())["example"] == "ggnn"
