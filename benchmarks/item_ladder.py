"""Loop item sizes: powers of two alone against the ladder with one and a half times them.

A loop item computes its group's rows padded to the smallest item size that holds them
(``fold.scheduler.schedule.item_sizes``). With powers of two alone, a group's last item can
compute up to twice the rows it holds; with sizes of one and a half times a power of two in
between, from ``FINE_ITEM`` rows up (fold's default), at most a third more, for a few more
branches of the loop's ``switch`` to compile. This trains a model both ways on the same
batches (the first ``--batches`` of a stream), taking turns in one process, checks that both
give the same parameters, and reports the step time of each, their ratio and how long each took
to compile. ``--workload``: the SST Tree-LSTM (``--hidden``), DyNet's BiLSTM tagger with
character LSTMs (``examples.tagger``) or its ``treenn`` (``benchmarks.dynet_treenn``), both at
the DyNet suite's sizes, or Table 1's Tree-LSTM on random trees of 128 leaves (H 256).

Run: ``python -m benchmarks.item_ladder --data-dir DIR`` (``--quick``: a seconds-long run on the
committed sample). Writes ``benchmarks/results/item_ladder.json`` and a plot.
"""

from __future__ import annotations

import argparse
import contextlib
import pathlib
import random
import time
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import optax

import fold as fd
from benchmarks import dynet_treenn, models
from benchmarks.common import add_run_flags, figure, interleaved_medians, largest_gap, make_train_step, save_results
from examples import sst, tagger
from examples.common import COUNT, print_table
from fold.scheduler import schedule

LADDERS = ("powers of two", "with 1.5x sizes")
# Each workload's default batch sizes: the SST runs of the performance docs, DyNet's races.
WORKLOADS = {"sst": [25, 64, 256], "tagger": [16, 64], "treenn": [16, 64], "table1": [64, 256]}
TABLE1_LEAVES, TABLE1_HIDDEN, TABLE1_TREES = 128, 256, 4096


@contextlib.contextmanager
def ladder(name: str) -> Iterator[None]:
    """Batches built and steps traced inside use ladder ``name``: ``FINE_ITEM`` past any chunk
    size leaves the powers of two alone. Each compiler's step is traced and compiled inside, so
    it keeps the ladder its batches were built with."""
    kept = schedule.FINE_ITEM
    if name == LADDERS[0]:
        schedule.FINE_ITEM = 2**62
    try:
        yield
    finally:
        schedule.FINE_ITEM = kept


def half_square(root: jax.Array) -> jax.Array:
    """Table 1's training loss: ``0.5 * sum(root ** 2)``."""
    return 0.5 * jnp.sum(root**2, axis=-1)


def workload(name: str, trees: list, hidden: int, quick: bool) -> tuple[Callable[[], fd.Block], list]:
    """Workload ``name``'s model (a function that builds it) and its examples, from SST's ``trees``
    (Table 1's are random trees of its own)."""
    if name == "sst":
        word_idx = sst.vocabulary(trees)
        return lambda: models.sst_model(word_idx, hidden), trees
    if name == "tagger":
        examples = tagger.examples_of(trees)
        return lambda: models.tagger_model(examples, 16 if quick else 50), examples
    if name == "table1":
        leaves, hidden = (8, 16) if quick else (TABLE1_LEAVES, TABLE1_HIDDEN)
        rng = random.Random(0)
        return (lambda: models.table1_model(hidden, leaves) >> fd.Function(half_square) >> fd.Metric("loss"),
                [models.random_tree(rng, leaves) for _ in range(64 if quick else TABLE1_TREES)])
    word_idx = dynet_treenn.vocabulary(trees)
    sizes = (16, 16) if quick else (dynet_treenn.WORD_SIZE, dynet_treenn.HIDDEN)
    return lambda: dynet_treenn.build_model(word_idx, *sizes), trees


def measure(model: Callable[[], fd.Block], examples: list, batch_size: int, batches: int,
            repeats: int) -> dict[str, Any]:
    """Each ladder's median time over the first ``batches`` training steps of a stream of ``examples``."""
    steps = {}
    updated = {}
    compile_s = {}
    sizes: dict[str, list[int]] = {}
    for name in LADDERS:
        with ladder(name):
            compiler = fd.Compiler.create(model())
            params = compiler.init(jax.random.key(0))
            optimizer = optax.sgd(0.05)
            step = make_train_step(compiler, optimizer)
            # Built here, not ahead on a thread that could outlive the ladder.
            stream = compiler.batches(examples[:batch_size * max(16, batches)], batch_size, prefetch=False)
            chosen = [jax.device_put(b) for b, _ in zip(stream, range(batches))]
            args = [(params, optimizer.init(params), b, None) for b in chosen]
            start = time.perf_counter()
            updated[name] = [jax.block_until_ready(step(*a))[0] for a in args]
            compile_s[name] = time.perf_counter() - start
            sizes[name] = list(schedule.layout_item_sizes(chosen[0].layout))
        steps[name] = lambda step=step, args=args: [jax.block_until_ready(step(*a)) for a in args]
    gap = max(largest_gap(a, b) for a, b in zip(*(updated[name] for name in LADDERS)))
    ms = {name: 1000 * s / batches for name, s in interleaved_medians(steps, repeats).items()}
    return {"batch_size": batch_size, "chunk": chosen[0].layout.chunk, "item_sizes": sizes, "ms": ms,
            "ratio": ms[LADDERS[1]] / ms[LADDERS[0]], "first_steps_s": compile_s, "largest_param_gap": gap}


def parse_workload(argv: list[str] | None, name: str, default: str, repeats: int,
                   description: str) -> tuple[argparse.Namespace, Callable[[], fd.Block], list]:
    """The command line of a benchmark that times one workload two ways (this one, and
    ``benchmarks.saved_rows``): its flags, and the workload's model and examples (``workload``)."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--workload", choices=sorted(WORKLOADS), default=default)
    p.add_argument("--batch-sizes", type=COUNT, nargs="+", default=None,
                   help="default: 25 64 256 for sst, 16 64 for the tagger and treenn, 64 256 for table1")
    p.add_argument("--hidden", type=COUNT, default=150, help="the SST Tree-LSTM's state size")
    p.add_argument("--batches", type=COUNT, default=4, help="batches per timed round")
    p.add_argument("--repeats", type=COUNT, default=repeats, help="timed rounds")
    add_run_flags(p, name, "batch size 8, 2 batches, 3 rounds, on the sample")
    args = p.parse_args(argv)
    args.batch_sizes = args.batch_sizes or WORKLOADS[args.workload]
    if args.quick:
        args.batch_sizes, args.batches, args.repeats = [8], 2, 3
    trees = [] if args.workload == "table1" else sst.load("train", sst.data_dir(args.data_dir, args.quick))
    random.Random(0).shuffle(trees)
    model, examples = workload(args.workload, trees, args.hidden, args.quick)
    return args, model, examples


def main(argv: list[str] | None = None) -> dict:
    args, model, examples = parse_workload(argv, "item_ladder", "sst", 10, __doc__.splitlines()[0])
    runs = []
    for batch_size in args.batch_sizes:
        runs.append(measure(model, examples, batch_size, args.batches, args.repeats))
        r = runs[-1]
        print(f"batch {batch_size}: " + ", ".join(f"{n} {ms:.1f} ms" for n, ms in r["ms"].items())
              + f" (x{r['ratio']:.3f})", flush=True)
    title = f"SST Tree-LSTM, H {args.hidden}" if args.workload == "sst" else args.workload
    print_table(f"{title}: training step (ms)",
                ["batch", "C", *LADDERS, "ratio", *(f"first steps (s), {n}" for n in LADDERS)],
                [[r["batch_size"], r["chunk"], *(f"{r['ms'][n]:.1f}" for n in LADDERS), f"{r['ratio']:.3f}",
                  *(f"{r['first_steps_s'][n]:.1f}" for n in LADDERS)] for r in runs])
    result = {"workload": args.workload, "runs": runs, "hidden": args.hidden, "batches": args.batches,
              "repeats": args.repeats, "fine_item": schedule.FINE_ITEM}

    return save_ratios("item_ladder", result, args, LADDERS)


def save_ratios(name: str, result: dict, args: argparse.Namespace, ways: tuple[str, str]) -> dict:
    """Saves ``result`` (its ``runs`` each with a step-time ``ratio`` of ``ways[1]`` over
    ``ways[0]``) as benchmark ``name``'s results, with a plot of the ratios, and returns it."""
    runs = result["runs"]

    def plot(path: pathlib.Path) -> None:
        with figure(path) as ax:
            ax.plot([r["batch_size"] for r in runs], [r["ratio"] for r in runs], marker="o")
            ax.axhline(1, color="k", lw=0.5)
            ax.set_xscale("log", base=2)
            ax.set_xlabel("examples per batch")
            ax.set_ylabel(f"step time, {ways[1]} / {ways[0]}")

    save_results(name, result, args, plot)
    return result


if __name__ == "__main__":
    main()
