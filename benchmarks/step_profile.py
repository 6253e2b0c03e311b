"""Where an SST training step's device time goes: XLA's per-op profile, by kind of work.

Runs the SST Tree-LSTM training step (``benchmarks.models.sst_model``, SGD, fold's default
backward) on one batch of real trees under ``jax.profiler``, reads the trace, and sums each
XLA operation's *exclusive* time (its own, less the operations nested in it: a ``cond``
holds its branch's work) by kind: matmuls, gathers, scatters, dynamic slices, filling buffers
(zeros for arenas, cotangents, saved rows), the ``switch`` dispatch, the while loop's own
control, copies, reductions and the rest (element-wise fusions), each split into forward and
backward by the op's JAX name. XLA runs independent operations on two threads, so op time can
exceed wall time; shares are of op time.

Against it, *matmul need*: the same matmuls on the batch's real rows only (every node through
the cell, forward and both backward products), timed alone as one jitted call: the time a
perfectly batched step could not go below on this machine. And *cell need*: every operation of
the batch (the cells' matmuls *and* their element-wise work, the readout and the loss) on all its
real rows at once, forward and backward, as one jitted call with no dependencies between rows
(``cell_need``): the model's own work, the floor an executor that only schedules would reach.
The step and both needs are timed taking turns (``interleaved_medians``), so their ratios see
the same drift of a shared machine. Beside them, the largest single operations (runs per step,
microseconds per run) and a loop item's three products each timed alone: an operation that runs
beside another on XLA's threads looks slower than it is alone.

Run: ``python -m benchmarks.step_profile --data-dir DIR`` (``--quick``: the committed sample).
Writes ``benchmarks/results/step_profile.json``.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import pathlib
import random
import re
import tempfile
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

import fold as fd
from benchmarks import models
from benchmarks.common import add_run_flags, figure, interleaved_medians, make_train_step, median_seconds, save_results
from examples import sst
from examples.common import COUNT, print_table
from fold.scheduler.schedule import layout_item_sizes

# Kinds of work, by the first pattern an op's name matches (XLA names fusions after what they hold).
KINDS = (("matmul", r"dot|ynn_fusion|gemm|matmul"), ("scatter", r"scatter"), ("gather", r"gather"),
         ("dynamic slices", r"dynamic-update-slice|dynamic-slice|dynamic_slice|dynamic_update_slice"),
         ("filling buffers", r"broadcast"), ("switch dispatch", r"^cond|conditional"),
         ("loop control", r"^while"), ("copies", r"copy|transpose"), ("reductions", r"reduce"))
OTHER = "element-wise and other"
# A cell's matmul and its two backward products, as ``product(x, dy, w)``.
PRODUCTS = {"x·W": lambda x, dy, w: x @ w, "xᵀ·dY": lambda x, dy, w: x.T @ dy, "dY·Wᵀ": lambda x, dy, w: dy @ w.T}


def kind(name: str) -> str:
    """The kind of work of the XLA operation ``name``."""
    return next((k for k, pattern in KINDS if re.search(pattern, name)), OTHER)


def phases(hlo_text: str) -> dict[str, str]:
    """Each operation's phase from its JAX name: ``backward`` under a ``transpose``, ``forward``
    under a ``jvp``, else ``other`` (the optimiser, the inputs)."""
    result = {}
    for m in re.finditer(r"%([\w.\-]+) = [^\n]*?op_name=\"([^\"]*)\"", hlo_text):
        name, op_name = m.groups()
        result[name] = "backward" if "transpose(" in op_name else "forward" if "jvp(" in op_name else "other"
    return result


def exclusive_times(trace_events: list[dict]) -> dict[str, float]:
    """Microseconds per XLA operation, less the operations nested in it, summed over threads."""
    by_thread: dict[Any, list[dict]] = collections.defaultdict(list)
    for e in trace_events:
        if e.get("ph") == "X" and "::" not in e["name"] and not e["name"].startswith(("$", "Pjit")):
            by_thread[e["tid"]].append(e)
    own: dict[str, float] = collections.Counter()
    for events in by_thread.values():
        events.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack: list[dict] = []
        for e in events:
            while stack and e["ts"] >= stack[-1]["ts"] + stack[-1]["dur"]:
                stack.pop()
            if stack:
                own[stack[-1]["name"]] -= e["dur"]
            own[e["name"]] += e["dur"]
            stack.append(e)
    return dict(own)


def calls(trace_events: list[dict]) -> dict[str, int]:
    """How many times each XLA operation ran (each loop iteration runs its body's operations once)."""
    return collections.Counter(e["name"] for e in trace_events if e.get("ph") == "X")


def profile(step: Any, args: tuple, steps: int) -> tuple[dict[str, float], dict[str, int]]:
    """Exclusive microseconds per operation over ``steps`` calls of ``step(*args)``, and how many
    times each ran."""
    with tempfile.TemporaryDirectory() as folder:
        jax.profiler.start_trace(folder, create_perfetto_trace=True)
        for _ in range(steps):
            jax.block_until_ready(step(*args))
        jax.profiler.stop_trace()
        trace = next(pathlib.Path(folder).rglob("*.trace.json.gz"))
        with gzip.open(trace) as f:
            data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    return exclusive_times(events), calls(events)


def matmul_need(rows: int, w: jax.Array) -> Callable[[], Any]:
    """A call that runs ``rows`` rows through ``x @ w`` and its two backward products, as one
    jitted call (compiled here), and waits for it."""
    x = jnp.ones((rows, w.shape[0]), w.dtype)
    dy = jnp.ones((rows, w.shape[1]), w.dtype)

    @jax.jit
    def products(x: jax.Array, w: jax.Array, dy: jax.Array) -> tuple:
        return tuple(product(x, dy, w) for product in PRODUCTS.values())

    jax.block_until_ready(products(x, w, dy))
    return lambda: jax.block_until_ready(products(x, w, dy))


def op_rows(compiler: fd.Compiler, batch: fd.Batch) -> dict[int, int]:
    """Per operation of ``compiler``, the real rows ``batch`` runs it on (its nodes): hoisted
    groups, tail groups and loop items."""
    layout, arrays = batch.layout, batch.arrays
    rows: collections.Counter[int] = collections.Counter()
    for ops, groups in ((layout.hoist_ops, arrays.hoist), (layout.tail_ops, arrays.tail)):
        for o, count in zip(ops, np.asarray(groups.count).tolist()):
            rows[o] += count
    sizes = len(layout_item_sizes(layout))
    n = int(arrays.n_items)
    for branch, count in zip(np.asarray(arrays.items_branch)[:n].tolist(), np.asarray(arrays.items_count)[:n].tolist()):
        rows[layout.loop_ops[branch // sizes]] += count
    return dict(rows)


def cell_need(compiler: fd.Compiler, params: Any, batch: fd.Batch) -> Callable[[], Any]:
    """A call that runs every operation of ``batch`` on all its rows at once, forward and
    backward (in the parameters and float inputs), as one jitted call (compiled here) with no
    dependencies between rows, and waits for it: the model's own work (matmuls, element-wise
    work, the loss), perfectly batched. Inputs are random floats (integer inputs zeros), so the
    work is the model's whatever the values."""
    executor = compiler.executor
    rows = op_rows(compiler, batch)
    key = jax.random.key(0)
    inputs = {}
    for o, n in rows.items():
        xs = []
        for t in executor.ops[o].in_tidx:
            tt = executor.types[t]
            key, sub = jax.random.split(key)
            shape = (n, *tt.shape)
            floating = jnp.issubdtype(tt.dtype, jnp.floating)
            xs.append(jax.random.normal(sub, shape, tt.dtype) if floating else jnp.zeros(shape, tt.dtype))
        inputs[o] = xs

    def total(params: Any, floats: dict[int, list[jax.Array]]) -> jax.Array:
        out = jnp.zeros(())
        for o, xs in inputs.items():
            op = executor.ops[o]
            xs = [floats[o][i] if jnp.issubdtype(x.dtype, jnp.floating) else x for i, x in enumerate(xs)]
            p = None if op.layer is None else params[op.layer.name]
            for y in op.fn(p, None, *xs):
                if jnp.issubdtype(y.dtype, jnp.floating):
                    out = out + jnp.sum(y.astype(jnp.float32))
        return out

    floats = {o: [x if jnp.issubdtype(x.dtype, jnp.floating) else jnp.zeros(()) for x in xs]
              for o, xs in inputs.items()}
    step = jax.jit(jax.value_and_grad(total, argnums=(0, 1)))
    jax.block_until_ready(step(params, floats))
    return lambda: jax.block_until_ready(step(params, floats))


def products_alone(rows: int, w: jax.Array, repeats: int, iterations: int = 32) -> dict[str, float]:
    """Microseconds per call of each product of a loop item of ``rows`` rows (the forward ``x·W``
    and the backward ``xᵀ·dY`` and ``dY·Wᵀ``), each run alone ``iterations`` times in a jitted
    loop, as the step's loop runs them but with nothing beside them."""
    x = jnp.ones((iterations, rows, w.shape[0]), w.dtype)
    dy = jnp.ones((iterations, rows, w.shape[1]), w.dtype)
    result = {}
    for name, product in PRODUCTS.items():
        @jax.jit
        def loop(x: jax.Array, dy: jax.Array, w: jax.Array, product: Any = product) -> jax.Array:
            return jax.lax.fori_loop(0, iterations, lambda i, acc: acc + product(x[i], dy[i], w).sum(), 0.0)

        jax.block_until_ready(loop(x, dy, w))
        result[name] = median_seconds(lambda: jax.block_until_ready(loop(x, dy, w)), repeats) / iterations * 1e6
    return result


def largest_ops(own: dict[str, float], counts: dict[str, int], hlo_text: str, steps: int,
                phase: dict[str, str], n: int = 10) -> list[dict[str, Any]]:
    """The ``n`` operations with the most own time per step: kind, phase, result shape, runs per
    step and microseconds per run. Operations that XLA runs side by side on its threads each
    count their own duration, so two that overlap both look slower than either alone."""
    shapes = dict(re.findall(r"%([\w.\-]+) = (\S+)", hlo_text))
    return [{"name": name, "kind": kind(name), "phase": phase.get(name, "other"), "shape": shapes.get(name, "?"),
             "calls": counts.get(name, 0) / steps, "ms": us / steps / 1000,
             "us_per_call": us / max(1, counts.get(name, 0))}
            for name, us in sorted(own.items(), key=lambda kv: -kv[1])[:n]]


def measure(trees: list, word_idx: dict, hidden: int, batch_size: int, repeats: int) -> dict:
    compiler = fd.Compiler.create(models.sst_model(word_idx, hidden))
    params = compiler.init(jax.random.key(0))
    optimizer = optax.sgd(0.05)
    step = make_train_step(compiler, optimizer)
    # The first batch of a stream, as training gets it: in the layout planned from the batches ahead.
    batch = jax.device_put(next(iter(compiler.batches(trees[:batch_size * 16], batch_size))))
    examples = trees[:batch_size]
    args = (params, optimizer.init(params), batch, None)
    jax.block_until_ready(step(*args))
    rows = sum(sst.nodes(t) for t in examples)
    w = params["binary_tree_lstm_cell"]["w"]
    # Taking turns: the needs are the ratios' denominators, and a shared machine drifts.
    seconds, need, cells = interleaved_medians({"step": lambda: jax.block_until_ready(step(*args)),
                                                "matmul need": matmul_need(rows, w),
                                                "cell need": cell_need(compiler, params, batch)}, repeats).values()
    own, counts = profile(step, args, repeats)
    hlo_text = step.lower(*args).compile().as_text()
    phase = phases(hlo_text)
    table: dict[str, dict[str, float]] = collections.defaultdict(lambda: collections.Counter())
    for name, us in own.items():
        table[kind(name)][phase.get(name, "other")] += us / repeats / 1000
    op_ms = sum(sum(v.values()) for v in table.values())
    return {
        "hidden": hidden, "batch_size": batch_size, "nodes": rows, "layout": str(batch.layout),
        "step_ms": seconds * 1000, "op_ms": op_ms, "matmul_need_ms": need * 1000,
        "step_vs_need": seconds / need, "cell_need_ms": cells * 1000, "step_vs_cell_need": seconds / cells,
        "chunk": batch.layout.chunk,
        "largest_ops": largest_ops(own, counts, hlo_text, repeats, phase),
        "products_alone_us": products_alone(batch.layout.chunk, w, repeats),
        "kinds": {k: {"ms": sum(v.values()), "share": sum(v.values()) / op_ms, **{p: ms for p, ms in v.items()}}
                  for k, v in sorted(table.items(), key=lambda kv: -sum(kv[1].values()))},
    }


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-sizes", type=COUNT, nargs="+", default=[64])
    p.add_argument("--hidden", type=COUNT, nargs="+", default=[150])
    p.add_argument("--repeats", type=COUNT, default=10, help="timed steps, and steps profiled")
    add_run_flags(p, "step_profile", "one step of a batch of sample trees")
    args = p.parse_args(argv)
    trees = sst.load("train", sst.data_dir(args.data_dir, args.quick))
    random.Random(0).shuffle(trees)
    word_idx = sst.vocabulary(trees)
    runs = [measure(trees, word_idx, h, b, args.repeats) for h in args.hidden for b in args.batch_sizes]
    for r in runs:
        print(f"\nH {r['hidden']}, batch {r['batch_size']} ({r['nodes']} nodes): step {r['step_ms']:.1f} ms, "
              f"op time {r['op_ms']:.1f} ms, matmul need {r['matmul_need_ms']:.1f} ms, cell need "
              f"{r['cell_need_ms']:.1f} ms (step {r['step_vs_need']:.2f}x the matmul need, "
              f"{r['step_vs_cell_need']:.2f}x the cell need)")
        print_table(f"H {r['hidden']}, batch {r['batch_size']}",
                    ["kind", "ms", "share", "forward", "backward", "other"],
                    [[k, f"{v['ms']:.2f}", f"{100 * v['share']:.0f} %", f"{v.get('forward', 0):.2f}",
                      f"{v.get('backward', 0):.2f}", f"{v.get('other', 0):.2f}"] for k, v in r["kinds"].items()])
        print_table("largest operations", ["op", "kind", "phase", "shape", "runs/step", "ms/step", "us/run"],
                    [[o["name"], o["kind"], o["phase"], o["shape"], f"{o['calls']:.0f}", f"{o['ms']:.2f}",
                      f"{o['us_per_call']:.0f}"] for o in r["largest_ops"]])
        print(f"a {r['chunk']}-row item's products alone (us per call): "
              + ", ".join(f"{k} {v:.0f}" for k, v in r["products_alone_us"].items()))
    result = {"runs": runs, "repeats": args.repeats}

    def plot(path: pathlib.Path) -> None:
        with figure(path, (7, 3.5)) as ax:
            labels = [f"H {r['hidden']}, batch {r['batch_size']}" for r in runs]
            left = np.zeros(len(runs))
            for k in [k for k, _ in KINDS] + [OTHER]:
                ms = np.array([r["kinds"].get(k, {}).get("ms", 0.0) for r in runs])
                ax.barh(labels, ms, left=left, label=k)
                left += ms
            ax.scatter([r["matmul_need_ms"] for r in runs], labels, color="k", marker="|", s=400, label="matmul need")
            ax.scatter([r["cell_need_ms"] for r in runs], labels, color="r", marker="|", s=400, label="cell need")
            ax.set_xlabel("op time per step (ms)")
            ax.legend(fontsize=6, loc="lower right")

    save_results("step_profile", result, args, plot)
    return result


if __name__ == "__main__":
    main()
