"""Peak memory of one SST training step against the activation bytes the model needs.

The step is the jitted SST Tree-LSTM training step (value_and_grad + SGD)
on batches of ``--batch-size`` real SST trees. For each batch:

- **activation bytes**: the rows the schedule really fills, over every
  arena (constants and every node's outputs) times their row size: the
  values a reverse-mode pass must keep, since fold recomputes everything
  else in its backward loop (when a batch saves each loop item's matmul
  outputs, ``--backward save`` always and ``auto`` below its ``save_limit``,
  those are more memory, which this measures);
- **arena bytes**: what the executor allocates for them (``A + C`` rows per
  type; ``A`` is the batch's power-of-two size class);
- **step temporaries**: XLA's buffer assignment for the compiled step
  (``memory_analysis().temp_size_in_bytes``: every buffer the step
  allocates besides its arguments and outputs, at its peak) — this is the
  peak memory of the step beyond the parameters and the batch, and it is
  exact for the compiled program, not a sampled measurement;
- **what liveness would leave** (``liveness``, counted on the batch's
  schedule): the step's temporaries if each cotangent row lived only from
  the first stage of the backward pass that adds to it to the one that
  reads it, and if forward values and cotangents shared rows that way
  (each value freed after its last reader), the items' and groups' other
  buffers kept as measured; that bound without those buffers; and that
  bound (with them) if the tail groups (the per-node readout and loss)
  ran their backward node by node with the loop stage that made their
  inputs, rather than all before the loop.

Goal: step temporaries <= 1.5x the activation bytes at batch 256.

Run: ``python -m benchmarks.memory`` (``--quick`` for a seconds-long run).
"""

from __future__ import annotations

import argparse
import random
from typing import Any

import jax
import numpy as np
import optax

import fold as fd
from benchmarks import models
from benchmarks.common import add_run_flags, figure, make_train_step, save_results
from examples import sst
from examples.common import COUNT, print_table
from fold.compiler.saving import BACKWARDS
from fold.scheduler.schedule import layout_item_sizes

GOAL = 1.5


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-size", type=COUNT, default=256)
    p.add_argument("--batches", type=COUNT, default=4, help="random batches to measure")
    p.add_argument("--hidden", type=COUNT, default=150)
    p.add_argument("--embed-size", type=COUNT, default=100)
    p.add_argument("--chunk-size", type=COUNT, default=None,
                   help="C, the most rows of a loop item (default: the compiler's choice)")
    p.add_argument("--backward", choices=BACKWARDS, default="auto",
                   help="fold's backward through the loop (results go to memory_NAME.json unless auto, "
                        "memory[_NAME]_cC.json with --chunk-size)")
    add_run_flags(p, "memory", "the committed sample, tiny model")
    args = p.parse_args(argv)
    if args.quick:
        args.batch_size, args.batches, args.hidden, args.embed_size = 32, 2, 16, 16
    return args


def row_bytes(t: fd.TensorType) -> int:
    return int(np.prod(t.shape, dtype=np.int64)) * np.dtype(t.dtype).itemsize


def _backward_stages(compiler: fd.Compiler, batch: Any) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """The backward pass's stages in the order it runs them (tail groups last first, loop items
    last first, hoisted groups last first): per stage, its operation, its nodes and, per output
    slot of the operation, the arena row of each node's output."""
    arrays, layout = batch.arrays, batch.layout
    slot_index = compiler.program.slot_index

    def stage(o: int, node: int, count: int, out_starts: np.ndarray) -> tuple[int, np.ndarray, np.ndarray]:
        j = np.arange(count)
        outs = np.stack([out_starts[slot_index[s]] + j for s in compiler.program.ops[o].out_slots]
                        ) if compiler.program.ops[o].out_slots else np.zeros((0, count), np.int64)
        return o, node + j, outs

    def groups(g: Any, ops: tuple[int, ...]) -> list[tuple[int, np.ndarray, np.ndarray]]:
        return [stage(o, int(g.node[h]), int(g.count[h]), g.out[h]) for h, o in reversed(list(enumerate(ops)))]

    n_sizes = len(layout_item_sizes(layout))
    items = [stage(layout.loop_ops[int(arrays.items_branch[i]) // n_sizes], int(arrays.items_node[i]),
                   int(arrays.items_count[i]), arrays.items_out[i]) for i in reversed(range(int(arrays.n_items)))]
    return groups(arrays.tail, layout.tail_ops) + items + groups(arrays.hoist, layout.hoist_ops)


def liveness(compiler: fd.Compiler, batch: Any, metric: str = "loss") -> dict[str, int]:
    """Bytes a backward pass would hold if rows lived only as long as they are needed, counted on
    ``batch``'s schedule (host only).

    The pass runs stages in order (``_backward_stages``); before the first, the loss's cotangents
    arrive at ``metric``'s rows. A row's cotangent lives from the first stage that adds to it (or
    the start, for ``metric``'s rows) to the stage of the operation that produced it, which reads
    it; a cotangent no stage reads (a constant's) or that nothing adds to (zero) needs no row. A
    row's forward value lives until the last stage that reads it (the backward recomputes each
    stage from its inputs, so a stage does not read its own outputs).

    Returns ``ct_arena_bytes`` (what the executor allocates: one cotangent arena per float type,
    as large as its forward arena), ``ct_peak_bytes`` (the most cotangent bytes live at once,
    rows reused between cotangents only), ``shared_peak_bytes`` (the most forward and cotangent
    bytes live at once, rows reused between both: at least every forward row the backward reads,
    at its start) and ``deferred_peak_bytes``: the latter if each tail group's node ran its
    backward within the stage that produced its inputs (a per-node readout's, with its cell's
    items), rather than all of them before the loop.
    """
    stages = _backward_stages(compiler, batch)
    shared, ct, ct_arena = _live_bytes(compiler, batch, metric, stages, defer=0)
    deferred, _, _ = _live_bytes(compiler, batch, metric, stages, defer=len(batch.layout.tail_ops))
    return {"ct_arena_bytes": ct_arena, "ct_peak_bytes": ct, "shared_peak_bytes": shared,
            "deferred_peak_bytes": deferred}


def _live_bytes(compiler: fd.Compiler, batch: Any, metric: str, stages: list[tuple[int, np.ndarray, np.ndarray]],
                defer: int) -> tuple[int, int, int]:
    """``liveness``'s count with the first ``defer`` stages (the tail groups) run node by node in
    the stage that produced the node's inputs (the earliest, in backward order, of those that have
    a producer; the start for nodes of constants only): the most forward and cotangent bytes live
    at once, the most cotangent bytes, and the cotangent arenas' bytes."""
    program, arrays, layout = compiler.program, batch.arrays, batch.layout
    n = len(stages)
    types = program.types
    floats = {t for t, tt in enumerate(types) if np.issubdtype(np.dtype(tt.dtype), np.inexact)}
    rows = [layout.arena_rows[t] + layout.chunk for t in range(len(types))]
    made = [np.full(r, n, np.int64) for r in rows]  # the stage that produces the row (n: none)
    at: list[np.ndarray] = [np.full(len(nodes), s) for s, (_, nodes, _) in enumerate(stages)]
    for s in range(defer, n):
        for (t, _), r in zip(program.ops[stages[s][0]].out_slots, stages[s][2]):
            made[t][r] = s
    for s in reversed(range(defer)):  # the tail in its forward order: inputs first
        o, nodes, outs = stages[s]
        op = program.ops[o]
        first = np.full(len(nodes), n, np.int64)
        for i, t in enumerate(op.in_tidx):
            first = np.minimum(first, made[t][arrays.in_idx[nodes, i]])
        at[s] = np.where(first < n, first, -1)
        for (t, _), r in zip(op.out_slots, outs):
            made[t][r] = at[s]
    ct_first = [np.full(r, n, np.int64) for r in rows]   # first stage adding to the row (n: none)
    ct_read = [np.full(r, -2, np.int64) for r in rows]   # the stage reading it (-2: none)
    fwd_last = [np.full(r, -2, np.int64) for r in rows]  # the last stage reading the value (-2: none)
    m = arrays.metrics[metric]
    t_metric = program.type_index[program.metric_types[metric]]
    # The loss's cotangents arrive before the first stage, or, deferred, with the stage making them.
    ct_first[t_metric][m.rows[m.mask]] = made[t_metric][m.rows[m.mask]] if defer else -1
    fwd_last[t_metric][m.rows[m.mask]] = -1
    for (o, nodes, outs), stage in zip(stages, at):
        op = program.ops[o]
        for i, t in enumerate(op.in_tidx):
            r = arrays.in_idx[nodes, i]
            np.maximum.at(fwd_last[t], r, stage)
            if t in floats:
                np.minimum.at(ct_first[t], r, stage)
        for (t, _), r in zip(op.out_slots, outs):
            if t in floats:
                ct_read[t][r] = stage

    def live(start: np.ndarray, end: np.ndarray, row_bytes: int) -> np.ndarray:
        """Per point from -1 to ``n``: bytes of the rows live from ``start`` to ``end``."""
        keep = start <= end
        count = np.zeros(n + 3, np.int64)
        np.add.at(count, start[keep] + 1, 1)
        np.add.at(count, end[keep] + 2, -1)
        return np.cumsum(count)[:-1] * row_bytes

    ct = sum(live(ct_first[t], ct_read[t], row_bytes(types[t])) for t in floats)
    fwd = sum(live(np.full(rows[t], -1, np.int64), fwd_last[t], row_bytes(types[t])) for t in range(len(types)))
    return int((ct + fwd).max()), int(ct.max()), sum(rows[t] * row_bytes(types[t]) for t in floats)


def bounds(live: dict[str, int], temp: int, arena: int, activation: int) -> dict[str, int | float]:
    """``live`` (``liveness``) with the step's other temporaries (``temp`` less the forward and
    cotangent arenas: the loop items' and groups' buffers) and, over ``activation`` bytes, the
    step's temporaries if its cotangent rows lived only as long as needed (``ct_live_ratio``), if
    forward and cotangent rows shared storage so (``shared_ratio``), the latter's floor with no
    other temporaries at all (``shared_floor``), and the step's temporaries if, besides, the tail
    groups ran their backward node by node with the stages that made their inputs
    (``deferred_ratio``)."""
    other = temp - arena - live["ct_arena_bytes"]
    return {**live, "other_bytes": other,
            "ct_live_ratio": (arena + live["ct_peak_bytes"] + other) / activation,
            "shared_ratio": (live["shared_peak_bytes"] + other) / activation,
            "shared_floor": live["shared_peak_bytes"] / activation,
            "deferred_ratio": (live["deferred_peak_bytes"] + other) / activation}


def measure(compiler: fd.Compiler, step: Any, params: Any, opt_state: Any, trees: list) -> dict[str, Any]:
    """Activation, arena and XLA temporary bytes of one training step on ``trees``."""
    batch = compiler.build_batch(trees, exact_layout=True)
    sizes = [row_bytes(t) for t in compiler.program.types]
    rows = batch.stats.type_rows
    allocated = [r + batch.layout.chunk for r in batch.layout.arena_rows]
    floats = [i for i, t in enumerate(compiler.program.types) if jax.numpy.issubdtype(t.dtype, jax.numpy.inexact)]
    compiled = step.lower(params, opt_state, batch, jax.random.key(0)).compile()
    analysis = compiled.memory_analysis()
    activation = sum(r * s for r, s in zip(rows, sizes))
    arena = sum(a * s for a, s in zip(allocated, sizes))
    return {
        "trees": len(trees), "nodes": batch.stats.num_nodes, "size_class": batch.layout.size_class,
        "chunk": batch.layout.chunk, "saves": bool(batch.layout.saved_rows),
        "occupancy": batch.stats.rows / batch.layout.size_class,
        "activation_bytes": activation,
        "float_activation_bytes": sum(rows[i] * sizes[i] for i in floats),
        "arena_bytes": arena,
        "float_arena_bytes": sum(allocated[i] * sizes[i] for i in floats),
        "temp_bytes": analysis.temp_size_in_bytes,
        "argument_bytes": analysis.argument_size_in_bytes,
        "output_bytes": analysis.output_size_in_bytes,
        "params_bytes": sum(x.nbytes for x in jax.tree.leaves(params)),
        "ratio": analysis.temp_size_in_bytes / activation,
        **bounds(liveness(compiler, batch), analysis.temp_size_in_bytes, arena, activation),
    }


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    all_trees = sst.load("train", sst.data_dir(args.data_dir, args.quick))
    rng = random.Random(0)
    compiler = fd.Compiler.create(models.sst_model(sst.vocabulary(all_trees), state_size=args.hidden,
                                                   embed_size=args.embed_size), backward=args.backward,
                                  **({} if args.chunk_size is None else {"chunk_size": args.chunk_size}))
    params = compiler.init(jax.random.key(0))
    optimizer = optax.sgd(0.05)
    opt_state = optimizer.init(params)
    step = make_train_step(compiler, optimizer)

    rows = []
    for i in range(args.batches):
        print(f"batch {i + 1}/{args.batches}: compiling the step to read its buffer assignment ...", flush=True)
        rows.append(measure(compiler, step, params, opt_state, rng.sample(all_trees, args.batch_size)))
    mb = lambda b: f"{b / 2**20:.1f}"  # noqa: E731
    print_table(f"SST training step at batch {args.batch_size}, H={args.hidden}, backward={args.backward}, "
                f"C={rows[0]['chunk']} (MiB)",
                ["nodes", "A", "occupancy", "saves", "activations", "arenas", "cotangent arenas", "other",
                 "step temporaries", "temp / activations", "cotangents live", "rows shared", "shared, no other",
                 "shared, tail deferred"],
                [[r["nodes"], r["size_class"], f"{r['occupancy']:.2f}", "yes" if r["saves"] else "no",
                  mb(r["activation_bytes"]), mb(r["arena_bytes"]), mb(r["ct_arena_bytes"]), mb(r["other_bytes"]),
                  mb(r["temp_bytes"]), f"{r['ratio']:.2f}", f"{r['ct_live_ratio']:.2f}", f"{r['shared_ratio']:.2f}",
                  f"{r['shared_floor']:.2f}", f"{r['deferred_ratio']:.2f}"]
                 for r in rows])
    print("(cotangents live: the step if each cotangent row lived only from its first writer to its reader; "
          "rows shared: if forward values and cotangents shared rows so; no other: without the items' and "
          "groups' buffers; tail deferred: rows shared, with each tail group node's backward run in the stage that "
          "made its inputs)")
    worst = max(r["ratio"] for r in rows)
    print(f"\nworst ratio {worst:.2f} (goal <= {GOAL}); parameters {mb(rows[0]['params_bytes'])} MiB")
    results = {"args": vars(args), "goal": GOAL, "worst_ratio": worst, "batches": rows}
    name = "memory" + ("" if args.backward == "auto" else f"_{args.backward}") + (
        "" if args.chunk_size is None else f"_c{args.chunk_size}")
    save_results(name, results, args, lambda png: plot(rows, png))
    return results


def plot(rows: list[dict], path: Any) -> None:
    """Per batch: activation bytes, arena bytes and the step's temporaries (MiB)."""
    x = np.arange(len(rows))
    with figure(path) as ax:
        for k, (key, label) in enumerate((("activation_bytes", "activations"), ("arena_bytes", "arenas"),
                                          ("temp_bytes", "step temporaries"))):
            ax.bar(x + (k - 1) * 0.27, [r[key] / 2**20 for r in rows], 0.27, label=label)
        ax.set(xticks=x, xticklabels=[f"batch {i + 1}" for i in x], ylabel="MiB",
               title="memory of one SST training step")
        ax.legend()


if __name__ == "__main__":
    main()
