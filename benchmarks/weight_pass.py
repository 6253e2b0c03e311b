"""Loop weight cotangents item by item against one pass after the backward loop.

The backward loop can add each loop item's parameter cotangent (its ``xᵀ·dY`` and an addition of
the whole parameter to the running sum) as it goes, or leave them to one pass after the loop
over all of an operation's rows (``Executor._weight_pass``), which gathers the rows again and
recomputes their element-wise work. fold picks the pass for an operation whose items hold few
rows for its parameters' size (``fold.compiler.executor.WEIGHT_PASS_SHARE``). This times both,
taking turns in one process, on the SST Tree-LSTM (trees), ``examples.tagger``'s BiLSTM tagger
with character LSTMs on SST's words (chains) and the GGNN example (graphs, H 32: items of many
rows for small layers), training steps on
the first batch of a stream, under the default ``backward="auto"``, and checks that both give
the same parameters. Each step over its loop items is the cost of a loop item: at batch 1, where
an item holds a row or two, it is what one loop iteration (forward and backward) costs.

Run: ``python -m benchmarks.weight_pass --data-dir DIR`` (``--quick``: a seconds-long run on the
committed sample). Writes ``benchmarks/results/weight_pass.json`` and a plot.
"""

from __future__ import annotations

import argparse
import pathlib
import random
from collections.abc import Callable
from typing import Any

import jax
import optax

import fold as fd
from benchmarks import models
from benchmarks.common import add_run_flags, figure, interleaved_medians, largest_gap, make_train_step, save_results
from examples import ggnn, sst, tagger
from examples.common import COUNT, print_table

WAYS = {"per item": False, "after the loop": True}  # Executor.weight_pass for each way


def measure(name: str, make: Callable[[], fd.Block], examples: list, batch_size: int, repeats: int) -> dict[str, Any]:
    """Median step time of each way on ``make()``'s first batch of ``batch_size`` examples."""
    steps: dict[str, Callable[[], Any]] = {}
    updated = {}
    for way, weight_pass in WAYS.items():
        compiler = fd.Compiler.create(make())
        compiler.executor.weight_pass = weight_pass
        params = compiler.init(jax.random.key(0))
        optimizer = optax.sgd(0.05)
        step = make_train_step(compiler, optimizer)
        batch = jax.device_put(next(iter(compiler.batches(examples[:batch_size * 16], batch_size))))
        items = int(batch.arrays.n_items)
        layout = batch.layout
        shares = [compiler.executor.item_share(o, params[compiler.program.ops[o].layer.name], rows)
                  for o, rows in zip(layout.loop_ops, layout.item_rows) if compiler.program.ops[o].layer is not None]
        args = (params, optimizer.init(params), batch, None)
        updated[way] = jax.block_until_ready(step(*args))[0]
        steps[way] = lambda step=step, args=args: jax.block_until_ready(step(*args))
    gap = largest_gap(*(updated[way] for way in WAYS))
    ms = {way: 1000 * s for way, s in interleaved_medians(steps, repeats).items()}
    return {"model": name, "batch_size": batch_size, "ms": ms, "speedup": ms["per item"] / ms["after the loop"],
            "loop_items": items, "us_per_item": {way: 1000 * t / items for way, t in ms.items()},
            "largest_param_gap": gap, "item_shares": shares}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-sizes", type=COUNT, nargs="+", default=[1, 4, 16, 25, 64])
    p.add_argument("--hidden", type=COUNT, default=150)
    p.add_argument("--repeats", type=COUNT, default=15, help="timed rounds")
    add_run_flags(p, "weight_pass", "batch sizes 4 and 16, 3 rounds, on the sample")
    args = p.parse_args(argv)
    if args.quick:
        args.batch_sizes, args.repeats = [4, 16], 3
    trees = sst.load("train", sst.data_dir(args.data_dir, args.quick))
    random.Random(0).shuffle(trees)
    word_idx = sst.vocabulary(trees)
    tagged = tagger.examples_of(trees)
    graphs = ggnn.make_data(random.Random(0), 16 * max(args.batch_sizes), (10, 30), 0.3, 4)
    cases = (("SST Tree-LSTM", lambda: models.sst_model(word_idx, args.hidden), trees),
             ("BiLSTM tagger", lambda: models.tagger_model(tagged, args.hidden), tagged),
             ("GGNN", lambda: ggnn.build_model(32, 4), graphs))
    runs = []
    for name, make, examples in cases:
        for batch_size in args.batch_sizes:
            runs.append(measure(name, make, examples, batch_size, args.repeats))
            r = runs[-1]
            print(f"{name}, batch {batch_size}: " + ", ".join(f"{w} {ms:.1f} ms" for w, ms in r["ms"].items())
                  + f" (x{r['speedup']:.2f})", flush=True)
    print_table("training step (ms), and per loop item (us: the step over its loop items)",
                ["model", "batch", *WAYS, "per item / after", "loop items", *(f"us/item, {w}" for w in WAYS)],
                [[r["model"], r["batch_size"], *(f"{r['ms'][w]:.1f}" for w in WAYS), f"{r['speedup']:.2f}",
                  r["loop_items"], *(f"{r['us_per_item'][w]:.0f}" for w in WAYS)] for r in runs])
    result = {"runs": runs, "hidden": args.hidden, "repeats": args.repeats,
              "weight_pass_share": fd.compiler.executor.WEIGHT_PASS_SHARE}

    def plot(path: pathlib.Path) -> None:
        with figure(path) as ax:
            for name, _, _ in cases:
                mine = [r for r in runs if r["model"] == name]
                ax.plot([max(r["item_shares"]) for r in mine], [r["speedup"] for r in mine], marker="o", label=name)
            ax.axhline(1, color="k", lw=0.5)
            ax.axvline(fd.compiler.executor.WEIGHT_PASS_SHARE, color="gray", ls=":", label="WEIGHT_PASS_SHARE")
            ax.set_xscale("log", base=2)
            ax.set_xlabel("item rows x widths / parameter entries (largest loop layer)")
            ax.set_ylabel("step time per item / after the loop")
            ax.legend(fontsize=7)

    save_results("weight_pass", result, args, plot)
    return result


if __name__ == "__main__":
    main()
