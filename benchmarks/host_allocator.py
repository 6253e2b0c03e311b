"""The host allocator's part in a training step: fold's kept blocks against glibc's defaults.

XLA on the CPU allocates a step's temporaries with ``malloc`` on every call.
glibc serves a block larger than its mmap threshold (which adapts, up to
32 MiB) with fresh pages from the kernel and returns them on ``free``, and
returns free memory at the top of a heap past its trim threshold, so a step
whose temporaries take tens of MiB pays a page fault for every 4 KiB page
it touches, every step. ``Compiler.create`` raises both thresholds
(``fd.keep_host_memory``, fold/host_memory.py) unless the process chose
otherwise; ``FOLD_KEEP_HOST_MEMORY=0`` leaves glibc's defaults.

Variants, each a child process's environment:

- ``glibc``: ``FOLD_KEEP_HOST_MEMORY=0``, glibc's adaptive defaults;
- ``kept``: fold's default, blocks up to 64 MiB kept in the heap;
- ``huge_pages``: glibc's defaults with ``GLIBC_TUNABLES=glibc.malloc.hugetlb=1``
  (glibc 2.35 or later): fresh blocks fault in 2 MiB pages where
  ``/sys/kernel/mm/transparent_hugepage/enabled`` is ``madvise`` or ``always``;
- ``kept_huge_pages``: both.

For each batch size this runs the SST training step (``value_and_grad`` +
SGD, H = 150) in child processes taking turns, ``--rounds`` rounds, on
batches built by ``compiler.build_batch`` (in the layouts a training loop
gets): the step alone on batches built before, and the blocking loop (build,
step, read the loss). It reports median times and page faults per step,
next to the step's temporaries (XLA's buffer assignment), and each
process's peak resident size (what keeping memory costs). Without glibc the
settings do nothing.

Run: ``python -m benchmarks.host_allocator`` (``--quick`` for a seconds-long run).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import statistics
import subprocess
import sys
from typing import Any

import jax
import numpy as np
import optax

import fold as fd
from benchmarks import models
from benchmarks.common import add_run_flags, figure, make_train_step, median_seconds, save_results
from examples import sst
from examples.common import COUNT, print_table
from fold import host_memory
from fold.compiler.saving import BACKWARDS

GLIBC = {host_memory.ENV: "0"}
HUGE_PAGES = {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}
VARIANTS = {"glibc": GLIBC, "kept": {}, "huge_pages": {**GLIBC, **HUGE_PAGES}, "kept_huge_pages": HUGE_PAGES}
"""Each variant's environment; a child starts with its own only (the parent's values of every
variant's variables, and of glibc's own malloc variables, are removed)."""
ALLOCATOR_VARIABLES = sorted({k for env in VARIANTS.values() for k in env}
                             | {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_ARENA_MAX"})


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-sizes", type=COUNT, nargs="+", default=[16, 64, 256])
    p.add_argument("--backward", choices=BACKWARDS, default="auto")
    p.add_argument("--rounds", type=COUNT, default=3, help="child processes per batch size and variant")
    p.add_argument("--batches", type=COUNT, default=8, help="batches per timed loop")
    p.add_argument("--repeats", type=COUNT, default=3, help="timed loops per child process (median)")
    p.add_argument("--hidden", type=COUNT, default=150)
    others = [v for v in VARIANTS if v != "glibc"]
    p.add_argument("--variants", choices=others, nargs="+", default=others,
                   help="allocator settings to compare with glibc's defaults")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    add_run_flags(p, "host_allocator", "the committed sample, tiny model")
    args = p.parse_args(argv)
    if args.quick:
        args.batch_sizes, args.rounds, args.batches, args.repeats, args.hidden = [16], 1, 2, 1, 8
    return args


def child(args: argparse.Namespace) -> dict[str, Any]:
    """Seconds per training step on batches built before and per batch of the blocking loop
    (medians of ``args.repeats`` loops), the page faults per step (minor: fresh pages), the
    step's temporaries, the process's peak resident size (what keeping memory costs), and the
    allocator variables this process started with."""
    trees = sst.load("train", sst.data_dir(args.data_dir, args.quick))
    rng = random.Random(0)
    compiler = fd.Compiler.create(models.sst_model(sst.vocabulary(trees), state_size=args.hidden),
                                  backward=args.backward)
    params = compiler.init(jax.random.key(0))
    optimizer = optax.sgd(0.05)
    opt_state = optimizer.init(params)
    step = make_train_step(compiler, optimizer)
    chunks = [rng.sample(trees, min(args.batch_sizes[0], len(trees))) for _ in range(args.batches)]
    built = [jax.device_put(compiler.build_batch(c)) for c in chunks]
    temp = step.lower(params, opt_state, built[0], None).compile().memory_analysis().temp_size_in_bytes

    def steps() -> None:
        p, s = params, opt_state
        for b in built:
            p, s, loss = step(p, s, b, None)
            float(loss)

    def loop() -> None:
        p, s = params, opt_state
        for c in chunks:
            p, s, loss = step(p, s, compiler.build_batch(c), None)
            float(loss)

    steps()  # compiles every layout the batches have
    loop()
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    step_seconds = median_seconds(steps, args.repeats) / len(built)
    faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / (args.repeats * len(built))
    loop_seconds = median_seconds(loop, args.repeats) / len(chunks)
    return {"step_seconds": step_seconds, "loop_seconds": loop_seconds, "faults_per_step": faults, "temp_bytes": temp,
            "max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "env": {k: os.environ.get(k) for k in ALLOCATOR_VARIABLES}}


def run_child(args: argparse.Namespace, batch_size: int, variant: str) -> dict[str, Any]:
    """``child`` in a fresh process: glibc's thresholds, once set, stay for the process."""
    env = {k: v for k, v in os.environ.items() if k not in ALLOCATOR_VARIABLES}
    env.update(VARIANTS[variant])
    cmd = [sys.executable, "-m", "benchmarks.host_allocator", "--child", "--batch-sizes", str(batch_size),
           "--backward", args.backward, "--batches", str(args.batches), "--repeats", str(args.repeats),
           "--hidden", str(args.hidden)]
    if args.data_dir:
        cmd += ["--data-dir", args.data_dir]
    if args.quick:
        cmd.append("--quick")
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if out.returncode:
        raise RuntimeError(f"the child step failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.child:
        result = child(args)
        print(json.dumps(result))
        return result
    libc = " ".join(platform.libc_ver()).strip() or "not glibc"
    rows = []
    names = ["glibc", *args.variants]
    for b in args.batch_sizes:
        runs: dict[str, list[dict]] = {name: [] for name in names}
        for r in range(args.rounds):
            print(f"batch {b}: round {r + 1}/{args.rounds} ...", flush=True)
            for name in names:  # taking turns, so that all see the same drift of a shared machine
                runs[name].append(run_child(args, b, name))
        med = {what: {name: statistics.median(x[what] for x in v) for name, v in runs.items()}
               for what in ("step_seconds", "loop_seconds", "faults_per_step", "max_rss_bytes")}
        rows.append({"batch_size": b, "temp_bytes": runs["glibc"][0]["temp_bytes"], **med,
                     "step_speedup": {n: med["step_seconds"]["glibc"] / med["step_seconds"][n] for n in args.variants},
                     "loop_speedup": {n: med["loop_seconds"]["glibc"] / med["loop_seconds"][n] for n in args.variants},
                     "runs": runs})
    print_table(f"SST training, H={args.hidden}, backward={args.backward}, median of {args.rounds} processes: ms per "
                f"step on built batches (page faults per step) and per batch of the blocking loop (libc: {libc})",
                ["batch", "temporaries (MiB)", *(f"{n} step" for n in names), *(f"{n} loop" for n in names),
                 *(f"{n} peak RSS (MiB)" for n in names), *(f"{v} speedup (step, loop)" for v in args.variants)],
                [[r["batch_size"], f"{r['temp_bytes'] / 2**20:.1f}",
                  *(f"{r['step_seconds'][n] * 1e3:.1f} ({r['faults_per_step'][n]:.0f})" for n in names),
                  *(f"{r['loop_seconds'][n] * 1e3:.1f}" for n in names),
                  *(f"{r['max_rss_bytes'][n] / 2**20:.0f}" for n in names),
                  *(f"{r['step_speedup'][v]:.2f}x, {r['loop_speedup'][v]:.2f}x" for v in args.variants)]
                 for r in rows])
    results = {"args": {k: v for k, v in vars(args).items() if k != "child"}, "libc": libc,
               "variants": {n: VARIANTS[n] for n in names}, "rows": rows}
    save_results("host_allocator", results, args, lambda png: plot(rows, png))
    return results


def plot(rows: list[dict], path: Any) -> None:
    """Per configuration, the median step time under each allocator setting."""
    x = np.arange(len(rows))
    names = list(rows[0]["step_seconds"]) if rows else []
    width = 0.8 / max(len(names), 1)
    with figure(path) as ax:
        for i, name in enumerate(names):
            ax.bar(x + (i - (len(names) - 1) / 2) * width, [r["step_seconds"][name] * 1e3 for r in rows], width,
                   label=name.replace("_", " "))
        ax.set(xticks=x, xticklabels=[f"batch {r['batch_size']}" for r in rows], ylabel="ms per step",
               title="SST training step against the host allocator")
        ax.legend()


if __name__ == "__main__":
    main()
