"""Loop steps against depths: what scheduling the loop by steps (``fold/scheduler/levels.py``) buys.

fold runs a batch's loop nodes at steps of a list schedule, one operation per step, where depths
would split an operation's calls over several groups (docs/design.md, "Schedule"). This builds
the same batches both ways in one process (depths by swapping the step function for one that
keeps them) and reports, per workload and batch size: loop groups and items, the host's
``build_batch`` time and the training step's device time (loss and every gradient, medians
of runs taking turns), and the largest difference of the loss between the two.

Workloads: the GGNN example (``examples.ggnn``: message and update layers after neighbour sums of
different heights), ``examples.tagger``'s BiLSTM tagger with character LSTMs on SST sentences
(four LSTM cells whose chains differ in length), and random models of the fuzz grammar
(``benchmarks.random_models``, ``every``). The SST Tree-LSTM keeps its depths (one loop
operation), so it is not here.

Run: ``python -m benchmarks.loop_steps --data-dir DIR`` (``--quick``: small, on the committed
sample). Writes ``benchmarks/results/loop_steps.json`` and a plot.
"""

from __future__ import annotations

import argparse
import contextlib
import random
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import fold as fd
from benchmarks import models, random_models
from benchmarks.common import add_run_flags, figure, interleaved_medians, save_results
from examples import ggnn, sst, tagger
from examples.common import COUNT, print_table
from fold.scheduler import schedule

WAYS = ("depths", "steps")


@contextlib.contextmanager
def depths_kept() -> Iterator[None]:
    """Schedules built inside keep every node at its depth (the loop as Fold batches it)."""
    def keep(n_op: np.ndarray, depth: np.ndarray, producer: np.ndarray, consumer: np.ndarray,
             loop: np.ndarray) -> tuple[np.ndarray, int]:
        return depth, int(depth[loop].max(initial=1))

    steps, schedule.loop_steps = schedule.loop_steps, keep
    try:
        yield
    finally:
        schedule.loop_steps = steps


def _build(compiler: fd.Compiler, examples: list, way: str) -> fd.Batch:
    with depths_kept() if way == "depths" else contextlib.nullcontext():
        return compiler.build_batch(examples)


def _loss(result: fd.Result) -> jax.Array:
    """The ``loss`` metric's sum, or (a random model) the sum of its float outputs."""
    if "loss" in result.metrics:
        return result.metrics["loss"].sum()
    return sum(jnp.sum(x) for x in jax.tree_util.tree_leaves(result.outputs) if jnp.issubdtype(x.dtype, jnp.floating))


def measure(name: str, compiler: fd.Compiler, examples: list, repeats: int) -> dict[str, Any]:
    """Both ways on one batch of ``examples``."""
    params = compiler.init(jax.random.key(0))
    grad = jax.jit(jax.value_and_grad(lambda p, b: _loss(compiler.apply(p, b))))
    batches = {way: _build(compiler, examples, way) for way in WAYS}
    losses = {way: float(jax.block_until_ready(grad(params, b))[0]) for way, b in batches.items()}
    builds: dict[str, Callable[[], Any]] = {way: lambda way=way: _build(compiler, examples, way) for way in WAYS}
    steps: dict[str, Callable[[], Any]] = {way: lambda b=b: jax.block_until_ready(grad(params, b))
                                           for way, b in batches.items()}
    build_ms = {way: 1000 * s for way, s in interleaved_medians(builds, repeats).items()}
    step_ms = {way: 1000 * s for way, s in interleaved_medians(steps, repeats).items()}
    return {"workload": name, "examples": len(examples), "nodes": batches["steps"].stats.num_nodes,
            "loop_groups": {way: len(b.stats.group_rows) for way, b in batches.items()},
            "loop_items": {way: b.stats.num_items for way, b in batches.items()},
            "build_ms": build_ms, "step_ms": step_ms,
            "step_speedup": step_ms["depths"] / step_ms["steps"],
            "loss_difference": abs(losses["depths"] - losses["steps"]) / max(abs(losses["depths"]), 1.0)}


def workloads(args: argparse.Namespace) -> Iterator[tuple[str, fd.Compiler, list]]:
    compiler = fd.Compiler.create(ggnn.build_model(32, 4))
    for size in args.graphs:
        yield f"GGNN, {size} graphs", compiler, ggnn.make_data(random.Random(size), size, (10, 30), 0.3, 4)
    trees = sst.load("train", sst.data_dir(args.data_dir, args.quick))
    random.Random(0).shuffle(trees)
    sentences = tagger.examples_of(trees)
    compiler = fd.Compiler.create(models.tagger_model(sentences, 50))
    for size in args.sentences:
        yield f"tagger, {size} sentences", compiler, sentences[:size]
    for seed in range(args.random_models):
        model = random_models.random_model(seed, n=args.random_examples, depth=4, rich=True, users=True,
                                           every=True)
        yield f"random model {seed}", fd.Compiler.create(model.block), model.examples


def plot(result: dict[str, Any]) -> Callable[[Any], None]:
    def draw(path: Any) -> None:
        runs = result["runs"]
        with figure(path, (7, 3.5)) as ax:
            x = np.arange(len(runs))
            ax.bar(x - 0.2, [r["loop_items"]["depths"] / max(r["loop_items"]["steps"], 1) for r in runs], 0.4,
                   label="items, depths / steps")
            ax.bar(x + 0.2, [r["step_speedup"] for r in runs], 0.4, label="step time, depths / steps")
            ax.axhline(1, color="gray", lw=0.5)
            ax.set_xticks(x, [r["workload"] for r in runs], rotation=60, ha="right", fontsize=7)
            ax.set(title="Loop steps against depths", ylabel="ratio")
            ax.legend(fontsize=7)
    return draw


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--graphs", type=COUNT, nargs="+", default=[8, 32, 128], help="GGNN batch sizes")
    p.add_argument("--sentences", type=COUNT, nargs="+", default=[16, 64], help="tagger batch sizes")
    p.add_argument("--random-models", type=int, default=8, help="random models (seeds 0, 1, ...)")
    p.add_argument("--random-examples", type=COUNT, default=64, help="examples per random model's batch")
    p.add_argument("--repeats", type=COUNT, default=9)
    add_run_flags(p, "loop_steps", "a few small batches on the committed sample")
    args = p.parse_args(argv)
    if args.quick:
        args.graphs, args.sentences, args.random_models, args.random_examples, args.repeats = [4], [4], 1, 8, 2
    runs = []
    for name, compiler, examples in workloads(args):
        runs.append(measure(name, compiler, examples, args.repeats))
        print(f"{name}: done", flush=True)
    print_table("Loop steps against depths",
                ["workload", "items (depths, steps)", "build ms", "step ms", "step speedup"],
                [[r["workload"], f"{r['loop_items']['depths']}, {r['loop_items']['steps']}",
                  f"{r['build_ms']['depths']:.1f} -> {r['build_ms']['steps']:.1f}",
                  f"{r['step_ms']['depths']:.2f} -> {r['step_ms']['steps']:.2f}", f"{r['step_speedup']:.2f}x"]
                 for r in runs])
    result = {"args": {k: v for k, v in vars(args).items() if k != "json"}, "runs": runs}
    save_results("loop_steps", result, args, plot(result))
    return result


if __name__ == "__main__":
    main()
