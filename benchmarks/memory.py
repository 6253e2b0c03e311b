"""Peak memory of one SST training step against the activation bytes the model needs.

The step is the jitted SST Tree-LSTM training step (value_and_grad + SGD)
on batches of ``--batch-size`` real SST trees. For each batch:

- **activation bytes**: the rows the schedule really fills, over every
  arena (constants and every node's outputs) times their row size: the
  values a reverse-mode pass must keep, since fold recomputes everything
  else in its backward loop (when a batch saves each loop item's matmul
  outputs, ``--backward save`` always and ``auto`` below its ``save_limit``,
  those are more memory, which this measures);
- **arena bytes**: what the executor allocates for them (``A + C`` rows per
  type; ``A`` is the batch's power-of-two size class);
- **step temporaries**: XLA's buffer assignment for the compiled step
  (``memory_analysis().temp_size_in_bytes``: every buffer the step
  allocates besides its arguments and outputs, at its peak) — this is the
  peak memory of the step beyond the parameters and the batch, and it is
  exact for the compiled program, not a sampled measurement.

Goal: step temporaries <= 1.5x the activation bytes at batch 256.

Run: ``python -m benchmarks.memory`` (``--quick`` for a seconds-long run).
"""

from __future__ import annotations

import argparse
import random
from typing import Any

import jax
import numpy as np
import optax

import fold as fd
from benchmarks import models
from benchmarks.common import add_run_flags, figure, make_train_step, save_results
from examples import sst
from examples.common import COUNT, print_table
from fold.compiler.saving import BACKWARDS

GOAL = 1.5


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-size", type=COUNT, default=256)
    p.add_argument("--batches", type=COUNT, default=4, help="random batches to measure")
    p.add_argument("--hidden", type=COUNT, default=150)
    p.add_argument("--embed-size", type=COUNT, default=100)
    p.add_argument("--backward", choices=BACKWARDS, default="auto",
                   help="fold's backward through the loop (results go to memory_NAME.json unless auto)")
    add_run_flags(p, "memory", "the committed sample, tiny model")
    args = p.parse_args(argv)
    if args.quick:
        args.batch_size, args.batches, args.hidden, args.embed_size = 32, 2, 16, 16
    return args


def row_bytes(t: fd.TensorType) -> int:
    return int(np.prod(t.shape, dtype=np.int64)) * np.dtype(t.dtype).itemsize


def measure(compiler: fd.Compiler, step: Any, params: Any, opt_state: Any, trees: list) -> dict[str, Any]:
    """Activation, arena and XLA temporary bytes of one training step on ``trees``."""
    batch = compiler.build_batch(trees, exact_layout=True)
    sizes = [row_bytes(t) for t in compiler.program.types]
    rows = batch.stats.type_rows
    allocated = [r + batch.layout.chunk for r in batch.layout.arena_rows]
    floats = [i for i, t in enumerate(compiler.program.types) if jax.numpy.issubdtype(t.dtype, jax.numpy.inexact)]
    compiled = step.lower(params, opt_state, batch, jax.random.key(0)).compile()
    analysis = compiled.memory_analysis()
    activation = sum(r * s for r, s in zip(rows, sizes))
    return {
        "trees": len(trees), "nodes": batch.stats.num_nodes, "size_class": batch.layout.size_class,
        "saves": bool(batch.layout.saved_rows),
        "occupancy": batch.stats.rows / batch.layout.size_class,
        "activation_bytes": activation,
        "float_activation_bytes": sum(rows[i] * sizes[i] for i in floats),
        "arena_bytes": sum(a * s for a, s in zip(allocated, sizes)),
        "float_arena_bytes": sum(allocated[i] * sizes[i] for i in floats),
        "temp_bytes": analysis.temp_size_in_bytes,
        "argument_bytes": analysis.argument_size_in_bytes,
        "output_bytes": analysis.output_size_in_bytes,
        "params_bytes": sum(x.nbytes for x in jax.tree.leaves(params)),
        "ratio": analysis.temp_size_in_bytes / activation,
    }


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    all_trees = sst.load("train", sst.data_dir(args.data_dir, args.quick))
    rng = random.Random(0)
    compiler = fd.Compiler.create(models.sst_model(sst.vocabulary(all_trees), state_size=args.hidden,
                                                   embed_size=args.embed_size), backward=args.backward)
    params = compiler.init(jax.random.key(0))
    optimizer = optax.sgd(0.05)
    opt_state = optimizer.init(params)
    step = make_train_step(compiler, optimizer)

    rows = []
    for i in range(args.batches):
        print(f"batch {i + 1}/{args.batches}: compiling the step to read its buffer assignment ...", flush=True)
        rows.append(measure(compiler, step, params, opt_state, rng.sample(all_trees, args.batch_size)))
    mb = lambda b: f"{b / 2**20:.1f}"  # noqa: E731
    print_table(f"SST training step at batch {args.batch_size}, H={args.hidden}, backward={args.backward} (MiB)",
                ["nodes", "A", "occupancy", "saves", "activations", "arenas", "step temporaries",
                 "temp / activations"],
                [[r["nodes"], r["size_class"], f"{r['occupancy']:.2f}", "yes" if r["saves"] else "no",
                  mb(r["activation_bytes"]), mb(r["arena_bytes"]), mb(r["temp_bytes"]), f"{r['ratio']:.2f}"]
                 for r in rows])
    worst = max(r["ratio"] for r in rows)
    print(f"\nworst ratio {worst:.2f} (goal <= {GOAL}); parameters {mb(rows[0]['params_bytes'])} MiB")
    results = {"args": vars(args), "goal": GOAL, "worst_ratio": worst, "batches": rows}
    name = "memory" if args.backward == "auto" else f"memory_{args.backward}"
    save_results(name, results, args, lambda png: plot(rows, png))
    return results


def plot(rows: list[dict], path: Any) -> None:
    """Per batch: activation bytes, arena bytes and the step's temporaries (MiB)."""
    x = np.arange(len(rows))
    with figure(path) as ax:
        for k, (key, label) in enumerate((("activation_bytes", "activations"), ("arena_bytes", "arenas"),
                                          ("temp_bytes", "step temporaries"))):
            ax.bar(x + (k - 1) * 0.27, [r[key] / 2**20 for r in rows], 0.27, label=label)
        ax.set(xticks=x, xticklabels=[f"batch {i + 1}" for i in x], ylabel="MiB",
               title="memory of one SST training step")
        ax.legend()


if __name__ == "__main__":
    main()
