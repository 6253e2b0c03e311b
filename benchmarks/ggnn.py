"""A gated graph network's training step: fold's shared (node, round) states against dense JAX.

The network and task are ``examples/ggnn.py``'s (random graphs with cycles, distance from a
source, ``--rounds`` rounds of GRU updates from summed neighbour states). Three implementations of
the same step (loss and gradients of every parameter) on the same graphs and parameters:

- fold: ``fd.Shared`` states keyed ``(node, round)``, one batch (``compiler.build_batch``) run by
  the jitted executor. Its host time (building the batch) is reported apart.
- dense JAX: the batch as one disjoint graph, messages gathered along the edges and summed with
  ``jax.ops.segment_sum`` (``examples.ggnn.dense_losses``), jitted: how graph networks are
  usually batched, and the floor for any implementation.
- jraph (``pip install jraph``; skipped if it does not import): the same network as
  ``jraph.GraphNetwork`` rounds.

Reported per batch size: the step's median seconds for each, fold's ratio to each (the goal of
issue 52: fold within 3x of dense), and the largest difference of fold's losses from dense's.

Run: ``python -m benchmarks.ggnn`` (``--quick``: small, seconds). Writes
``benchmarks/results/ggnn.json``.
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import fold as fd
from benchmarks.common import add_run_flags, figure, interleaved_medians, median_seconds, save_results
from examples import ggnn


def jraph_step(rounds: int) -> Callable[[dict, Any, np.ndarray], Any] | None:
    """The step as ``jraph.GraphNetwork`` rounds, or None without jraph."""
    try:
        import jraph
    except ImportError:
        return None

    def losses(params: dict, graph: Any, labels: jax.Array) -> jax.Array:
        nodes = jnp.tanh(graph.nodes @ params["embed"]["w"] + params["embed"]["b"])
        network = jraph.GraphNetwork(
            update_edge_fn=lambda edges, sent, received, globals_: sent,
            update_node_fn=lambda nodes, sent, received, globals_: ggnn.gru(
                params["gru"], received @ params["message"]["w"] + params["message"]["b"], nodes))
        graph = graph._replace(nodes=nodes)
        for _ in range(rounds):
            graph = network(graph)
        logits = graph.nodes @ params["readout"]["w"] + params["readout"]["b"]
        return ggnn._cross_entropy(logits, labels)

    return jax.jit(jax.value_and_grad(lambda p, g, y: jnp.sum(losses(p, g, y))))


def run(args: argparse.Namespace) -> dict[str, Any]:
    compiler = fd.Compiler.create(ggnn.build_model(args.hidden, args.rounds))
    params = compiler.init(jax.random.key(0))
    fold_step = jax.jit(jax.value_and_grad(lambda p, b: compiler.apply(p, b).metrics["loss"].sum()))
    dense_step = jax.jit(jax.value_and_grad(
        lambda p, g: jnp.sum(ggnn.dense_losses(p, g, args.rounds)[0])))
    graph_step = jraph_step(args.rounds)
    rows = []
    for size in args.batch_sizes:
        graphs = ggnn.make_data(random.Random(size), size, (args.min_nodes, args.max_nodes), args.extra_edges,
                                args.rounds)
        batch = compiler.build_batch(graphs)
        build = median_seconds(lambda: compiler.build_batch(graphs), args.repeats)  # noqa: B023
        dense = ggnn.DenseGraphs(*(jnp.asarray(a) for a in ggnn.dense_graphs(graphs)))
        fns: dict[str, Callable[[], Any]] = {
            "fold": lambda: jax.block_until_ready(fold_step(params, batch)),  # noqa: B023
            "dense": lambda: jax.block_until_ready(dense_step(params, dense)),  # noqa: B023
        }
        if graph_step is not None:
            import jraph

            n = dense.features.shape[0]
            graph = jraph.GraphsTuple(nodes=dense.features, edges=None, senders=dense.senders,
                                      receivers=dense.receivers, globals=None, n_node=jnp.asarray([n]),
                                      n_edge=jnp.asarray([dense.senders.shape[0]]))
            fns["jraph"] = lambda: jax.block_until_ready(graph_step(params, graph, dense.labels))  # noqa: B023
        loss_fold = np.asarray(compiler.apply(params, batch).metrics["loss"].values)
        loss_dense = np.asarray(ggnn.dense_losses(params, dense, args.rounds)[0])
        seconds = interleaved_medians(fns, args.repeats, warmup=3)
        row = {"batch_size": size, "nodes": int(dense.features.shape[0]), "edges": int(dense.senders.shape[0]),
               "fold_calls": batch.stats.num_nodes, "loop_items": batch.stats.num_items,
               "build_seconds": build, **{f"{k}_seconds": v for k, v in seconds.items()},
               **{f"fold_over_{k}": seconds["fold"] / v for k, v in seconds.items() if k != "fold"},
               "max_loss_difference": float(np.abs(loss_fold - loss_dense).max())}
        rows.append(row)
        print(f"batch {size:4d}: {row['nodes']:5d} nodes, fold step {seconds['fold'] * 1e3:7.2f} ms "
              f"(build {build * 1e3:6.2f} ms), dense {seconds['dense'] * 1e3:6.2f} ms"
              + (f", jraph {seconds['jraph'] * 1e3:6.2f} ms" if "jraph" in seconds else "")
              + f"; fold / dense {row['fold_over_dense']:.2f}x; loss difference {row['max_loss_difference']:.1e}")
    return {"args": {k: v for k, v in vars(args).items() if k != "json"}, "rows": rows}


def plot(result: dict[str, Any]) -> Callable[[Any], None]:
    def draw(path: Any) -> None:
        with figure(path) as ax:
            sizes = [r["batch_size"] for r in result["rows"]]
            for key in ("fold", "dense", "jraph"):
                if f"{key}_seconds" in result["rows"][0]:
                    ax.plot(sizes, [r[f"{key}_seconds"] * 1e3 for r in result["rows"]], marker="o", label=key)
            ax.set(xscale="log", yscale="log", xlabel="graphs per batch", ylabel="training step (ms)",
                   title=f"GGNN, {result['args']['rounds']} rounds, hidden {result['args']['hidden']}")
            ax.legend()
    return draw


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[8, 32, 128])
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--min-nodes", type=int, default=10)
    p.add_argument("--max-nodes", type=int, default=30)
    p.add_argument("--extra-edges", type=float, default=0.3)
    p.add_argument("--repeats", type=int, default=9)
    add_run_flags(p, "ggnn", "batch 2 and 8, 2 rounds", data_dir=False)
    args = p.parse_args(argv)
    if args.quick:
        args.batch_sizes, args.rounds, args.repeats = [2, 8], 2, 3
    result = run(args)
    save_results("ggnn", result, args, plot(result))
    return result


if __name__ == "__main__":
    main()
