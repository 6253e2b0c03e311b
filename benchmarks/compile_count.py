"""Compilations over one SST training epoch: how well batch shapes are bucketed.

Trains the SST Tree-LSTM (per-node loss) for one epoch at ``--batch-size``
(shuffled, keeping the last partial batch) and reports, from
``compiler.stats()``: batches, distinct batch layouts, times the training
step was traced (each is an XLA compilation), batches per size class, and
bucket occupancy (the share of each bucket that is real rows, not padding).
Goal: at most 6 compilations per epoch at batch 64.

Run: ``python -m benchmarks.compile_count`` (``--quick`` for a seconds-long run).
"""

from __future__ import annotations

import argparse
import collections
import time
from typing import Any

import jax
import optax

import fold as fd
from benchmarks import models
from benchmarks.common import add_run_flags, figure, save_results
from examples import sst
from examples.common import make_train_step, print_table
from fold.compiler.compiler import CHUNK_SIZES

GOAL = 6


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", type=int, default=1, help="processes building batches ahead")
    p.add_argument("--chunk-size", type=int, nargs="+", default=list(CHUNK_SIZES),
                   help="candidates for C (Compiler.create's chunk_size)")
    add_run_flags(p, "compile_count", "a few hundred trees, small model")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    trees = sst.load("train", args.data_dir, 320 if args.quick else None)
    size = 16 if args.quick else 150
    compiler = fd.Compiler.create(models.sst_model(sst.vocabulary(trees), state_size=size, embed_size=size),
                                  chunk_size=args.chunk_size)
    optimizer = optax.adam(1e-3)
    params = compiler.init(jax.random.key(0))
    opt_state = optimizer.init(params)
    step = make_train_step(compiler, optimizer)
    key = jax.random.key(0)

    per_step, seen = [], set()
    start = time.perf_counter()
    for i, batch in enumerate(compiler.batches(trees, args.batch_size, shuffle=True, seed=0,
                                               num_workers=args.workers)):
        t = time.perf_counter()
        params, opt_state, loss = step(params, opt_state, batch, jax.random.fold_in(key, i))
        loss.block_until_ready()
        new = batch.layout not in seen
        seen.add(batch.layout)
        per_step.append({"batch": i, "size_class": batch.layout.size_class, "examples": batch.layout.num_examples,
                         "nodes": batch.stats.num_nodes, "chunk": batch.layout.chunk,
                         "new_layout": new, "seconds": time.perf_counter() - t})
    epoch_seconds = time.perf_counter() - start
    s = compiler.stats()
    compile_seconds = sum(r["seconds"] for r in per_step if r["new_layout"])
    per_chunk = collections.Counter(r["chunk"] for r in per_step)
    results: dict[str, Any] = {
        "args": vars(args), "trees": len(trees), "batches": s.batches, "layouts": s.layouts,
        "compilations": s.traces, "goal": GOAL, "size_classes": {str(k): v for k, v in s.size_classes.items()},
        "chunks": {str(c): n for c, n in per_chunk.items()},
        "occupancy": s.occupancy, "min_occupancy": s.min_occupancy, "saving": s.saving, "epoch_seconds": epoch_seconds,
        "first_steps_of_new_layouts_seconds": compile_seconds, "steps": per_step}
    print_table(f"one SST epoch at batch {args.batch_size}", ["quantity", "value"], [
        ["batches", s.batches], ["distinct layouts", s.layouts],
        ["compilations (traces of the step)", f"{s.traces} (goal <= {GOAL})"],
        ["batches per size class", ", ".join(f"A={k}: {v}" for k, v in s.size_classes.items())],
        ["batches per C", ", ".join(f"C={c}: {n}" for c, n in sorted(per_chunk.items()))],
        ["bucket occupancy (mean / min)", f"{s.occupancy:.2f} / {s.min_occupancy:.2f}"],
        ["batches saving matmul outputs (backward)", s.saving],
        ["epoch seconds (first steps of new layouts)", f"{epoch_seconds:.1f} ({compile_seconds:.1f})"]])
    save_results("compile_count", results, args, lambda png: plot(per_step, png))
    return results


def plot(per_step: list[dict], path: Any) -> None:
    """Step time per batch (log scale), compilations marked."""
    with figure(path, (7, 3.5)) as ax:
        ax.plot([r["batch"] for r in per_step], [r["seconds"] for r in per_step], lw=1, label="step")
        new = [r for r in per_step if r["new_layout"]]
        ax.scatter([r["batch"] for r in new], [r["seconds"] for r in new], color="tab:red", zorder=3,
                   label="new layout (compiles)")
        ax.set(yscale="log", xlabel="batch", ylabel="seconds", title="training steps over one SST epoch")
        ax.legend()


if __name__ == "__main__":
    main()
