"""Data-parallel SST Tree-LSTM training over 1, 2, 4, 8 devices: balance, padding, traffic, speed.

For each device count ``D``, steps of ``--per-device`` trees per device (``D`` times as many per
step: weak scaling, as data parallelism is used) are built as ``ShardedBatch``es and trained
with SGD. Per step it records the nodes of each device (balance = max / mean), the rows each
device computes in the shared layout against the rows of its part in a layout of its own (the
padding one layout for all devices adds), each device's loop iterations, and the bytes of the
gradients the devices all-reduce. Time is trees/s end to end (building included, a blocking
step each time) over a second pass of the same steps, the first having compiled their layouts.

On a machine without several accelerators the devices are simulated on the CPU
(``--xla_force_host_platform_device_count``, set by re-running this module with it): they share
the same cores, so time does not scale there, and the report's ``projected_speedup`` is
``D / balance`` of the rows the devices compute (the slowest device sets a step's time), before
the all-reduce, whose volume it gives: a ring all-reduce moves ``2 (D - 1) / D`` times the
gradient bytes through each device's link.

Run: ``python -m benchmarks.scaling`` (``--quick`` for a seconds-long run).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
from typing import Any

GOAL_BALANCE = 1.05  # max / mean nodes per device, at 256 trees per device


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from benchmarks.common import add_run_flags
    from examples.common import COUNT

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--devices", type=COUNT, nargs="+", default=[1, 2, 4, 8], help="device counts to run")
    p.add_argument("--per-device", type=COUNT, default=256, help="trees per device per step")
    p.add_argument("--steps", type=COUNT, default=3, help="steps per device count")
    p.add_argument("--hidden", type=COUNT, default=150)
    p.add_argument("--embed-size", type=COUNT, default=100)
    add_run_flags(p, "scaling", "1 and 2 devices, 16 trees each, hidden 16, on the committed sample")
    args = p.parse_args(argv)
    if args.quick:
        args.devices, args.per_device, args.steps, args.hidden, args.embed_size = [1, 2], 16, 2, 16, 16
    return args


def _simulate_devices(count: int, argv: list[str]) -> None:
    """Re-runs this module with ``count`` CPU devices unless JAX already has that many."""
    import jax

    if jax.device_count() >= count:
        return
    if jax.default_backend() != "cpu" or "--xla_force_host_platform_device_count" in os.environ.get("XLA_FLAGS", ""):
        raise SystemExit(f"{count} devices asked for, {jax.device_count()} available")
    env = dict(os.environ)
    env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={count}".strip()
    print(f"re-running with {count} simulated CPU devices", flush=True)
    os.execve(sys.executable, [sys.executable, "-m", "benchmarks.scaling", *argv], env)


def measure(compiler: Any, trees: list, devices: int, args: argparse.Namespace) -> dict[str, Any]:
    """One device count's steps: balance, padding, iterations, traffic and trees/s."""
    import time

    import jax
    import numpy as np
    import optax

    from benchmarks.common import make_train_step
    from fold.compiler.sharding import partition
    from fold.scheduler.layouts import computed_rows

    step_fn = make_train_step(compiler, optax.sgd(0.05))
    # Replicated on the mesh from the start, as the steps return them: the first step's inputs
    # would otherwise be placed differently from the later steps' and compile once more.
    params = compiler.build_batch(trees[:devices], devices=devices).replicate(compiler.init(jax.random.key(0)))
    opt_state = optax.sgd(0.05).init(params)
    per_step = args.per_device * devices
    recorded = compiler.record(trees[:per_step * args.steps])
    chunks = [recorded[k * per_step:(k + 1) * per_step] for k in range(args.steps)]
    steps: list[dict] = []
    layouts = set()
    for chunk in chunks:  # a first pass compiles every layout the steps need
        batch = compiler.build_batch(chunk, devices=devices)
        params, opt_state, loss = step_fn(params, opt_state, batch, None)
        float(loss)
        layouts.add(batch.layout)
        own = [compiler.build_batch(chunk[m], exact_layout=True) for m in partition(chunk.node_counts(), devices)]
        shared_rows = np.asarray([computed_rows(part) for part in batch.parts])
        own_rows = np.asarray([computed_rows(part) for part in own])
        steps.append({"nodes": batch.nodes.tolist(), "balance": float(batch.nodes.max() / batch.nodes.mean()),
                      "rows": shared_rows.tolist(), "row_balance": float(shared_rows.max() / shared_rows.mean()),
                      "shared_layout_padding": float(shared_rows.sum() / own_rows.sum()),
                      "iterations": [int(part.arrays.n_items) for part in batch.parts]})
    start = time.perf_counter()
    for chunk in chunks:  # the timed pass: building and a blocking step, in the layouts of the first
        batch = compiler.build_batch(chunk, devices=devices)
        params, opt_state, loss = step_fn(params, opt_state, batch, None)
        float(loss)
    seconds = time.perf_counter() - start
    grad_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params))
    row_balance = float(np.mean([s["row_balance"] for s in steps]))
    return {"devices": devices, "trees_per_step": per_step, "steps": steps,
            "balance_mean": float(np.mean([s["balance"] for s in steps])),
            "balance_max": float(np.max([s["balance"] for s in steps])),
            "row_balance_mean": row_balance,
            "shared_layout_padding_mean": float(np.mean([s["shared_layout_padding"] for s in steps])),
            "allreduce_bytes_per_step": int(grad_bytes),
            "ring_bytes_per_device_per_step": int(2 * (devices - 1) / devices * grad_bytes),
            "projected_speedup": devices / row_balance,
            "trees_per_s": args.steps * per_step / seconds,
            "compilations": len(layouts)}


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    _simulate_devices(max(args.devices), argv)
    import jax

    import fold as fd
    from benchmarks import models
    from benchmarks.common import figure, save_results
    from examples import sst
    from examples.common import print_table

    trees = sst.load("train", sst.data_dir(args.data_dir, args.quick))
    needed = args.per_device * max(args.devices) * args.steps
    trees = [trees[i % len(trees)] for i in range(needed)]  # the sample is small: --quick repeats it
    random.Random(0).shuffle(trees)
    word_idx = sst.vocabulary(trees)
    runs = []
    for devices in args.devices:
        compiler = fd.Compiler.create(models.sst_model(word_idx, args.hidden, args.embed_size))
        runs.append(measure(compiler, trees, devices, args))
        jax.clear_caches()
    print_table(f"data parallel SST Tree-LSTM, {args.per_device} trees per device, hidden {args.hidden} "
                f"({jax.default_backend()}, {jax.device_count()} devices)",
                ["devices", "balance (nodes)", "worst", "balance (rows)", "shared-layout padding",
                 "all-reduce MB/step", "projected speedup", "trees/s", "compilations"],
                [[r["devices"], r["balance_mean"], r["balance_max"], r["row_balance_mean"],
                  r["shared_layout_padding_mean"], r["allreduce_bytes_per_step"] / 1e6, r["projected_speedup"],
                  r["trees_per_s"], r["compilations"]] for r in runs])
    if jax.default_backend() == "cpu":
        print("\nsimulated CPU devices share the machine's cores: trees/s does not scale here; "
              "projected speedup = devices / row balance, before the all-reduce")
    results = {"args": vars(args), "goal_balance": GOAL_BALANCE, "runs": runs,
               "simulated": jax.default_backend() == "cpu"}

    def plot(path: Any) -> None:
        with figure(path) as ax:
            counts = [r["devices"] for r in runs]
            ax.plot(counts, counts, "k:", label="linear")
            ax.plot(counts, [r["projected_speedup"] for r in runs], "o-", label="projected (balance)")
            ax.set_xlabel("devices")
            ax.set_ylabel("speedup")
            ax.legend()

    save_results("scaling", results, args, plot)
    return results


if __name__ == "__main__":
    main()
