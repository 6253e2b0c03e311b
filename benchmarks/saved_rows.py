"""Saved buffers at the rows loop items save, against a floor of A/4 rows and powers of two.

Under ``backward="save"`` (and ``"auto"`` where it pays) a batch's loop items keep their matmul
outputs in saved buffers, one region per loop operation (docs/design.md, "Reverse mode"). Every
step fills those buffers before its loop, so their rows cost time whether an item writes them or
not. fold sizes each region to what its items save, rounded up as arena rows are, above a floor
of ``A / SAVED_SHARE``; before, each region got at least a quarter of the size class ``A`` and a
power of two. This trains a model both ways on the same batches (the first ``--batches`` of a
stream, in their planned layouts; the earlier sizes are those layouts with each region raised
to the old rule, which holds the same items), taking turns in one process, checks that both give
the same parameters, and reports each region's rows, the rows the items save, and the step time
of each. It also walks one epoch of the stream on the host: how many layouts (compilations) it
takes, how many batches save, and their regions' rows over the rows their items save.
``--workload`` as in ``benchmarks.item_ladder``.

Run: ``python -m benchmarks.saved_rows --data-dir DIR --workload treenn`` (``--quick``: a
seconds-long run on the committed sample). Writes ``benchmarks/results/saved_rows.json`` and a plot.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import optax

import fold as fd
from benchmarks.common import interleaved_medians, largest_gap, make_train_step
from benchmarks.item_ladder import parse_workload, save_ratios
from examples.common import print_table
from fold.scheduler.schedule import layout_item_sizes, padded_rows

SIZES = ("A/4 and powers of two", "what items save")
EARLIER_SHARE = 4  # the floor before: a quarter of the size class


def earlier_rows(layout: fd.BatchLayout) -> tuple[int, ...]:
    """``layout``'s saved rows under the earlier rule: each saving region at least ``A / 4`` rows
    and a power of two (never fewer than it has, so the same items fit)."""
    return tuple(max(padded_rows(rows), layout.size_class // EARLIER_SHARE) if rows else 0
                 for rows in layout.saved_rows)


def items_save(batch: fd.Batch) -> list[int]:
    """Per loop operation of ``batch``'s layout, the rows its items write to its saved region:
    each item's padded size, one after another."""
    layout, a = batch.layout, batch.arrays
    sizes = np.asarray(layout_item_sizes(layout))
    branch = np.asarray(a.items_branch)[:int(a.n_items)]
    rows = np.bincount(branch // len(sizes), weights=sizes[branch % len(sizes)], minlength=len(layout.loop_ops))
    return [int(r) for r in rows]


def epoch(compiler: fd.Compiler, examples: list, batch_size: int) -> dict[str, Any]:
    """One epoch of ``compiler.batches`` on the host: layouts, saving batches, and the saving
    batches' region rows over the rows their items save."""
    layouts, saving, rows, need = set(), 0, 0, 0
    for batch in compiler.batches(examples, batch_size, prefetch=False):
        layouts.add(batch.layout)
        if batch.layout.saved_rows:
            saving += 1
            rows += sum(batch.layout.saved_rows)
            need += sum(r for r, have in zip(items_save(batch), batch.layout.saved_rows) if have)
    return {"layouts": len(layouts), "saving_layouts": sum(1 for layout in layouts if layout.saved_rows),
            "saving_batches": saving, "rows_over_need": rows / need if need else None}


def measure(model: Any, examples: list, batch_size: int, batches: int, repeats: int) -> dict[str, Any]:
    """Both sizes' median step time over the first ``batches`` batches of a stream of ``examples``."""
    compiler = fd.Compiler.create(model())
    params = compiler.init(jax.random.key(0))
    optimizer = optax.sgd(0.05)
    step = make_train_step(compiler, optimizer)
    stream = compiler.batches(examples[:batch_size * max(16, batches)], batch_size, prefetch=False)
    chosen = [b for b, _ in zip(stream, range(batches))]
    variants = {SIZES[0]: [b.replace(layout=b.layout._replace(saved_rows=earlier_rows(b.layout))) for b in chosen],
                SIZES[1]: chosen}
    args = {name: [(params, optimizer.init(params), jax.device_put(b), None) for b in bs]
            for name, bs in variants.items()}
    updated = {name: [jax.block_until_ready(step(*a))[0] for a in arg] for name, arg in args.items()}
    gap = max(largest_gap(a, b) for a, b in zip(*updated.values()))
    steps = {name: lambda arg=arg: [jax.block_until_ready(step(*a)) for a in arg] for name, arg in args.items()}
    ms = {name: 1000 * s / batches for name, s in interleaved_medians(steps, repeats).items()}
    return {"batch_size": batch_size, "size_class": chosen[0].layout.size_class,
            "saved_rows": {name: [list(b.layout.saved_rows) for b in bs] for name, bs in variants.items()},
            "items_save": [items_save(b) for b in chosen], "ms": ms,
            "ratio": ms[SIZES[1]] / ms[SIZES[0]], "largest_param_gap": gap,
            "epoch": epoch(compiler, examples, batch_size)}


def main(argv: list[str] | None = None) -> dict:
    args, model, examples = parse_workload(argv, "saved_rows", "treenn", 9, __doc__.splitlines()[0])
    runs = []
    for batch_size in args.batch_sizes:
        runs.append(r := measure(model, examples, batch_size, args.batches, args.repeats))
        print(f"batch {batch_size}: " + ", ".join(f"{n} {ms:.1f} ms" for n, ms in r["ms"].items())
              + f" (x{r['ratio']:.3f})", flush=True)
    print_table(f"{args.workload}: training step (ms), saved rows of the first batch",
                ["batch", "items save", *(f"rows, {n}" for n in SIZES), *SIZES, "ratio", "epoch layouts",
                 "saving batches", "epoch rows / saved"],
                [[r["batch_size"], r["items_save"][0], *(r["saved_rows"][n][0] for n in SIZES),
                  *(f"{r['ms'][n]:.2f}" for n in SIZES), f"{r['ratio']:.3f}", r["epoch"]["layouts"],
                  r["epoch"]["saving_batches"], f"{r['epoch']['rows_over_need'] or 0:.2f}"] for r in runs])
    result = {"workload": args.workload, "runs": runs, "hidden": args.hidden, "batches": args.batches,
              "repeats": args.repeats}

    return save_ratios("saved_rows", result, args, SIZES)

if __name__ == "__main__":
    main()
