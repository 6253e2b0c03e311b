"""fold and DyNet's automatic batching trained on the same batches, taking turns.

Each peer is a *step generator*: every ``next`` trains on its next batch, reads the loss (as a
training loop that logs does) and returns it. ``race`` warms each up (fold compiles its layout
there), then times rounds of the same number of batches, the peers taking turns so that a shared
machine's drift reaches both alike. Used by ``benchmarks.dynet_tagger`` and
``benchmarks.dynet_treenn``.
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import optax

import fold as fd
from benchmarks.common import figure, make_train_step
from examples.common import COUNT, print_table

Steps = Iterator[float]
"""A peer: each ``next`` trains one batch and returns its loss."""

FOLD, DYNET = "fold", "DyNet autobatch"

# DyNet's memory pool is allocated up front and cannot grow under autobatching.
DYNET_MEMORY_MB = 2048


def add_race_flags(p: argparse.ArgumentParser, batch_sizes: list[int]) -> None:
    """``--batch-sizes``, ``--warmup``, ``--batches`` and ``--rounds``."""
    p.add_argument("--batch-sizes", type=COUNT, nargs="+", default=batch_sizes)
    p.add_argument("--warmup", type=COUNT, default=20, help="batches run before timing (fold compiles there)")
    p.add_argument("--batches", type=COUNT, default=40, help="batches timed per round")
    p.add_argument("--rounds", type=COUNT, default=3, help="timed rounds, taking turns")


def start_dynet(mem_mb: int = DYNET_MEMORY_MB) -> Any:
    """The ``dynet`` module, configured for automatic batching with a memory pool of ``mem_mb``
    (``pip install dynet38``). DyNet reads its configuration once, at its first import: later
    calls return the module as the first configured it."""
    import dynet_config

    dynet_config.set(mem=mem_mb, autobatch=1, random_seed=1)
    import dynet

    return dynet


def batches_of(examples: Sequence[Any], batch_size: int) -> Iterator[Sequence[Any]]:
    """``examples`` in batches of ``batch_size``, over and over; the last partial batch is dropped,
    as ``compiler.batches(..., drop_remainder=True)`` drops it."""
    while True:
        for i in range(0, len(examples) - batch_size + 1, batch_size):
            yield examples[i:i + batch_size]


def fold_steps(compiler: fd.Compiler, params: Any, optimizer: optax.GradientTransformation,
               examples: Sequence[Any], batch_size: int) -> Steps:
    """fold as a peer: each ``next`` runs one jitted ``optimizer`` step on the summed ``loss`` metric
    of the next batch of ``compiler.batches`` (built ahead on a thread) and reads the loss. The
    step updates the parameters and the optimizer's state in place, as DyNet's trainers do (a
    copy of ``params``, which the caller keeps)."""
    step = make_train_step(compiler, optimizer, total=True, donate=True)
    params = jax.tree_util.tree_map(jnp.copy, params)
    opt_state = optimizer.init(params)
    while True:
        # DyNet's loops drop the last, partial batch too: it would compile once more inside the timing.
        for batch in compiler.batches(examples, batch_size, drop_remainder=True):
            params, opt_state, loss = step(params, opt_state, batch, None)
            yield float(loss)


def _timed(steps: Steps, n: int) -> tuple[float, list[float]]:
    """Seconds for the next ``n`` steps of ``steps``, and their losses."""
    start = time.perf_counter()
    losses = [next(steps) for _ in range(n)]
    return time.perf_counter() - start, losses


def race(peers: dict[str, Steps], batch_size: int, args: argparse.Namespace) -> dict[str, Any]:
    """Times ``peers`` (``FOLD`` and ``DYNET``) on ``args.batches`` batches per round after
    ``args.warmup``, ``args.rounds`` rounds taking turns: sentences per second (median round),
    fold over DyNet, each round's seconds and each peer's mean loss over the timed batches."""
    for steps in peers.values():
        _timed(steps, args.warmup)
    seconds: dict[str, list[float]] = {name: [] for name in peers}
    losses: dict[str, list[float]] = {name: [] for name in peers}
    for _ in range(args.rounds):
        for name, steps in peers.items():
            s, ls = _timed(steps, args.batches)
            seconds[name].append(s)
            losses[name] += ls
    rate = {name: args.batches * batch_size / statistics.median(s) for name, s in seconds.items()}
    run = {"batch_size": batch_size, "sentences_per_s": rate, "fold_vs_dynet": rate[FOLD] / rate[DYNET],
           "seconds": seconds, "mean_loss": {name: statistics.mean(v) for name, v in losses.items()}}
    print(f"batch {batch_size}: " + ", ".join(f"{n} {r:.0f} sentences/s" for n, r in rate.items())
          + f" (fold x{run['fold_vs_dynet']:.2f}; mean losses "
          + ", ".join(f"{n} {v:.4g}" for n, v in run["mean_loss"].items()) + ")", flush=True)
    return run


def report(title: str, runs: list[dict[str, Any]]) -> Callable[[pathlib.Path], None]:
    """Prints ``runs`` (from ``race``) as a table; returns the function that plots them."""
    print_table(title, ["batch", FOLD, DYNET, "fold / DyNet"],
                [[r["batch_size"], f"{r['sentences_per_s'][FOLD]:.0f}", f"{r['sentences_per_s'][DYNET]:.0f}",
                  f"{r['fold_vs_dynet']:.2f}"] for r in runs])

    def plot(path: pathlib.Path) -> None:
        with figure(path) as ax:
            for name in (FOLD, DYNET):
                ax.plot([r["batch_size"] for r in runs], [r["sentences_per_s"][name] for r in runs], marker="o",
                        label=name)
            ax.set_xscale("log", base=2)
            ax.set_xlabel("batch size")
            ax.set_ylabel("training sentences / s")
            ax.set_title(title, fontsize=9)
            ax.legend()

    return plot
