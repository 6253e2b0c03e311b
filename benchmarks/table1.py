"""The Fold paper's Table 1: manual vs dynamic vs full dynamic batching.

Random binary trees of ``--leaves`` leaves run the paper's Tree-LSTM variant
(``benchmarks.models.Table1Cell``) at hidden size ``--hidden``. Per batch size:

- **manual**: hand-batched JAX for a batch of trees that share one shape:
  the fixed tree is traced in Python under ``jit``, one batched cell call per
  tree node (what a user writes without dynamic batching);
- **dynamic**: fold on the same batch of same-shaped trees;
- **full dynamic**: fold on trees that each have a different shape;
- **cost ratio** = dynamic / manual; **speedup ratio** = manual's time per
  tree at batch 1 / full dynamic's time per tree at this batch size.

Times are device times on pre-built batches already on the device (median of
``--repeats`` rounds after a warm-up that compiles; the rounds take turns
between manual, dynamic and full dynamic, so that the three share the
machine's drift: ``benchmarks.common.interleaved_medians``); building fold's
schedules on the host is reported in its own column, and compile times in
the JSON. At the largest batch the FLOP/s fold reaches is compared with the
FLOP/s of the cell's two matmuls alone on independent rows (no
dependencies, no gathers; the best of several row counts up to the batch's
internal nodes, each timed in a row: the machine's limit
for these shapes), measured in the same run.

``--mode infer`` runs the forward pass; ``--mode train`` a forward pass,
backward pass and SGD step on ``0.5 * sum(root ** 2)``.

Run: ``python -m benchmarks.table1 --mode infer`` (``--quick`` for a
seconds-long run).
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import fold as fd
from benchmarks import models
from benchmarks.common import add_run_flags, figure, interleaved_medians, median_seconds, save_results
from examples.common import COUNT, NATURAL, number, print_table
from fold.compiler.compiler import CHUNK_SIZES
from fold.compiler.saving import BACKWARDS

PAPER_COST_RATIO_CPU = {1024: 1.27, 1: 0.49}
PAPER_SPEEDUP_CPU = 28.9
LEARNING_RATE = 1e-3
LIMIT_ROUNDS = 11


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=("infer", "train"), default="infer")
    p.add_argument("--batch-sizes", type=COUNT, nargs="+", default=[1024, 512, 256, 128, 64, 32, 1])
    p.add_argument("--leaves", type=number(int, 2), default=128)
    p.add_argument("--hidden", type=COUNT, default=256, help="H (the paper used 1024 on its machines)")
    p.add_argument("--chunk-size", type=COUNT, nargs="+", default=list(CHUNK_SIZES),
                   help="fold's candidates for C, the most rows per loop iteration (Compiler.create's chunk_size)")
    p.add_argument("--backward", choices=BACKWARDS, default="auto",
                   help="fold's backward through the loop (Compiler.create's backward; train mode only)")
    p.add_argument("--repeats", type=COUNT, default=5)
    p.add_argument("--seed", type=NATURAL, default=0)
    add_run_flags(p, "table1_MODE", "tiny trees and batches", data_dir=False)
    args = p.parse_args(argv)
    if args.quick:
        args.batch_sizes, args.leaves, args.hidden, args.repeats = [8, 1], 8, 16, 2
    args.batch_sizes = sorted(set(args.batch_sizes), reverse=True)
    return args


# ----------------------------------------------------------------- the models
def leaf_order(tree: Any) -> list[int]:
    """The leaf ids of ``tree`` in left-to-right order (iterative: trees can be deep)."""
    out, todo = [], [tree]
    while todo:
        t = todo.pop()
        if isinstance(t, tuple):
            todo += [t[1], t[0]]
        else:
            out.append(t)
    return out


def relabel(shape: Any, ids: list[int]) -> Any:
    """``shape`` with its leaves replaced, left to right, by ``ids``."""
    it = iter(ids)

    def go(t: Any) -> Any:
        return (go(t[0]), go(t[1])) if isinstance(t, tuple) else next(it)

    return go(shape)


def manual_forward(shape: Any) -> Callable:
    """Hand-batched forward for trees shaped like ``shape``: ``f(params, ids[B, leaves]) -> roots[B, H]``,
    one batched cell call per internal node, traced once per shape."""

    def f(params: dict, ids: jax.Array) -> jax.Array:
        table, cell = params["embedding"]["table"], params["cell"]
        position = iter(range(ids.shape[1]))

        def go(t: Any) -> jax.Array:
            if not isinstance(t, tuple):
                return table[ids[:, next(position)]]
            return models.table1_cell(cell, go(t[0]), go(t[1]))

        return go(shape)

    return f


def sgd_step(forward: Callable) -> Callable:
    """A jitted SGD step on ``0.5 * sum(roots ** 2)`` for ``forward(params, batch) -> roots``."""

    @jax.jit
    def step(params: Any, batch: Any) -> tuple[Any, jax.Array]:
        loss, grads = jax.value_and_grad(lambda p: 0.5 * jnp.sum(forward(p, batch) ** 2))(params)
        return jax.tree.map(lambda p, g: p - LEARNING_RATE * g, params, grads), loss

    return step


def runner(forward: Callable, mode: str) -> Callable:
    """``run(params, batch)`` that blocks until done: the jitted forward or training step."""
    fn = jax.jit(forward) if mode == "infer" else sgd_step(forward)
    return lambda params, batch: jax.block_until_ready(fn(params, batch))


def first_call_seconds(run: Callable, params: Any, batch: Any) -> float:
    """Time of the first call (it compiles)."""
    start = time.perf_counter()
    run(params, batch)
    return time.perf_counter() - start


def matmul_limit(params: dict, rows: int, mode: str, repeats: int) -> dict[str, float]:
    """FLOP/s of the cell's two matmuls alone (forward, or forward and backward in train mode) on
    independent rows, for several row counts up to ``rows``: the best is the machine's limit for
    these weight shapes (one huge matmul is not always the fastest on a CPU)."""
    cell = params["cell"]
    h = cell["w0"].shape[1]

    def two_matmuls(c: dict, x: jax.Array) -> jax.Array:
        return (x @ c["w0"]) @ c["w"]

    fn = jax.jit(two_matmuls) if mode == "infer" else jax.jit(
        jax.grad(lambda c, x: 0.5 * jnp.sum(two_matmuls(c, x) ** 2), argnums=(0, 1)))
    out = {}
    # Smallest first, each size's calls in a row: right after a call with gigabytes of temporaries, a
    # small matmul measured at half its speed for several calls. More calls than the model gets: a
    # few-millisecond call is noisier than a whole batch.
    for n in sorted({r for r in (128, 1024, 8192, rows) if r <= rows}):
        x = jax.random.normal(jax.random.key(1), (n, 2 * h))
        run = lambda: jax.block_until_ready(fn(cell, x))  # noqa: E731
        run()
        out[str(n)] = model_flops(n, h, mode) / median_seconds(run, max(repeats, LIMIT_ROUNDS))
    return out


def model_flops(internal_nodes: int, hidden: int, mode: str) -> float:
    """Matmul FLOPs the model needs: per internal node ``2*(2H*H) + 2*(H*4H)`` forward; a training
    step counts three times that (forward, and the two products of the backward pass)."""
    forward = internal_nodes * 12 * hidden * hidden
    return forward if mode == "infer" else 3 * forward


# ----------------------------------------------------------------- the benchmark
def run_batch_size(b: int, args: argparse.Namespace, compiler: fd.Compiler, params: dict,
                   rng: random.Random) -> dict[str, Any]:
    """Manual, dynamic and full dynamic at batch size ``b``."""
    shape = models.random_tree(rng, args.leaves)
    same = [relabel(shape, [rng.randrange(args.leaves) for _ in range(args.leaves)]) for _ in range(b)]
    different = [models.random_tree(rng, args.leaves) for _ in range(b)]

    ids = jnp.asarray(np.array([leaf_order(t) for t in same], dtype=np.int32))
    manual_run = runner(manual_forward(shape), args.mode)
    fold_run = runner(lambda p, batch: compiler.apply(p, batch).outputs, args.mode)
    row: dict[str, Any] = {"batch_size": b, "manual": {"first_call_s": first_call_seconds(manual_run, params, ids)}}
    calls = {"manual": lambda: manual_run(params, ids)}
    for name, trees in (("dynamic", same), ("full_dynamic", different)):
        host = compiler.build_batch(trees, exact_layout=True)
        build = median_seconds(lambda: compiler.build_batch(trees), max(1, args.repeats // 2))
        batch = jax.device_put(host)  # on the device, like manual's ids
        row[name] = {"first_call_s": first_call_seconds(fold_run, params, batch), "build_s": build,
                     "nodes": host.stats.num_nodes, "size_class": host.layout.size_class,
                     "chunk": host.layout.chunk}
        calls[name] = lambda batch=batch: fold_run(params, batch)
    for name, seconds in interleaved_medians(calls, args.repeats).items():
        row[name].update(seconds=seconds, per_tree_s=seconds / b)
    row["cost_ratio"] = row["dynamic"]["seconds"] / row["manual"]["seconds"]
    row["full_vs_dynamic"] = row["full_dynamic"]["seconds"] / row["dynamic"]["seconds"]
    return row


def check_outputs(compiler: fd.Compiler, params: dict, rng: random.Random, leaves: int) -> float:
    """Max abs difference between fold and the manual model on a few trees (they must agree)."""
    trees = [models.random_tree(rng, leaves) for _ in range(3)]
    got = compiler.apply(params, compiler.build_batch(trees)).outputs
    want = [manual_forward(t)(params, jnp.asarray([leaf_order(t)], jnp.int32))[0] for t in trees]
    return float(jnp.max(jnp.abs(got - jnp.stack(want))))


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    compiler = fd.Compiler.create(models.table1_model(args.hidden, args.leaves), chunk_size=args.chunk_size,
                                  backward=args.backward)
    params = compiler.init(jax.random.key(args.seed))
    rng = random.Random(args.seed)
    error = check_outputs(compiler, params, rng, args.leaves)
    if error > 1e-4:
        raise AssertionError(f"fold and the manual model disagree by {error}")

    rows = []
    for b in args.batch_sizes:
        print(f"batch size {b} ({args.mode}) ...", flush=True)
        rows.append(run_batch_size(b, args, compiler, params, rng))
    base = next((r for r in rows if r["batch_size"] == 1), None)
    for r in rows:
        r["speedup_ratio"] = base["manual"]["per_tree_s"] / r["full_dynamic"]["per_tree_s"] if base else None

    largest = rows[0]
    internal = largest["batch_size"] * (args.leaves - 1)
    flops = model_flops(internal, args.hidden, args.mode)
    limit = matmul_limit(params, internal, args.mode, args.repeats)
    efficiency = {"batch_size": largest["batch_size"], "internal_nodes": internal, "model_flops": flops,
                  "fold_flops_per_s": flops / largest["dynamic"]["seconds"],
                  "manual_flops_per_s": flops / largest["manual"]["seconds"],
                  "matmul_flops_per_s_by_rows": limit, "matmul_flops_per_s": max(limit.values())}
    efficiency["fold_share_of_matmul"] = efficiency["fold_flops_per_s"] / efficiency["matmul_flops_per_s"]

    ms = lambda s: f"{s * 1e3:.2f}"  # noqa: E731
    print_table(f"Table 1, {args.mode}, {args.leaves}-leaf trees, H={args.hidden} (ms; per tree in brackets)",
                ["batch", "manual", "dynamic", "full dynamic", "cost ratio", "speedup ratio", "full/dyn",
                 "build (dyn)", "C"],
                [[r["batch_size"], f"{ms(r['manual']['seconds'])} ({ms(r['manual']['per_tree_s'])})",
                  f"{ms(r['dynamic']['seconds'])} ({ms(r['dynamic']['per_tree_s'])})",
                  f"{ms(r['full_dynamic']['seconds'])} ({ms(r['full_dynamic']['per_tree_s'])})",
                  f"{r['cost_ratio']:.2f}", f"{r['speedup_ratio']:.1f}x" if r["speedup_ratio"] else "-",
                  f"{r['full_vs_dynamic']:.2f}", ms(r["dynamic"]["build_s"]), r["dynamic"]["chunk"]] for r in rows])
    print(f"\nat batch {largest['batch_size']}: fold {efficiency['fold_flops_per_s'] / 1e9:.1f} GFLOP/s, manual "
          f"{efficiency['manual_flops_per_s'] / 1e9:.1f}, the cell's two matmuls alone on independent rows "
          f"{efficiency['matmul_flops_per_s'] / 1e9:.1f} (best of rows {', '.join(limit)}): fold reaches "
          f"{100 * efficiency['fold_share_of_matmul']:.0f}% of it (goal >= 70%)")
    print(f"paper (TF Fold, CPU): cost ratio {PAPER_COST_RATIO_CPU[1024]} at 1024, {PAPER_COST_RATIO_CPU[1]} at 1; "
          f"speedup {PAPER_SPEEDUP_CPU}x")

    results = {"args": vars(args), "max_abs_difference_fold_vs_manual": error, "rows": rows,
               "efficiency": efficiency, "paper_cpu": {"cost_ratio": PAPER_COST_RATIO_CPU,
                                                       "speedup_ratio": PAPER_SPEEDUP_CPU}}
    save_results(f"table1_{args.mode}", results, args, lambda png: plot(rows, args, png))
    return results


def plot(rows: list[dict], args: argparse.Namespace, path: Any) -> None:
    """Per-tree time against batch size, log-log, for manual, dynamic and full dynamic."""
    sizes = [r["batch_size"] for r in rows]
    with figure(path) as ax:
        for name, style in (("manual", "o-"), ("dynamic", "s-"), ("full_dynamic", "^--")):
            ax.plot(sizes, [r[name]["per_tree_s"] * 1e3 for r in rows], style, label=name.replace("_", " "))
        ax.set(xscale="log", yscale="log", xlabel="batch size (trees)", ylabel="ms per tree",
               title=f"Table 1 ({args.mode}), {args.leaves}-leaf trees, H={args.hidden}")
        ax.legend()


if __name__ == "__main__":
    main()
