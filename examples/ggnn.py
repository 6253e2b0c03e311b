"""A gated graph neural network (Li et al. 2016) on graphs with cycles, written with ``fd.Shared``.

A node's state at round ``t`` reads its own state and the sum of its
neighbours' states at round ``t - 1``; every state is read by all its
neighbours, so the model is a DAG over ``(node, round)`` pairs with cycles
in the graph but none in the rounds. ``fd.Shared(..., key=(node, round))``
computes each pair once per graph, whatever the number of paths through it.
The same network written densely in plain JAX (``dense_losses``: gathers and
``segment_sum`` over the batch's edges, the usual way to batch graph
networks) is the reference: ``tests/examples/test_ggnn.py`` checks fold's
losses and gradients against it, and ``benchmarks/ggnn.py`` times both.

Task: random connected graphs with extra edges (so cycles), one node marked
as the source; every node predicts its distance from the source, ``0`` to
``rounds``, or "farther" (information travels one edge a round, so
``rounds`` rounds are exactly what the task needs). The report gives the
held-out per-node accuracy by distance against always predicting the most
common class.

Run: ``python -m examples.ggnn`` (``--quick`` for a few-second run).
"""

from __future__ import annotations

import argparse
import collections
import random
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

import fold as fd
from examples import common
from examples.common import COUNT, add_training_flags, number, print_table, write_report


class Graph(NamedTuple):
    """An undirected graph: each node's neighbours, the source, and each node's distance class."""

    neighbours: list[list[int]]
    source: int
    labels: list[int]


class NodeRound(NamedTuple):
    """The input of one state: node ``v`` of ``graph`` after ``t`` rounds (``Shared`` keys it by ``(v, t)``)."""

    graph: Graph
    v: int
    t: int


def random_graph(rng: random.Random, nodes: int, extra_edges: float, rounds: int) -> Graph:
    """A random tree over ``nodes`` nodes plus ``extra_edges * nodes`` random edges (cycles), a random
    source, and each node's label: its distance from the source, or ``rounds + 1`` if farther."""
    edges = {(rng.randrange(v), v) for v in range(1, nodes)}
    for _ in range(round(extra_edges * nodes)):
        a, b = rng.sample(range(nodes), 2)
        edges.add((min(a, b), max(a, b)))
    neighbours: list[list[int]] = [[] for _ in range(nodes)]
    for a, b in sorted(edges):
        neighbours[a].append(b)
        neighbours[b].append(a)
    source = rng.randrange(nodes)
    distance = {source: 0}
    queue = collections.deque([source])
    while queue:
        v = queue.popleft()
        for u in neighbours[v]:
            if u not in distance:
                distance[u] = distance[v] + 1
                queue.append(u)
    return Graph(neighbours, source, [min(distance[v], rounds + 1) for v in range(nodes)])


def make_data(rng: random.Random, n: int, nodes: tuple[int, int], extra_edges: float, rounds: int) -> list[Graph]:
    return [random_graph(rng, rng.randint(*nodes), extra_edges, rounds) for _ in range(n)]


def _is_source(s: NodeRound) -> list[float]:
    return [1.0, 0.0] if s.v == s.graph.source else [0.0, 1.0]


def _neighbours_before(s: NodeRound) -> list[NodeRound]:
    return [NodeRound(s.graph, u, s.t - 1) for u in s.graph.neighbours[s.v]]


def _final_states(g: Graph, rounds: int) -> list[NodeRound]:
    return [NodeRound(g, v, rounds) for v in range(len(g.neighbours))]


def _cross_entropy(logits: jax.Array, label: jax.Array) -> jax.Array:
    return -jnp.take_along_axis(jax.nn.log_softmax(logits), label[:, None], axis=-1)[:, 0]


def _correct(logits: jax.Array, label: jax.Array) -> jax.Array:
    return (jnp.argmax(logits, axis=-1) == label).astype(jnp.float32)


def build_model(hidden: int, rounds: int) -> fd.Block:
    """A graph -> void; metrics ``loss`` (cross-entropy) and ``correct`` per node, ``distance`` (its label)."""
    state = fd.ForwardDeclaration(fd.PyObjectType(), fd.TensorType((hidden,)))
    embed = fd.InputTransform(_is_source) >> fd.Vector(2) >> fd.FC(hidden, activation=jnp.tanh, name="embed")
    message = fd.InputTransform(_neighbours_before) >> fd.Map(state()) >> fd.Sum() \
        >> fd.FC(hidden, activation=None, name="message")
    before = fd.InputTransform(lambda s: NodeRound(s.graph, s.v, s.t - 1)) >> state()
    update = fd.AllOf(message, before) >> fd.GRUCell(hidden, name="gru") >> fd.GetItem(0)
    state.resolve_to(fd.Shared(fd.OneOf(lambda s: s.t == 0, {True: embed, False: update}),
                               key=lambda s: (s.v, s.t)))

    node = fd.Composition()
    with node.scope():
        logits = (state() >> fd.FC(rounds + 2, activation=None, name="readout")).reads(node.input)
        label = (fd.InputTransform(lambda s: s.graph.labels[s.v]) >> fd.Scalar("int32")).reads(node.input)
        fd.Metric("loss").reads(fd.Function(_cross_entropy).reads(logits, label))
        fd.Metric("correct").reads(fd.Function(_correct).reads(logits, label))
        fd.Metric("distance").reads(label)
        node.output.reads(fd.Void().reads(node.input))
    return fd.InputTransform(lambda g: _final_states(g, rounds)) >> fd.Map(node) >> fd.Void()


class DenseGraphs(NamedTuple):
    """A batch of graphs as one disjoint graph: what ``dense_losses`` reads."""

    features: np.ndarray  # [nodes, 2]: is the source, is not
    senders: np.ndarray   # [directed edges]: both directions of every edge
    receivers: np.ndarray
    labels: np.ndarray    # [nodes]


def dense_graphs(graphs: list[Graph]) -> DenseGraphs:
    features, senders, receivers, labels, offset = [], [], [], [], 0
    for g in graphs:
        for v, kids in enumerate(g.neighbours):
            features.append([1.0, 0.0] if v == g.source else [0.0, 1.0])
            senders += [offset + u for u in kids]
            receivers += [offset + v] * len(kids)
        labels += g.labels
        offset += len(g.neighbours)
    return DenseGraphs(np.asarray(features, np.float32), np.asarray(senders, np.int32),
                       np.asarray(receivers, np.int32), np.asarray(labels, np.int32))


def gru(p: dict, x: jax.Array, h: jax.Array) -> jax.Array:
    """``fd.GRUCell``'s update, written out."""
    r, z = jnp.split(jax.nn.sigmoid(jnp.concatenate([x, h], -1) @ p["w_gates"] + p["b_gates"]), 2, axis=-1)
    cand = jnp.tanh(jnp.concatenate([x, r * h], -1) @ p["w_cand"] + p["b_cand"])
    return z * h + (1.0 - z) * cand


def dense_losses(params: dict, graphs: DenseGraphs, rounds: int) -> tuple[jax.Array, jax.Array]:
    """Per-node cross-entropy and logits of the same network in plain JAX: messages gathered along
    the edges and summed per receiver with ``segment_sum``."""
    h = jnp.tanh(graphs.features @ params["embed"]["w"] + params["embed"]["b"])
    n = graphs.features.shape[0]
    for _ in range(rounds):
        summed = jax.ops.segment_sum(h[graphs.senders], graphs.receivers, num_segments=n)
        h = gru(params["gru"], summed @ params["message"]["w"] + params["message"]["b"], h)
    logits = h @ params["readout"]["w"] + params["readout"]["b"]
    return _cross_entropy(logits, jnp.asarray(graphs.labels)), logits


def per_node(compiler: fd.Compiler, params: dict, graphs: list[Graph]) -> tuple[np.ndarray, np.ndarray]:
    """Every node's ``correct`` and ``distance`` (the metrics record them in the same order)."""
    correct, distance = [], []
    for batch in compiler.batches(graphs, 128):
        metrics = compiler.apply(params, batch).metrics
        correct.append(np.asarray(metrics["correct"].values))
        distance.append(np.asarray(metrics["distance"].values))
    return np.concatenate(correct), np.concatenate(distance)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--train-size", type=COUNT, default=2_000, help="training graphs")
    p.add_argument("--test-size", type=COUNT, default=500, help="test graphs")
    p.add_argument("--dev-size", type=COUNT, default=300, help="dev graphs (they pick the best epoch)")
    p.add_argument("--min-nodes", type=COUNT, default=10, help="fewest nodes in a graph")
    p.add_argument("--max-nodes", type=COUNT, default=30, help="most nodes in a graph")
    p.add_argument("--extra-edges", type=number(float, 0), default=0.3,
                   help="random edges added to the spanning tree, per node (each closes a cycle)")
    p.add_argument("--rounds", type=COUNT, default=4, help="rounds of message passing")
    p.add_argument("--hidden", type=COUNT, default=32, help="node state size")
    add_training_flags(p, "ggnn", epochs=10, batch_size=32, learning_rate=3e-3)
    args = p.parse_args(argv)
    if args.min_nodes > args.max_nodes:
        p.error(f"need --min-nodes <= --max-nodes, got {args.min_nodes} and {args.max_nodes}")
    if args.quick:
        args.train_size, args.test_size, args.dev_size, args.epochs = 300, 100, 100, 3
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    rng = random.Random(args.seed)
    shape = ((args.min_nodes, args.max_nodes), args.extra_edges, args.rounds)
    train, test, dev = (make_data(rng, n, *shape) for n in (args.train_size, args.test_size, args.dev_size))

    compiler = fd.Compiler.create(build_model(args.hidden, args.rounds))
    trainer = common.trainer(compiler, optax.adam(args.learning_rate), args)
    fitted = common.fit(trainer, train, args, "ggnn", dev=dev, monitor="dev_correct", mode="max")
    params, history = fitted.best_params, fitted.history

    correct, distance = per_node(compiler, params, test)
    majority = collections.Counter(label for g in train for label in g.labels).most_common(1)[0][0]
    rows = [{"distance": d if d <= args.rounds else f">{args.rounds}", "nodes": int((distance == d).sum()),
             "accuracy": float(correct[distance == d].mean())} for d in range(args.rounds + 2) if (distance == d).any()]
    print_table("held-out accuracy by distance from the source", ["distance", "nodes", "accuracy"],
                [[r["distance"], r["nodes"], r["accuracy"]] for r in rows])
    accuracy, baseline = float(correct.mean()), float((distance == majority).mean())
    print(f"\nall test nodes: {accuracy:.3f} (always the most common class: {baseline:.3f})")
    report = {"example": "ggnn", "args": vars(args), "history": history, "by_distance": rows,
              "test_accuracy": accuracy, "majority_baseline": baseline}
    path = write_report("ggnn_quick" if args.quick else "ggnn", report, args.json)
    print(f"report written to {path}")
    return report


if __name__ == "__main__":
    main()
