"""Leaving a CPU core to the host (``fd.reserve_host_cores``): what it gives and what it costs.

On a CPU backend, XLA's threads and the thread that builds the next batch (``compiler.batches``)
share the cores. For each model and batch size, and for each number of reserved cores, a fresh
process (the reservation acts when JAX starts) measures, per batch:

- ``step``: the jitted training step alone, on batches built before (median of the steps);
- ``loop``: a training loop as a user writes one: ``compiler.batches`` building on its thread,
  one step per batch, the loss read after each (``float(loss)``), over ``--batches`` batches;
- ``build``: building one batch alone, on the host.

Models: the BiLSTM tagger with character LSTMs (``examples.tagger``, the suite's sizes: a step
of many small operations) and the SST Tree-LSTM (H 150: a step of larger matmuls).

Run: ``python -m benchmarks.host_cores --data-dir DIR`` (``--quick``: the committed sample).
Writes ``benchmarks/results/host_cores.json``.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import random
import statistics
import subprocess
import sys
import time
from typing import Any

from benchmarks.common import add_run_flags, figure, save_results
from examples import sst
from examples.common import COUNT, print_table

MODELS = ("tagger", "sst")


def _worker(model: str, batch_size: int, batches: int, data_dir: str | None, quick: bool) -> dict[str, float]:
    """In this process (its cores already reserved or not): per-batch seconds of the step alone,
    of the training loop and of building alone."""
    import jax
    import optax

    import fold as fd
    from benchmarks import models
    from benchmarks.common import make_train_step
    from examples import tagger

    trees = sst.load("train", sst.data_dir(data_dir, quick))
    random.Random(0).shuffle(trees)
    if model == "tagger":
        examples = tagger.examples_of(trees)
        compiler = fd.Compiler.create(models.tagger_model(examples))
        optimizer, total = optax.sgd(0.01), True
    else:
        examples = trees
        compiler = fd.Compiler.create(models.sst_model(sst.vocabulary(trees), 150))
        optimizer, total = optax.sgd(0.05), False
    examples = (examples * (1 + batch_size * batches // len(examples)))[:batch_size * batches]
    step = make_train_step(compiler, optimizer, total=total)
    params = compiler.init(jax.random.key(0))
    opt_state = optimizer.init(params)
    built = list(compiler.batches(examples, batch_size, drop_remainder=True, prefetch=False))
    for batch in built:  # every layout compiles here, not in the timings
        params, opt_state, loss = step(params, opt_state, batch, None)
        float(loss)
    steps = []
    for batch in built:
        start = time.perf_counter()
        params, opt_state, loss = step(params, opt_state, batch, None)
        float(loss)
        steps.append(time.perf_counter() - start)
    start = time.perf_counter()
    for batch in compiler.batches(examples, batch_size, drop_remainder=True):
        params, opt_state, loss = step(params, opt_state, batch, None)
        float(loss)
    loop = (time.perf_counter() - start) / len(built)
    start = time.perf_counter()
    for _ in compiler.batches(examples, batch_size, drop_remainder=True, prefetch=False):
        pass
    build = (time.perf_counter() - start) / len(built)
    return {"step": statistics.median(steps), "loop": loop, "build": build}


def _in_process(model: str, batch_size: int, reserve: int, args: argparse.Namespace) -> dict[str, float]:
    """``_worker`` in a fresh interpreter that reserved ``reserve`` cores first."""
    code = ("import json, sys, fold as fd\n"
            f"if {reserve}: fd.reserve_host_cores({reserve})\n"
            "from benchmarks.host_cores import _worker\n"
            f"print(json.dumps(_worker({model!r}, {batch_size}, {args.batches}, {args.data_dir!r}, {args.quick})))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False,
                         cwd=pathlib.Path(__file__).resolve().parents[1])
    if out.returncode:
        raise RuntimeError(f"the {model} worker (batch {batch_size}, {reserve} reserved) failed:\n{out.stderr}")
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    p.add_argument("--batch-sizes", type=COUNT, nargs="+", default=[16, 64])
    p.add_argument("--batches", type=COUNT, default=60, help="batches per measurement")
    p.add_argument("--rounds", type=COUNT, default=2, help="processes per setting, taking turns (median)")
    add_run_flags(p, "host_cores", "batch size 8, few batches, on the sample")
    args = p.parse_args(argv)
    if args.quick:
        args.batch_sizes, args.batches, args.rounds = [8], 4, 1
    runs = []
    for model in args.models:
        for batch_size in args.batch_sizes:
            rounds: dict[int, list[dict[str, float]]] = {0: [], 1: []}
            for _ in range(args.rounds):
                for reserve in rounds:
                    rounds[reserve].append(_in_process(model, batch_size, reserve, args))
            med = {r: {k: statistics.median(x[k] for x in v) for k in v[0]} for r, v in rounds.items()}
            runs.append({"model": model, "batch_size": batch_size,
                         **{f"{k}_ms_reserved_{r}": 1000 * v for r, m in med.items() for k, v in m.items()},
                         "loop_gain": med[0]["loop"] / med[1]["loop"], "step_cost": med[1]["step"] / med[0]["step"]})
            print(f"{model} batch {batch_size}: loop {1000 * med[0]['loop']:.2f} -> {1000 * med[1]['loop']:.2f} ms "
                  f"a batch with a core reserved, step alone {1000 * med[0]['step']:.2f} -> "
                  f"{1000 * med[1]['step']:.2f} ms", flush=True)
    print_table("per batch, ms (0 or 1 core reserved)",
                ["model", "batch", "build", "step (0)", "step (1)", "loop (0)", "loop (1)", "loop gain"],
                [[r["model"], r["batch_size"], f"{r['build_ms_reserved_0']:.2f}", f"{r['step_ms_reserved_0']:.2f}",
                  f"{r['step_ms_reserved_1']:.2f}", f"{r['loop_ms_reserved_0']:.2f}", f"{r['loop_ms_reserved_1']:.2f}",
                  f"{r['loop_gain']:.2f}x"] for r in runs])

    def plot(path: Any) -> None:
        with figure(path) as ax:
            labels = [f"{r['model']} {r['batch_size']}" for r in runs]
            xs = range(len(runs))
            ax.bar([x - 0.2 for x in xs], [r["loop_ms_reserved_0"] for r in runs], 0.4, label="no core reserved")
            ax.bar([x + 0.2 for x in xs], [r["loop_ms_reserved_1"] for r in runs], 0.4, label="1 core reserved")
            ax.set_xticks(list(xs), labels)
            ax.set_ylabel("training loop, ms per batch")
            ax.legend()

    result = {"runs": runs, "batches": args.batches, "rounds": args.rounds}
    save_results("host_cores", result, args, plot)
    return result


if __name__ == "__main__":
    main()
