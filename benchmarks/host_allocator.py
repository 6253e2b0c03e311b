"""The host allocator's part in a training step: glibc's defaults, freed blocks kept, huge pages.

XLA on the CPU allocates a step's temporaries with ``malloc`` on every call.
glibc serves a block larger than its mmap threshold (which adapts, up to
32 MiB) with fresh pages from the kernel and returns them on ``free``, so a
step whose temporaries exceed that pays a page fault for every 4 KiB page
it touches, every step. Starting Python with

    MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=4294967296 MALLOC_ARENA_MAX=1

keeps such blocks in the heap for the next step (at the price of not
returning freed memory to the system). The third variable matters as much
as the first two: XLA's threads allocate from glibc's per-thread arenas,
whose heaps (64 MiB at most) are unmapped once entirely free, whatever the
thresholds, so without it a batch-64 SST step still took 1,100-9,500 page
faults in different processes, and with it 0-750 (against 9,400 with the
defaults). Each child counts the page faults of its timed steps. On a
2-core CPU the kept blocks removed the faults but not the time, and one
arena slowed steps below the threshold (docs/performance.md). Starting
Python with

    GLIBC_TUNABLES=glibc.malloc.hugetlb=1

(glibc 2.35 or later) leaves glibc's thresholds alone and asks the kernel
for transparent huge pages (``madvise``) on the blocks it maps: a fresh
block then faults in 2 MiB pages instead of 4 KiB ones, some 500 times
fewer faults, where ``/sys/kernel/mm/transparent_hugepage/enabled`` is
``madvise`` or ``always``.

For each batch size and backward mode this runs the SST training step
(``value_and_grad`` + SGD on pre-built batches, H = 150) in child processes,
taking turns with glibc's defaults and with each variant's variables, for
``--rounds`` rounds, and reports the median step time and page faults of each, next to the
step's temporaries (XLA's buffer assignment): the difference should show
only where those exceed the threshold. Without glibc the variables do
nothing.

Run: ``python -m benchmarks.host_allocator`` (``--quick`` for a seconds-long run).
"""

from __future__ import annotations

import argparse
import itertools
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
from benchmarks import memory, models
from benchmarks.common import add_run_flags, figure, make_train_step, median_seconds, save_results
from examples import sst
from examples.common import COUNT, print_table
from fold.compiler.saving import BACKWARDS

KEEP_BLOCKS = {"MALLOC_MMAP_THRESHOLD_": str(2**32), "MALLOC_TRIM_THRESHOLD_": str(2**32), "MALLOC_ARENA_MAX": "1"}
HUGE_PAGES = {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}
VARIANTS = {"default": {}, "keep_blocks": KEEP_BLOCKS, "huge_pages": HUGE_PAGES}
"""Each variant's environment; a child starts with its own only (the parent's values of every
variant's variables are removed)."""
ALLOCATOR_VARIABLES = sorted({k for env in VARIANTS.values() for k in env})


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-sizes", type=COUNT, nargs="+", default=[64, 256])
    p.add_argument("--backward", choices=BACKWARDS, nargs="+", default=["recompute", "save"])
    p.add_argument("--rounds", type=COUNT, default=3, help="child processes per configuration and allocator")
    p.add_argument("--steps", type=COUNT, default=32, help="timed steps per child process")
    p.add_argument("--hidden", type=COUNT, default=150)
    others = [v for v in VARIANTS if v != "default"]
    p.add_argument("--variants", choices=others, nargs="+", default=others,
                   help="allocator settings to compare with glibc's defaults")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    add_run_flags(p, "host_allocator", "the committed sample, tiny model")
    args = p.parse_args(argv)
    if args.quick:
        args.batch_sizes, args.backward, args.rounds, args.steps, args.hidden = [16], ["recompute"], 1, 2, 8
    return args


def child(args: argparse.Namespace) -> dict[str, Any]:
    """Median seconds per training step over ``args.steps`` steps, the page faults per step (minor:
    fresh pages), the step's temporaries, and the allocator variables this process started with."""
    trees = sst.load("train", sst.data_dir(args.data_dir, args.quick))
    rng = random.Random(0)
    compiler = fd.Compiler.create(models.sst_model(sst.vocabulary(trees), state_size=args.hidden),
                                  backward=args.backward[0])
    params = compiler.init(jax.random.key(0))
    optimizer = optax.sgd(0.05)
    opt_state = optimizer.init(params)
    step = make_train_step(compiler, optimizer)
    samples = [rng.sample(trees, min(args.batch_sizes[0], len(trees))) for _ in range(4)]
    temp = memory.measure(compiler, step, params, opt_state, samples[0])["temp_bytes"]
    batches = [jax.device_put(compiler.build_batch(s, exact_layout=True)) for s in samples]
    key = jax.random.key(0)
    for b in batches:  # compiles every layout
        jax.block_until_ready(step(params, opt_state, b, key))
    stream = itertools.cycle(batches)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    seconds = median_seconds(lambda: jax.block_until_ready(step(params, opt_state, next(stream), key)), args.steps)
    faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) / args.steps
    return {"seconds": seconds, "faults_per_step": faults, "temp_bytes": temp,
            "env": {k: os.environ.get(k) for k in ALLOCATOR_VARIABLES}}


def run_child(args: argparse.Namespace, batch_size: int, backward: str, variant: str) -> dict[str, Any]:
    """``child`` in a fresh process: glibc reads its variables once, when the process starts."""
    env = {k: v for k, v in os.environ.items() if k not in ALLOCATOR_VARIABLES}
    env.update(VARIANTS[variant])
    cmd = [sys.executable, "-m", "benchmarks.host_allocator", "--child", "--batch-sizes", str(batch_size),
           "--backward", backward, "--steps", str(args.steps), "--hidden", str(args.hidden)]
    if args.data_dir:
        cmd += ["--data-dir", args.data_dir]
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
    names = ["default", *args.variants]
    for b in args.batch_sizes:
        for backward in args.backward:
            runs: dict[str, list[dict]] = {name: [] for name in names}
            for r in range(args.rounds):
                print(f"batch {b}, backward={backward}: round {r + 1}/{args.rounds} ...", flush=True)
                for name in names:  # taking turns, so that all see the same drift of a shared machine
                    runs[name].append(run_child(args, b, backward, name))
            seconds = {name: statistics.median(x["seconds"] for x in v) for name, v in runs.items()}
            faults = {name: statistics.median(x["faults_per_step"] for x in v) for name, v in runs.items()}
            rows.append({"batch_size": b, "backward": backward, "temp_bytes": runs["default"][0]["temp_bytes"],
                         "seconds": seconds, "faults": faults,
                         "speedup": {name: seconds["default"] / seconds[name] for name in args.variants},
                         "runs": runs})
    print_table(f"SST training step, H={args.hidden}, median of {args.rounds} processes x {args.steps} steps "
                f"(ms, page faults per step; libc: {libc})",
                ["batch", "backward", "temporaries (MiB)", *names, *(f"{v} speedup" for v in args.variants)],
                [[r["batch_size"], r["backward"], f"{r['temp_bytes'] / 2**20:.1f}",
                  *(f"{r['seconds'][n] * 1e3:.1f} ({r['faults'][n]:.0f})" for n in names),
                  *(f"{r['speedup'][v]:.2f}x" for v in args.variants)] for r in rows])
    results = {"args": {k: v for k, v in vars(args).items() if k != "child"}, "libc": libc,
               "variants": {n: VARIANTS[n] for n in names}, "rows": rows}
    save_results("host_allocator", results, args, lambda png: plot(rows, png))
    return results


def plot(rows: list[dict], path: Any) -> None:
    """Per configuration, the median step time under each allocator setting."""
    x = np.arange(len(rows))
    names = list(rows[0]["seconds"]) if rows else []
    width = 0.8 / max(len(names), 1)
    with figure(path) as ax:
        for i, name in enumerate(names):
            ax.bar(x + (i - (len(names) - 1) / 2) * width, [r["seconds"][name] * 1e3 for r in rows], width,
                   label=name.replace("_", " "))
        ax.set(xticks=x, xticklabels=[f"b{r['batch_size']} {r['backward']}" for r in rows], ylabel="ms per step",
               title="SST training step against the host allocator")
        ax.legend()


if __name__ == "__main__":
    main()
