"""Executor tuning: the chunk size C, and whole-arena copies in the compiled loop.

For each ``--chunk-sizes`` value C, three multi-operation training steps
(``--mode infer``: forward passes) are compiled and timed (median of
``--repeats`` rounds that take turns between the values of C, so that all
see the same drift of the shared machine; compilation excluded and
reported): the SST Tree-LSTM (leaf, pair, readout and metric operations)
on real SST trees, the Table 1 model on random 128-leaf trees, and two
stacked weave modules (``examples.weave``: six layers per module over
atoms and atom pairs, sums, a read-out and a loss metric) on random
molecules of 4-10 atoms. A very
large C is the "one power-of-two bucket per (depth, operation)" dispatch:
every group becomes a single work item, so the sweep also compares
dispatch per chunk with dispatch per depth. Each workload also reports
the C that ``Compiler.create``'s default candidates pick for its batch.

For each compiled step it counts the HLO ``copy`` instructions whose
shape is a whole arena (``[A + C, ...]``): XLA inserts them when an arena
flows through a ``switch`` or is updated twice in one iteration, and each
costs a full arena copy per loop iteration (DESIGN.md's "XLA traps").

Run: ``python -m benchmarks.executor`` (``--quick`` for a seconds-long run).
"""

from __future__ import annotations

import argparse
import random
import re
import time
from typing import Any

import jax
import numpy as np
import optax

import fold as fd
from benchmarks import models, table1
from benchmarks.common import add_run_flags, figure, interleaved_medians, make_train_step, save_results
from examples import sst, weave
from examples.common import COUNT, print_table

WORKLOADS = ("sst", "table1", "weave")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--chunk-sizes", type=COUNT, nargs="+", default=[32, 64, 128, 256, 512, 4096])
    p.add_argument("--sst-batch", type=COUNT, default=64)
    p.add_argument("--tree-batch", type=COUNT, default=256, help="batch of random trees (Table 1 model)")
    p.add_argument("--hidden", type=COUNT, default=150, help="SST state size (the Table 1 model uses 256)")
    p.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=list(WORKLOADS))
    p.add_argument("--weave-batch", type=COUNT, default=32, help="molecules per weave batch")
    p.add_argument("--weave-hidden", type=COUNT, default=32, help="weave layer width")
    p.add_argument("--mode", choices=("train", "infer"), default="train",
                   help="time training steps, or forward passes")
    p.add_argument("--repeats", type=COUNT, default=5)
    add_run_flags(p, "executor", "tiny batches and models")
    args = p.parse_args(argv)
    if args.quick:
        args.chunk_sizes, args.sst_batch, args.tree_batch, args.hidden, args.repeats = [8, 64], 8, 4, 8, 1
        args.weave_batch, args.weave_hidden = 4, 8
    if any(c < 8 or c & (c - 1) for c in args.chunk_sizes):
        p.error("chunk sizes must be powers of two >= 8")
    return args


def _computations(hlo: str) -> dict[str, str]:
    """HLO text split into ``{computation name: body}``."""
    out, name, lines = {}, None, []
    for line in hlo.splitlines():
        head = re.match(r"(?:ENTRY )?%([\w.\-]+) .*\{$", line)
        if head:
            name, lines = head.group(1), []
        elif line.startswith("}") and name is not None:
            out[name], name = "\n".join(lines), None
        elif name is not None:
            lines.append(line)
    return out


def loop_computations(hlo: str) -> dict[str, str]:
    """The computations that run inside ``while`` loops: bodies, conditions, and all they call."""
    comps = _computations(hlo)
    todo = [b for body in comps.values() for b in re.findall(r"\bbody=%([\w.\-]+)", body)]
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen or name not in comps:
            continue
        seen.add(name)
        todo += re.findall(r"(?:calls|to_apply|body|condition|branch_computations)=\{?%([\w.\-]+)", comps[name])
        todo += re.findall(r"(?:, |\{)%([\w.\-]+)", "".join(re.findall(r"branch_computations=\{[^}]*\}",
                                                                             comps[name])))
    return {name: comps[name] for name in seen}


def arena_copies(hlo: str, shapes: set[tuple[int, ...]]) -> int:
    """HLO ``copy`` instructions inside loops whose result has one of ``shapes`` (the arenas' full
    shapes, rows first): a whole arena copied on every iteration. Matching rows alone would count
    per-item buffers that happen to have as many rows as some arena."""
    alternatives = "|".join(re.escape(",".join(map(str, s))) for s in sorted(shapes))
    copy = re.compile(rf"= \w+\[(?:{alternatives})\]\S* copy\(")
    return sum(len(copy.findall(body)) for body in loop_computations(hlo).values())


def training_step(compiler: fd.Compiler, params: Any, batch: fd.Batch) -> tuple[Any, tuple]:
    """The jitted SGD step and its arguments: the SST model's mean ``loss`` metric, or Table 1's
    ``0.5 * sum(root ** 2)`` for a model without metrics."""
    if "loss" in compiler.program.metric_types:
        optimizer = optax.sgd(0.01)
        return make_train_step(compiler, optimizer), (params, optimizer.init(params), batch, jax.random.key(0))
    return table1.sgd_step(lambda p, b: compiler.apply(p, b).outputs), (params, batch)


def step_for(compiler: fd.Compiler, params: Any, batch: fd.Batch, mode: str) -> tuple[Any, tuple]:
    """The jitted training step (``training_step``) or forward pass, and its arguments."""
    if mode == "infer":
        return jax.jit(compiler.apply), (params, batch)
    return training_step(compiler, params, batch)


def compile_step(block: fd.Block, examples: list, chunk: int, mode: str) -> tuple[dict[str, Any], Any]:
    """Compile time, loop items and whole-arena copies of one step, and a call that runs it."""
    compiler = fd.Compiler.create(block, chunk_size=chunk)
    host = compiler.build_batch(examples, exact_layout=True)
    step, step_args = step_for(compiler, compiler.init(jax.random.key(0)), jax.device_put(host), mode)
    start = time.perf_counter()
    compiled = step.lower(*step_args).compile()
    compile_s = time.perf_counter() - start
    hlo = compiled.as_text()
    row = {"chunk": chunk, "compile_s": compile_s, "items": host.stats.num_items, "nodes": host.stats.num_nodes,
           "size_class": host.layout.size_class,
           "arena_copies": arena_copies(hlo, {(r + chunk, *t.shape)
                                              for r, t in zip(host.layout.arena_rows, compiler.program.types)}),
           "loop_computations": len(loop_computations(hlo))}
    return row, lambda: jax.block_until_ready(compiled(*step_args))


def measure(block: fd.Block, examples: list, chunks: list[int], mode: str, repeats: int) -> list[dict[str, Any]]:
    """``compile_step``'s numbers for each C, plus ``step_s``: the median step time, the values of C
    taking turns (``interleaved_medians``)."""
    rows, runs = [], {}
    for c in chunks:
        print(f"  C = {c}: compiling ...", flush=True)
        row, runs[c] = compile_step(block, examples, c, mode)
        rows.append(row)
    times = interleaved_medians(runs, repeats)
    return [dict(row, step_s=times[row["chunk"]]) for row in rows]


def workload(name: str, args: argparse.Namespace) -> tuple[fd.Block, list]:
    """The model and the batch of examples of workload ``name``."""
    if name == "sst":
        trees = sst.load("train", sst.data_dir(args.data_dir, args.quick))
        model = models.sst_model(sst.vocabulary(trees), state_size=args.hidden, embed_size=100)
        return model, random.Random(0).sample(trees, args.sst_batch)
    if name == "table1":
        leaves = 16 if args.quick else 128
        rng = random.Random(0)
        return (models.table1_model(16 if args.quick else 256, leaves),
                [models.random_tree(rng, leaves) for _ in range(args.tree_batch)])
    rng = np.random.default_rng(0)
    return (weave.build_weave(args.weave_hidden, modules=2),
            [weave.random_molecule(rng, 4, 10) for _ in range(args.weave_batch)])


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    results: dict[str, Any] = {"args": vars(args), "workloads": {}}
    for name in args.workloads:
        block, examples = workload(name, args)
        print(f"{name} ({len(examples)} examples, {args.mode}):", flush=True)
        rows = measure(block, examples, args.chunk_sizes, args.mode, args.repeats)
        best = min(rows, key=lambda r: r["step_s"])
        default = fd.Compiler.create(block).build_batch(examples).layout.chunk
        results["workloads"][name] = {"examples": len(examples), "rows": rows, "best_chunk": best["chunk"],
                                      "default_chunk": default}
        print_table(f"{name}: {args.mode} step ({len(examples)} examples) against C",
                    ["C", "loop items", "step ms", "us per item", "compile s", "whole-arena copies"],
                    [[r["chunk"], r["items"], f"{r['step_s'] * 1e3:.2f}",
                      f"{r['step_s'] / max(r['items'], 1) * 1e6:.0f}", f"{r['compile_s']:.1f}",
                      r["arena_copies"]] for r in rows])
        print(f"fastest: C = {best['chunk']}; the default candidates pick C = {default}")
    save_results("executor", results, args, lambda png: plot(results, png))
    return results


def plot(results: dict, path: Any) -> None:
    """Step time against C per workload, relative to each workload's fastest."""
    with figure(path) as ax:
        for name, w in results["workloads"].items():
            times = np.array([r["step_s"] for r in w["rows"]])
            ax.plot([r["chunk"] for r in w["rows"]], times / times.min(), "o-", label=name)
        ax.set(xscale="log", xlabel="chunk size C", ylabel="step time / fastest",
               title=f"{results['args']['mode']} step against C")
        ax.legend()


if __name__ == "__main__":
    main()
