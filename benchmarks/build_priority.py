"""Batch builders at a lower CPU priority than the training loop (``FOLD_BUILD_NICENESS``).

``compiler.batches`` builds the next batches on a thread while the step runs; on Linux that
thread becomes ``--niceness`` nicer than the loop once it has time to spare
(``fold/scheduler/priority.py``). For each model and batch size, two training loops of the same
model take turns in one process: both iterate ``compiler.batches`` over and over (one epoch
after another, the last partial batch dropped), run one jitted step per batch and read its loss
after each (``float(loss)``), as a loop that logs does; one keeps its builder at the loop's own
priority (``FOLD_BUILD_NICENESS=0``), the other lets fold lower it. Reported: examples per
second of each (median round) and their ratio.

Models: the SST Tree-LSTM (H 150, SGD: a step of larger matmuls), DyNet's ``treenn`` (Adam,
``benchmarks.dynet_treenn``) and the BiLSTM tagger with character LSTMs (``examples.tagger``,
the DyNet suite's sizes): steps of many small operations, whose building costs most beside them.

Run: ``python -m benchmarks.build_priority --data-dir DIR`` (``--quick``: the committed sample).
Writes ``benchmarks/results/build_priority.json``.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import statistics
import time
from collections.abc import Iterator
from typing import Any

import jax
import optax

import fold as fd
from benchmarks import dynet_treenn, models
from benchmarks.common import add_run_flags, figure, make_train_step, save_results
from examples import sst, tagger
from examples.common import COUNT, number, print_table
from fold.scheduler import priority

MODELS = ("sst", "treenn", "tagger")
DEFAULT_RUNS = ("sst:25", "sst:64", "sst:256", "treenn:16", "treenn:64", "tagger:16", "tagger:64")
PLAIN, NICER = "plain", "nicer"


def run_spec(text: str) -> tuple[str, int]:
    """``MODEL:BATCH`` as ``(model, batch size)``."""
    model, _, size = text.partition(":")
    if model not in MODELS or not size.isdigit() or int(size) < 1:
        raise argparse.ArgumentTypeError(f"expected MODEL:BATCH with MODEL one of {', '.join(MODELS)} and BATCH a "
                                         f"positive integer, got {text!r}")
    return model, int(size)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=run_spec, nargs="+", default=[run_spec(r) for r in DEFAULT_RUNS],
                   help=f"MODEL:BATCH pairs (default: {' '.join(DEFAULT_RUNS)})")
    p.add_argument("--niceness", type=number(int, 1, 19), default=priority.BUILD_NICENESS,
                   help="what the nicer loop's builder adds to its niceness")
    p.add_argument("--warmup", type=COUNT, default=20, help="batches each loop runs before timing (compilations)")
    p.add_argument("--batches", type=COUNT, default=40, help="batches timed per round")
    p.add_argument("--rounds", type=COUNT, default=5, help="timed rounds, the two loops taking turns")
    add_run_flags(p, "build_priority", "one small run per model on the sample")
    args = p.parse_args(argv)
    if args.quick:
        args.runs = [("sst", 4), ("treenn", 4), ("tagger", 4)]
        args.warmup, args.batches, args.rounds = 2, 3, 1
    return args


def _model(model: str, trees: list) -> tuple[fd.Compiler, optax.GradientTransformation, bool, list]:
    """The compiler, optimizer, whether the loss is summed (as DyNet's scripts train) and examples."""
    if model == "sst":
        return fd.Compiler.create(models.sst_model(sst.vocabulary(trees), 150)), optax.sgd(0.05), False, trees
    if model == "treenn":
        return (fd.Compiler.create(dynet_treenn.build_model(dynet_treenn.vocabulary(trees))),
                optax.adam(dynet_treenn.LEARNING_RATE), True, trees)
    examples = tagger.examples_of(trees)
    sizes = tagger.parse_args([])
    word_idx, char_idx = tagger.vocabularies(examples, sizes.min_count)
    return (fd.Compiler.create(tagger.build_model(word_idx, char_idx, sizes)),
            optax.chain(optax.clip_by_global_norm(5.0), optax.sgd(0.01)), True, examples)


def _loop(model: str, trees: list, batch_size: int, niceness: int) -> Iterator[float]:
    """One batch's step per ``next``, its loss read, over epoch after epoch of ``compiler.batches``,
    each stream read with ``FOLD_BUILD_NICENESS=niceness`` (its builder reads it when it starts)."""
    compiler, optimizer, total, examples = _model(model, trees)
    if len(examples) < batch_size:
        raise SystemExit(f"{len(examples)} examples hold no batch of {batch_size}")
    step = make_train_step(compiler, optimizer, total=total, donate=True)
    params = compiler.init(jax.random.key(0))
    opt_state = optimizer.init(params)
    while True:
        stream = iter(compiler.batches(examples, batch_size, drop_remainder=True))
        while True:
            saved = os.environ.get(priority.ENV)
            os.environ[priority.ENV] = str(niceness)
            try:
                batch = next(stream, None)
            finally:
                if saved is None:
                    del os.environ[priority.ENV]
                else:
                    os.environ[priority.ENV] = saved
            if batch is None:
                break
            params, opt_state, loss = step(params, opt_state, batch, None)
            yield float(loss)


class _Lowerings(logging.Handler):
    """Collects fold's messages that a builder lowered its priority (the plain loop's never do)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if "time to spare" in record.getMessage():
            self.messages.append(record.getMessage())


def race(model: str, batch_size: int, trees: list, args: argparse.Namespace) -> dict[str, Any]:
    """Both loops of ``model`` at ``batch_size``, taking turns: examples/s and the ratio."""
    loops = {PLAIN: _loop(model, trees, batch_size, 0), NICER: _loop(model, trees, batch_size, args.niceness)}
    lowered, logger = _Lowerings(), logging.getLogger("fold")
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(lowered)
    for loop in loops.values():
        for _ in range(args.warmup):
            next(loop)
    seconds: dict[str, list[float]] = {name: [] for name in loops}
    for _ in range(args.rounds):
        for name, loop in loops.items():
            start = time.perf_counter()
            for _ in range(args.batches):
                next(loop)
            seconds[name].append(time.perf_counter() - start)
    logger.removeHandler(lowered)
    logger.setLevel(level)
    rate = {name: args.batches * batch_size / statistics.median(s) for name, s in seconds.items()}
    run = {"model": model, "batch_size": batch_size, "examples_per_s": rate, "speedup": rate[NICER] / rate[PLAIN],
           "seconds": seconds, "lowered": lowered.messages}
    print(f"{model}, batch {batch_size}: {rate[PLAIN]:.0f} examples/s, {rate[NICER]:.0f} with builders "
          f"{args.niceness} nicer once they have time to spare (x{run['speedup']:.3f}; "
          f"{len(lowered.messages)} streams lowered theirs)", flush=True)
    return run


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    trees = sst.load("train", sst.data_dir(args.data_dir, args.quick))
    random.Random(0).shuffle(trees)
    runs = [race(model, batch_size, trees, args) for model, batch_size in args.runs]
    print_table(f"training loops reading the loss every step, builders at the loop's priority and "
                f"{args.niceness} nicer once they have time to spare (examples/s)",
                ["model", "batch", "plain", "nicer", "nicer / plain", "builders lowered"],
                [[r["model"], r["batch_size"], f"{r['examples_per_s'][PLAIN]:.0f}",
                  f"{r['examples_per_s'][NICER]:.0f}", f"{r['speedup']:.3f}", len(r["lowered"])] for r in runs])

    def plot(path: Any) -> None:
        with figure(path) as ax:
            labels = [f"{r['model']}\n{r['batch_size']}" for r in runs]
            ax.bar(labels, [r["speedup"] for r in runs])
            ax.axhline(1.0, color="grey", linewidth=0.8)
            ax.set_ylabel(f"examples/s, builders {args.niceness} nicer / plain")

    result = {"runs": runs, "niceness": args.niceness, "warmup": args.warmup, "batches": args.batches,
              "rounds": args.rounds}
    save_results("build_priority", result, args, plot)
    return result


if __name__ == "__main__":
    main()
