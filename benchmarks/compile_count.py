"""Compilations over one training epoch: how well batch shapes are bucketed.

``--workload sst`` trains the SST Tree-LSTM (per-node loss) for one epoch at
``--batch-size`` (shuffled, keeping the last partial batch) and reports, from
``compiler.stats()``: batches, distinct batch layouts, times the training
step was traced (each is an XLA compilation), batches per size class, and
bucket occupancy (the share of each bucket that is real rows, not padding).
Goal: at most 3 compilations per epoch at batch 64. ``--workload tagger`` (``examples.tagger``'s
BiLSTM tagger with character LSTMs, per-word sentiment tags) and ``--workload rnnlm`` (an LSTM
language model, the DyNet benchmark suite's ``rnnlm``) do the same for sequence models over SST's
sentences, whose goal is one compilation for the full batches and one for the last.

``--workload random`` does the same for ``--models`` random models
(``benchmarks/random_models.py``, each with a loss metric) on ``--examples``
random examples each: one epoch from recorded examples, then one walking
them (which should compile nothing new). Per model it reports compilations,
compile seconds, padding (rows computed / rows needed) against exact-fit
layouts, and the device time of an epoch over the padded batches against
the same batches in their own exact layouts (timed layout by layout).
Goals: at most 4 compilations per model and epoch (median 2), device time
within 10 % of exact fit.

Run: ``python -m benchmarks.compile_count`` (``--quick`` for a seconds-long run).
"""

from __future__ import annotations

import argparse
import collections
import gc
import time
from typing import Any

import jax
import numpy as np
import optax

import fold as fd
from benchmarks import models, random_models
from benchmarks.common import add_run_flags, figure, make_train_step, median_seconds, save_results
from examples import sst, tagger
from examples.common import COUNT, NATURAL, print_table
from fold.compiler.compiler import CHUNK_SIZES
from fold.scheduler.layouts import computed_rows

GOAL = 3
# A sequence model's epoch: one compilation for its full batches, one for the last, partial one.
SEQUENCE_GOAL = 2
RANDOM_GOAL, RANDOM_MEDIAN_GOAL, DEVICE_GOAL = 4, 2, 1.10


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-size", type=COUNT, default=64)
    p.add_argument("--workers", type=NATURAL, default=1, help="processes building batches ahead")
    p.add_argument("--chunk-size", type=COUNT, nargs="+", default=list(CHUNK_SIZES),
                   help="candidates for C (Compiler.create's chunk_size)")
    p.add_argument("--workload", choices=("sst", "tagger", "rnnlm", "random"), default="sst")
    p.add_argument("--models", type=COUNT, default=8, help="random models (--workload random)")
    p.add_argument("--examples", type=COUNT, default=3000, help="examples per random model")
    add_run_flags(p, "compile_count", "a few hundred trees, small model")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    return random_main(args) if args.workload == "random" else epoch_main(args)


def workload(args: argparse.Namespace) -> tuple[str, fd.Block, list, int]:
    """``--workload``'s title, model, training examples and goal (compilations per epoch)."""
    trees = sst.load("train", sst.data_dir(args.data_dir, args.quick), 320 if args.quick else None)
    if args.workload == "tagger":
        tagged = tagger.examples_of(trees)
        return "BiLSTM tagger", models.tagger_model(tagged, 16 if args.quick else 50), tagged, SEQUENCE_GOAL
    if args.workload == "rnnlm":
        word_idx = sst.vocabulary(trees, min_count=2)
        model = models.rnn_lm(len(word_idx) + 1, *((16, 16) if args.quick else (128, 64)))
        return "LSTM language model", model, models.lm_examples(trees, word_idx), SEQUENCE_GOAL
    size = 16 if args.quick else 150
    return "SST", models.sst_model(sst.vocabulary(trees), state_size=size, embed_size=size), trees, GOAL


def epoch_main(args: argparse.Namespace) -> dict:
    title, model, trees, goal = workload(args)
    compiler = fd.Compiler.create(model, chunk_size=args.chunk_size)
    optimizer = optax.adam(1e-3)
    params = compiler.init(jax.random.key(0))
    opt_state = optimizer.init(params)
    step = make_train_step(compiler, optimizer)
    key = jax.random.key(0)

    per_step, seen = [], set()
    start = time.perf_counter()
    for i, batch in enumerate(compiler.batches(trees, args.batch_size, shuffle=True, seed=0,
                                               num_workers=args.workers)):
        t = time.perf_counter()
        params, opt_state, loss = step(params, opt_state, batch, jax.random.fold_in(key, i))
        loss.block_until_ready()
        new = batch.layout not in seen
        seen.add(batch.layout)
        per_step.append({"batch": i, "size_class": batch.layout.size_class, "examples": batch.layout.num_examples,
                         "nodes": batch.stats.num_nodes, "chunk": batch.layout.chunk,
                         "new_layout": new, "seconds": time.perf_counter() - t})
    epoch_seconds = time.perf_counter() - start
    s = compiler.stats()
    compile_seconds = sum(r["seconds"] for r in per_step if r["new_layout"])
    per_chunk = collections.Counter(r["chunk"] for r in per_step)
    results: dict[str, Any] = {
        "args": vars(args), "trees": len(trees), "batches": s.batches, "layouts": s.layouts,
        "workload": args.workload, "compilations": s.traces, "goal": goal,
        "size_classes": {str(k): v for k, v in s.size_classes.items()},
        "chunks": {str(c): n for c, n in per_chunk.items()},
        "occupancy": s.occupancy, "min_occupancy": s.min_occupancy, "saving": s.saving, "epoch_seconds": epoch_seconds,
        "compile_seconds": s.compile_seconds, "padding": s.padding,
        "first_steps_of_new_layouts_seconds": compile_seconds, "steps": per_step}
    print_table(f"one {title} epoch at batch {args.batch_size}", ["quantity", "value"], [
        ["batches", s.batches], ["distinct layouts", s.layouts],
        ["compilations (traces of the step)", f"{s.traces} (goal <= {goal})"],
        ["batches per size class", ", ".join(f"A={k}: {v}" for k, v in s.size_classes.items())],
        ["batches per C", ", ".join(f"C={c}: {n}" for c, n in sorted(per_chunk.items()))],
        ["bucket occupancy (mean / min)", f"{s.occupancy:.2f} / {s.min_occupancy:.2f}"],
        ["batches saving matmul outputs (backward)", s.saving],
        ["epoch seconds (first steps of new layouts)", f"{epoch_seconds:.1f} ({compile_seconds:.1f})"]])
    name = "compile_count" if args.workload == "sst" else f"compile_count_{args.workload}"
    save_results(name, results, args, lambda png: plot(per_step, png, title))
    return results


def plot(per_step: list[dict], path: Any, title: str) -> None:
    """Step time per batch (log scale), compilations marked."""
    with figure(path, (7, 3.5)) as ax:
        ax.plot([r["batch"] for r in per_step], [r["seconds"] for r in per_step], lw=1, label="step")
        new = [r for r in per_step if r["new_layout"]]
        ax.scatter([r["batch"] for r in new], [r["seconds"] for r in new], color="tab:red", zorder=3,
                   label="new layout (compiles)")
        ax.set(yscale="log", xlabel="batch", ylabel="seconds", title=f"training steps over one {title} epoch")
        ax.legend()


def _loss_model(model: random_models.RandomModel) -> fd.Block:
    """``model`` with a squared linear readout as its ``loss`` metric."""
    head = fd.FC(1, activation=None)
    return model.block >> fd.Function(head) >> fd.Function(lambda y: y[:, 0] ** 2) >> fd.Metric("loss")


def _epoch_seconds(step: Any, params: Any, opt_state: Any, batches: list) -> float:
    """Time of one pass of ``step`` over ``batches`` (every layout compiled before), each step
    waited for: groups of one batch and groups of many are then timed alike."""
    start = time.perf_counter()
    for i, batch in enumerate(batches):
        step(params, opt_state, batch, jax.random.key(i))[2].block_until_ready()
    return time.perf_counter() - start


def _device_seconds(compiler: fd.Compiler, optimizer: Any, params: Any, opt_state: Any, batches: list,
                    repeats: int = 3) -> float:
    """Device time of one training pass over ``batches``, layout by layout: each layout's step is
    compiled, its batches timed (median of ``repeats`` passes), and its executable dropped before
    the next (a process holding dozens of them ran out of mappable memory in LLVM)."""
    by_layout: dict = collections.defaultdict(list)
    for batch in batches:
        by_layout[batch.layout].append(batch)
    total = 0.0
    for group in by_layout.values():
        step = make_train_step(compiler, optimizer)
        step(params, opt_state, group[0], jax.random.key(0))[2].block_until_ready()
        total += median_seconds(lambda step=step, group=group: _epoch_seconds(step, params, opt_state, group),
                                repeats)
        gc.collect()
        jax.clear_caches()
    return total


def random_model_epoch(seed: int, n: int, batch_size: int, chunk_sizes: list[int]) -> dict:
    """One random model's epoch (see the module docstring)."""
    model = random_models.random_model(seed, n=n, depth=3)
    compiler = fd.Compiler.create(_loss_model(model), chunk_size=chunk_sizes)
    optimizer = optax.adam(1e-3)
    params = compiler.init(jax.random.key(seed))
    opt_state = optimizer.init(params)
    step = make_train_step(compiler, optimizer)
    recorded = compiler.record(model.examples)
    start = time.perf_counter()
    batches = []
    for i, batch in enumerate(compiler.batches(recorded, batch_size, shuffle=True, seed=seed)):
        params, opt_state, loss = step(params, opt_state, batch, jax.random.key(i))
        loss.block_until_ready()
        batches.append(batch)
    epoch_seconds = time.perf_counter() - start
    s = compiler.stats(reset=True)
    for i, batch in enumerate(compiler.batches(model.examples, batch_size, shuffle=True, seed=seed + 1)):
        step(params, opt_state, batch, jax.random.key(i))[2].block_until_ready()
    walking = compiler.stats()
    # The same batches in their exact layouts.
    exact = [compiler.build_batch(recorded[np.asarray(idx)], exact_layout=True)
             for idx in np.array_split(np.random.default_rng(seed).permutation(n), range(batch_size, n, batch_size))]
    exact_computed = sum(computed_rows(b) for b in exact) / sum(b.stats.num_nodes for b in exact)
    padded_s = _device_seconds(compiler, optimizer, params, opt_state, batches)
    exact_s = _device_seconds(compiler, optimizer, params, opt_state, exact)
    return {"seed": seed, "model": model.text, "operations": len(compiler.program.ops), "batches": s.batches,
            "compilations": s.traces, "layouts": s.layouts, "exact_layouts": len({b.layout for b in exact}),
            "compile_seconds": s.compile_seconds, "epoch_seconds": epoch_seconds,
            "walking_compilations": walking.traces, "padding": s.padding, "exact_padding": exact_computed,
            "device_seconds": padded_s, "exact_device_seconds": exact_s, "device_ratio": padded_s / exact_s}


def step_compile_seconds(seed: int, batch_size: int, chunk: int | tuple = CHUNK_SIZES, fuse: bool = True) -> dict:
    """Seconds to trace and compile random model ``seed``'s training step for one batch, with its
    operations and loop operations: the executor compiles a branch per (loop operation, item
    size), and C = 2^k has k - 2 sizes."""
    model = random_models.random_model(seed, n=batch_size, depth=3)  # a block lives in one model only
    compiler = fd.Compiler.create(_loss_model(model), chunk_size=chunk, fuse=fuse)
    optimizer = optax.adam(1e-3)
    params = compiler.init(jax.random.key(0))
    batch = compiler.build_batch(model.examples)
    step = make_train_step(compiler, optimizer)
    start = time.perf_counter()
    step.lower(params, optimizer.init(params), batch, jax.random.key(0)).compile()
    seconds = time.perf_counter() - start
    jax.clear_caches()
    return {"seconds": seconds, "operations": len(compiler.program.ops), "loop_operations": len(batch.layout.loop_ops)}


def _fused_and_not(row: dict, key: str, fmt: str = "{}") -> str:
    """``row``'s step-compile ``key`` fused, then unfused in brackets."""
    fused, unfused = row["step_compile"]["True"][key], row["step_compile"]["False"][key]
    return f"{fmt.format(fused)} ({fmt.format(unfused)})"


def random_main(args: argparse.Namespace) -> dict:
    models, n = (1, 256) if args.quick else (args.models, args.examples)
    rows = []
    for seed in range(models):
        row = random_model_epoch(seed, n, args.batch_size, args.chunk_size)
        if not args.quick:
            row["step_compile"] = {str(fuse): step_compile_seconds(seed, args.batch_size, fuse=fuse)
                                   for fuse in (True, False)}
        rows.append(row)
        # Each model leaves dozens of executables (its exact layouts) in JAX's caches; LLVM ran out
        # of mappable memory after three models without this.
        gc.collect()
        jax.clear_caches()
        print(f"model {seed}: {row['operations']} operations, {row['compilations']} compilations "
              f"({row['exact_layouts']} exact layouts), {row['compile_seconds']:.1f} s compiling, "
              f"device {row['device_ratio']:.2f}x exact", flush=True)
    compilations = [r["compilations"] for r in rows]
    summary = {"max_compilations": max(compilations), "median_compilations": float(np.median(compilations)),
               "max_device_ratio": max(r["device_ratio"] for r in rows),
               "goals": {"max_compilations": RANDOM_GOAL, "median_compilations": RANDOM_MEDIAN_GOAL,
                         "device_ratio": DEVICE_GOAL}}
    print_table(f"random models, one epoch of {n} examples at batch {args.batch_size}",
                ["seed", "ops", "compilations (exact layouts)", "walking epoch", "compile s", "padding (exact)",
                 "device s (exact)"],
                [[r["seed"], r["operations"], f"{r['compilations']} ({r['exact_layouts']})", r["walking_compilations"],
                  f"{r['compile_seconds']:.1f}", f"{r['padding']:.2f} ({r['exact_padding']:.2f})",
                  f"{r['device_seconds']:.2f} ({r['exact_device_seconds']:.2f})"] for r in rows])
    print(f"compilations per epoch: max {summary['max_compilations']} (goal <= {RANDOM_GOAL}), median "
          f"{summary['median_compilations']:.1f} (goal <= {RANDOM_MEDIAN_GOAL}); device time: at most "
          f"{summary['max_device_ratio']:.2f}x exact fit (goal <= {DEVICE_GOAL})")
    by_chunk = {} if args.quick else {str(c): step_compile_seconds(0, args.batch_size, c) for c in (32, 128, 512)}
    if not args.quick:
        print_table("compile seconds of one training step, operations fused (fuse=True) and not",
                    ["seed", "ops (unfused)", "loop ops (unfused)", "compile s (unfused)"],
                    [[r["seed"], _fused_and_not(r, "operations"), _fused_and_not(r, "loop_operations"),
                      _fused_and_not(r, "seconds", "{:.1f}")]
                     for r in rows])
    if by_chunk:
        print("compile seconds of model 0's step by C: " + ", ".join(
            f"C={c}: {r['seconds']:.1f} s" for c, r in by_chunk.items()))
    results = {"args": vars(args), "workload": "random", "models": rows, "summary": summary,
               "compile_seconds_by_chunk": by_chunk}
    save_results("compile_count_random", results, args, lambda png: plot_random(rows, png))
    return results


def plot_random(rows: list[dict], path: Any) -> None:
    """Compilations per model, padded against exact-fit layouts."""
    with figure(path, (7, 3.5)) as ax:
        x = np.arange(len(rows))
        ax.bar(x - 0.2, [r["exact_layouts"] for r in rows], 0.4, label="exact-fit layouts")
        ax.bar(x + 0.2, [r["compilations"] for r in rows], 0.4, label="compilations (padded)")
        ax.axhline(RANDOM_GOAL, color="tab:red", lw=1, ls="--", label="goal")
        ax.set(xlabel="random model (seed)", ylabel="per epoch", title="compilations over one epoch")
        ax.legend()


if __name__ == "__main__":
    main()
