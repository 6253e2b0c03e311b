"""The loop's backward pass: recomputing each item's forward pass against saving its matmuls.

For each workload and batch size, the same batch's training step is
compiled once per ``--modes`` value of ``Compiler.create(backward=...)``
and timed in turns (median of ``--repeats`` rounds, device only: batches
are built and put on the device first), next to XLA's buffer assignment for
the step (``temporaries``: what it allocates besides arguments and
outputs). Workloads: the SST Tree-LSTM (H = ``--hidden``, SGD on the
per-node loss) on real SST trees, the Table 1 model (H = 256, SGD on
``0.5 * sum(root ** 2)``) on random 128-leaf trees, and two stacked weave
modules (``examples.weave``, width ``--weave-hidden``, SGD on the squared
error) on random molecules of 4-10 atoms: narrow matmuls, which
``backward="auto"`` does not save (``SAVE_INTENSITY``).

Run: ``python -m benchmarks.backward`` (``--quick`` for a seconds-long run).
"""

from __future__ import annotations

import argparse
import random
from typing import Any

import jax
import numpy as np

import fold as fd
from benchmarks import models
from benchmarks.common import add_run_flags, figure, interleaved_medians, save_results
from benchmarks.executor import training_step
from examples import sst, weave
from examples.common import COUNT, print_table
from fold.compiler.saving import BACKWARDS, saved_buffer_bytes


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--modes", nargs="+", choices=BACKWARDS, default=list(BACKWARDS))
    p.add_argument("--sst-batches", type=COUNT, nargs="*", default=[25, 64, 128, 256])
    p.add_argument("--tree-batches", type=COUNT, nargs="*", default=[1, 32, 64, 256],
                   help="batches of random trees (Table 1 model)")
    p.add_argument("--hidden", type=COUNT, default=150, help="SST state size (the Table 1 model uses 256)")
    p.add_argument("--weave-batches", type=COUNT, nargs="*", default=[32, 128], help="molecules per weave batch")
    p.add_argument("--weave-hidden", type=COUNT, default=32, help="weave layer width")
    p.add_argument("--repeats", type=COUNT, default=7)
    add_run_flags(p, "backward", "tiny batches and models")
    args = p.parse_args(argv)
    if args.quick:
        args.sst_batches, args.tree_batches, args.hidden, args.repeats = [4], [2], 8, 1
        args.weave_batches, args.weave_hidden = [3], 8
    return args


def measure(blocks: dict[str, fd.Block], examples: list, repeats: int) -> dict[str, Any]:
    """Per mode (``blocks``' keys), the step time and temporaries of a training step on ``examples``,
    whether the batch saved matmul outputs, and the bytes of the buffers it saves them in with
    ``backward="save"``."""
    runs, temps, saves, nodes, saved_bytes = {}, {}, {}, 0, 0
    for mode, block in blocks.items():
        compiler = fd.Compiler.create(block, backward=mode)
        batch = compiler.build_batch(examples, exact_layout=True)
        nodes = batch.stats.num_nodes
        saves[mode] = bool(batch.layout.saved_rows)
        if mode == "save":
            row_bytes = compiler.saved_row_bytes(batch.layout.chunk)
            saved_bytes = saved_buffer_bytes(batch.layout.saved_rows, [row_bytes[o] for o in batch.layout.loop_ops],
                                             batch.layout.chunk)
        step, step_args = training_step(compiler, compiler.init(jax.random.key(0)), jax.device_put(batch))
        compiled = step.lower(*step_args).compile()
        temps[mode] = compiled.memory_analysis().temp_size_in_bytes
        runs[mode] = lambda compiled=compiled, step_args=step_args: jax.block_until_ready(compiled(*step_args))
    times = interleaved_medians(runs, repeats)
    return {"examples": len(examples), "nodes": nodes, "step_s": times, "temp_bytes": temps, "saves": saves,
            "saved_bytes": saved_bytes}


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    trees = sst.load("train", sst.data_dir(args.data_dir, args.quick))
    vocabulary = sst.vocabulary(trees)
    rng, molecule_rng = random.Random(0), np.random.default_rng(0)
    leaves, tree_hidden = (16, 16) if args.quick else (128, 256)
    workloads = {
        "sst": (lambda: models.sst_model(vocabulary, state_size=args.hidden, embed_size=100),
                [rng.sample(trees, b) for b in args.sst_batches]),
        "table1": (lambda: models.table1_model(tree_hidden, leaves),
                   [[models.random_tree(rng, leaves) for _ in range(b)] for b in args.tree_batches]),
        "weave": (lambda: weave.build_weave(args.weave_hidden, modules=2),
                  [[weave.random_molecule(molecule_rng, 4, 10) for _ in range(b)] for b in args.weave_batches]),
    }
    results: dict[str, Any] = {"args": vars(args), "workloads": {}}
    for name, (make_block, batches) in workloads.items():
        if not batches:  # e.g. --sst-batches with no sizes: skip the workload
            continue
        rows = []
        for examples in batches:
            print(f"{name}: batch {len(examples)}, compiling {len(args.modes)} steps ...", flush=True)
            rows.append(measure({m: make_block() for m in args.modes}, examples, args.repeats))
        results["workloads"][name] = rows
        print_table(f"{name}: training step, ms (temporaries, MiB; * where the batch saves)",
                    ["batch", "nodes", *args.modes, "saved buffers (MiB)"],
                    [[r["examples"], r["nodes"], *(f"{r['step_s'][m] * 1e3:.1f} ({r['temp_bytes'][m] / 2**20:.1f})"
                                                   f"{'*' if r['saves'][m] else ''}" for m in args.modes),
                      f"{r['saved_bytes'] / 2**20:.1f}"]
                     for r in rows])
    save_results("backward", results, args, lambda png: plot(results, args.modes, png))
    return results


def plot(results: dict, modes: list[str], path: Any) -> None:
    """Step time of each mode relative to ``recompute`` (or the first mode), per workload and batch."""
    base = "recompute" if "recompute" in modes else modes[0]
    with figure(path) as ax:
        labels, x = [], 0
        for name, rows in results["workloads"].items():
            for r in rows:
                for k, m in enumerate(modes):
                    ax.bar(x + (k - (len(modes) - 1) / 2) * 0.8 / len(modes), r["step_s"][m] / r["step_s"][base],
                           0.8 / len(modes), color=f"C{k}", label=m if x == 0 else None)
                labels.append(f"{name}\n{r['examples']}")
                x += 1
        ax.axhline(1, color="gray", lw=0.5)
        ax.set(xticks=np.arange(x), ylabel=f"step time / {base}", title="backward pass: step time against batch")
        ax.set_xticklabels(labels, fontsize=7)
        ax.legend()


if __name__ == "__main__":
    main()
