"""How much host work ``compiler.batches``' background thread hides beside an accelerator's step.

``compiler.batches`` builds the next batches on a thread of the caller's
process (``prefetch=True``, the default), so a loop that waits for its loss
every step need not wait for the host as well. How much that hides depends
on whether the step leaves the host a core: beside a GPU or TPU it does, on
this machine's two CPU cores XLA takes both (``benchmarks.sst_styles``
measures that case, with a real step).

This machine has no accelerator, so the step is simulated by the one thing
the host does during an accelerator's step: waiting for it, with the GIL
released (``time.sleep``). For each SST batch size it measures the host's
time to build a batch (``host``), then a loop over ``compiler.batches`` of a
step of ``--step-ratios`` times that, building in the caller
(``prefetch=False``) and on the thread. A perfect overlap takes
``max(host, step)`` per batch; building in the caller, ``host + step``
(measured: somewhat more, as the host's work runs slower after each wait).
*hidden* is the share of that difference the thread took off the loop:
``(in caller - prefetched) / (in caller - ideal)``.

Run: ``python -m benchmarks.prefetch --data-dir DIR`` (``--quick``: the committed sample).
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable

import fold as fd
from benchmarks import models
from benchmarks.common import add_run_flags, figure, interleaved_medians, save_results
from examples import sst
from examples.common import COUNT, RATE, print_table


def loop(compiler: fd.Compiler, trees: list, batch_size: int, step_s: float | None,
         prefetch: bool) -> Callable[[], None]:
    """One pass over ``trees`` in batches, each followed by a simulated step of ``step_s`` seconds
    (None: no step, only building)."""
    def run() -> None:
        for _ in compiler.batches(trees, batch_size, prefetch=prefetch):
            if step_s is not None:
                time.sleep(step_s)
    return run


def measure(compiler: fd.Compiler, trees: list, batch_size: int, ratios: list[float],
            repeats: int) -> list[dict]:
    """One row per step ratio: per-batch milliseconds of the host alone, of the loop building in
    the caller and on the thread, and the share of a perfect overlap's gain the thread reached."""
    n = len(trees) // batch_size
    trees = trees[:n * batch_size]
    host = interleaved_medians({"host": loop(compiler, trees, batch_size, None, False)}, repeats)["host"] / n
    rows = []
    for ratio in ratios:
        step = ratio * host
        loops = {p: loop(compiler, trees, batch_size, step, p) for p in (False, True)}
        seconds = interleaved_medians({str(p): f for p, f in loops.items()}, repeats)
        caller, thread = seconds["False"] / n, seconds["True"] / n
        ideal = max(host, step)
        rows.append({"batch_size": batch_size, "step_ratio": ratio, "host_ms": 1e3 * host, "step_ms": 1e3 * step,
                     "in_caller_ms": 1e3 * caller, "prefetched_ms": 1e3 * thread,
                     "ideal_ms": 1e3 * ideal, "hidden": (caller - thread) / (caller - ideal)})
    return rows


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-sizes", type=COUNT, nargs="+", default=[25, 64, 256])
    p.add_argument("--step-ratios", type=RATE, nargs="+", default=[0.5, 1.0, 3.0],
                   help="simulated step time, as a multiple of the host's time per batch")
    p.add_argument("--batches", type=COUNT, default=24, help="batches per timed loop")
    p.add_argument("--repeats", type=COUNT, default=5, help="rounds, each timing every loop in turn")
    add_run_flags(p, "prefetch", "a few small batches of sample trees")
    args = p.parse_args(argv)
    if args.quick:
        args.batch_sizes, args.step_ratios, args.batches, args.repeats = [4], [1.0], 4, 2
    trees = sst.load("train", sst.data_dir(args.data_dir, args.quick))
    random.Random(0).shuffle(trees)
    compiler = fd.Compiler.create(models.sst_model(sst.vocabulary(trees)))
    rows = []
    for batch_size in args.batch_sizes:
        rows += measure(compiler, trees[:args.batches * batch_size], batch_size, args.step_ratios, args.repeats)
    print_table("SST batches with a simulated accelerator step: ms per batch",
                ["batch", "step / host", "host", "step", "in caller", "prefetched", "ideal", "hidden"],
                [[r["batch_size"], f"{r['step_ratio']:g}", f"{r['host_ms']:.1f}", f"{r['step_ms']:.1f}",
                  f"{r['in_caller_ms']:.1f}", f"{r['prefetched_ms']:.1f}", f"{r['ideal_ms']:.1f}",
                  f"{100 * r['hidden']:.0f} %"] for r in rows])
    result = {"batches": args.batches, "repeats": args.repeats, "rows": rows}

    def plot(path) -> None:
        with figure(path, (7, 3)) as ax:
            labels = [f"b{r['batch_size']}, x{r['step_ratio']:g}" for r in rows]
            for key, name in (("in_caller_ms", "in caller"), ("prefetched_ms", "prefetched"), ("ideal_ms", "ideal")):
                ax.plot(labels, [r[key] for r in rows], "o-", label=name)
            ax.set_ylabel("ms per batch")
            ax.legend()

    save_results("prefetch", result, args, plot)
    return result


if __name__ == "__main__":
    main()
