"""Host-side scheduling speed: nodes per second that ``compiler.build_batch`` turns into a schedule.

Two workloads, one process: the SST Tree-LSTM (per-node loss) on real SST
training trees, and the Table 1 Tree-LSTM on random 128-leaf trees. For
SST it also times a jitted training step (value_and_grad + Adam) over one
epoch of batches (``--step-batches``; median of ``--repeats`` epochs: the
first forks the worker process, which later epochs reuse, as in training):
on pre-built batches (the device's time), building
each batch in the training loop (``num_workers=0``: JAX's asynchronous
dispatch overlaps building with the previous step) and with one worker
process; then the same from examples recorded once with ``compiler.record``
(batches merged from arrays instead of walked). The host's share of a step
is ``1 - device time / step time``.

Reference points, printed next to the measurements: TensorFlow Fold's C++
scheduler built on the order of 1e4 nodes/s per thread on this model (Cavs
paper, Fig. 9); fold's goal is 3e5 nodes/s.

Run: ``python -m benchmarks.schedule_build`` (``--quick`` for a seconds-long run).
"""

from __future__ import annotations

import argparse
import random
from typing import Any

import jax
import optax

import fold as fd
from benchmarks import models
from benchmarks.common import add_run_flags, figure, make_train_step, median_seconds, save_results, timed
from examples import sst
from examples.common import COUNT, print_table

FOLD_CPP_NODES_PER_S = 1e4
GOAL_NODES_PER_S = 3e5


def build_rate(compiler: fd.Compiler, batches: list[list[Any]], repeats: int) -> dict[str, float]:
    """Nodes/s and seconds per batch for building every batch of ``batches`` (median of repeats)."""
    built = [compiler.build_batch(b) for b in batches]  # warm-up, and the node count
    nodes = sum(b.stats.num_nodes for b in built)
    seconds = median_seconds(lambda: [compiler.build_batch(b) for b in batches], repeats)
    return {"batches": len(batches), "examples_per_batch": len(batches[0]), "nodes": nodes,
            "nodes_per_batch": nodes / len(batches), "seconds_per_batch": seconds / len(batches),
            "nodes_per_s": nodes / seconds}


def step_seconds(compiler: fd.Compiler, batches: list[list[Any]], repeats: int,
                 num_workers: int | None = None, recorded: fd.RecordedExamples | None = None) -> float:
    """Median time per jitted training step (compilation excluded): on pre-built batches
    (device time only) when ``num_workers`` is None, else building them with
    ``compiler.batches(..., num_workers=num_workers)`` inside the timed loop, from ``recorded``
    (the same examples, recorded) if given."""
    optimizer = optax.adam(1e-3)
    params = compiler.init(jax.random.key(0))
    opt_state = optimizer.init(params)
    step = make_train_step(compiler, optimizer)
    key = jax.random.key(0)
    built = [compiler.build_batch(b) for b in batches]
    for b in built:  # compile every layout these batches have: steady state is what is timed
        jax.block_until_ready(step(params, opt_state, b, key))

    examples = recorded if recorded is not None else [x for b in batches for x in b]

    def run_all() -> None:
        p, s = params, opt_state
        stream = built if num_workers is None else compiler.batches(examples, len(batches[0]),
                                                                      num_workers=num_workers)
        for b in stream:
            p, s, loss = step(p, s, b, key)
        jax.block_until_ready(loss)

    return median_seconds(run_all, repeats) / len(built)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-size", type=COUNT, default=64)
    p.add_argument("--batches", type=COUNT, default=20, help="batches per workload")
    p.add_argument("--step-batches", type=COUNT, default=None,
                   help="SST batches the training step is timed over (default: one epoch, every training tree)")
    p.add_argument("--leaves", type=COUNT, default=128, help="leaves of the random trees")
    p.add_argument("--repeats", type=COUNT, default=3)
    add_run_flags(p, "schedule_build", "a few small batches")
    args = p.parse_args(argv)
    if args.quick:
        args.batch_size, args.batches, args.leaves, args.repeats, args.step_batches = 16, 2, 16, 1, 2
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    all_trees = sst.load("train", sst.data_dir(args.data_dir, args.quick))
    word_idx = sst.vocabulary(all_trees)
    n_step = args.step_batches or len(all_trees) // args.batch_size
    sst_batches = [all_trees[i:i + args.batch_size] for i in range(0, args.batch_size * args.batches, args.batch_size)]
    step_batches = [all_trees[i:i + args.batch_size] for i in range(0, args.batch_size * n_step, args.batch_size)]
    rng = random.Random(0)
    random_batches = [[models.random_tree(rng, args.leaves) for _ in range(args.batch_size)]
                      for _ in range(args.batches)]

    sst_compiler = fd.Compiler.create(models.sst_model(word_idx))
    results: dict[str, Any] = {"args": vars(args), "reference_nodes_per_s": {
        "tensorflow_fold_cpp_per_thread": FOLD_CPP_NODES_PER_S, "goal": GOAL_NODES_PER_S}}
    print(f"building {len(sst_batches)} SST batches of {args.batch_size} ...", flush=True)
    results["sst"] = build_rate(sst_compiler, sst_batches, args.repeats)
    build = results["sst"]["seconds_per_batch"]
    print(f"timing the SST training step over {n_step} batches: on pre-built batches ...", flush=True)
    step = step_seconds(sst_compiler, step_batches, args.repeats)
    print("... building each batch in the training loop ...", flush=True)
    in_loop = step_seconds(sst_compiler, step_batches, args.repeats, num_workers=0)
    print("... with 1 worker process building ahead", flush=True)
    with_worker = step_seconds(sst_compiler, step_batches, args.repeats, num_workers=1)
    results["sst"].update(step_batches=n_step, step_seconds=step, host_share_of_step=build / (build + step),
                          step_seconds_in_loop=in_loop, host_share_in_loop=max(0.0, 1.0 - step / in_loop),
                          step_seconds_with_1_worker=with_worker,
                          host_share_with_1_worker=max(0.0, 1.0 - step / with_worker))
    print(f"recording the {len(all_trees)} training trees ...", flush=True)
    recorded, record_seconds = timed(lambda: sst_compiler.record(all_trees))
    results["sst_recorded"] = build_rate(sst_compiler, [recorded[i:i + args.batch_size] for i in
                                                        range(0, args.batch_size * args.batches, args.batch_size)],
                                         args.repeats)
    step_recorded = recorded[:args.batch_size * n_step]
    print("... and timing the step building from recorded examples, in the loop and with 1 worker", flush=True)
    rec_in_loop = step_seconds(sst_compiler, step_batches, args.repeats, num_workers=0, recorded=step_recorded)
    rec_worker = step_seconds(sst_compiler, step_batches, args.repeats, num_workers=1, recorded=step_recorded)
    results["sst_recorded"].update(
        record_seconds=record_seconds, recorded_examples=len(recorded),
        step_seconds_in_loop=rec_in_loop, host_share_in_loop=max(0.0, 1.0 - step / rec_in_loop),
        step_seconds_with_1_worker=rec_worker, host_share_with_1_worker=max(0.0, 1.0 - step / rec_worker))
    print(f"building {len(random_batches)} batches of {args.leaves}-leaf random trees ...", flush=True)
    table1 = fd.Compiler.create(models.table1_model(256 if not args.quick else 16, args.leaves))
    results["random_trees"] = build_rate(table1, random_batches, args.repeats)

    rows = [[name, f"{r['nodes_per_batch']:.0f}", f"{r['seconds_per_batch'] * 1e3:.1f}", f"{r['nodes_per_s']:.0f}",
             f"{r['nodes_per_s'] / FOLD_CPP_NODES_PER_S:.1f}", f"{r['nodes_per_s'] / GOAL_NODES_PER_S:.2f}"]
            for name, r in (("SST Tree-LSTM", results["sst"]), ("SST, recorded", results["sst_recorded"]),
                            (f"{args.leaves}-leaf trees", results["random_trees"]))]
    print_table(f"build_batch, batch {args.batch_size}, one process",
                ["workload", "nodes/batch", "ms/batch", "nodes/s", "x Fold C++", "x goal (3e5)"], rows)
    sst_r = results["sst"]
    print(f"\nSST training step: {step * 1e3:.1f} ms on the device, building a batch {build * 1e3:.1f} ms "
          f"({100 * sst_r['host_share_of_step']:.0f}% of the two if nothing overlapped them)")
    print(f"building in the training loop: {in_loop * 1e3:.1f} ms per step, the host's share is "
          f"{100 * sst_r['host_share_in_loop']:.0f}%")
    print(f"with 1 worker process building ahead: {with_worker * 1e3:.1f} ms per step, the host's share is "
          f"{100 * sst_r['host_share_with_1_worker']:.0f}% (goal <= 10%)")
    rec = results["sst_recorded"]
    print(f"\nrecording all {rec['recorded_examples']} training trees once: {rec['record_seconds']:.2f} s; then "
          f"building a batch {rec['seconds_per_batch'] * 1e3:.1f} ms")
    print(f"from recorded examples, in the training loop: {rec['step_seconds_in_loop'] * 1e3:.1f} ms per step, "
          f"host share {100 * rec['host_share_in_loop']:.0f}%; with 1 worker: "
          f"{rec['step_seconds_with_1_worker'] * 1e3:.1f} ms, {100 * rec['host_share_with_1_worker']:.0f}%")

    save_results("schedule_build", results, args, lambda png: plot(results, png))
    return results


def plot(results: dict, path: Any) -> None:
    """Bar chart of nodes/s per workload against Fold's C++ scheduler and the goal (log scale)."""
    names = ["SST Tree-LSTM", "SST, recorded", "random trees"]
    rates = [results["sst"]["nodes_per_s"], results["sst_recorded"]["nodes_per_s"],
             results["random_trees"]["nodes_per_s"]]
    with figure(path) as ax:
        ax.bar(names, rates, color="tab:blue")
        ax.axhline(FOLD_CPP_NODES_PER_S, color="tab:gray", ls="--", label="TF Fold C++ (per thread)")
        ax.axhline(GOAL_NODES_PER_S, color="tab:green", ls=":", label="goal")
        ax.set(yscale="log", ylabel="nodes / s (one process)", title="build_batch speed")
        ax.legend()


if __name__ == "__main__":
    main()
