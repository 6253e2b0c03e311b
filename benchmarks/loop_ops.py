"""What one operation of a ``while_loop`` iteration costs on this backend, and how many fold's run.

A fold loop item is a few rows of work, so what it costs is mostly how many operations (XLA's
compiled kernels) its iteration runs, not their arithmetic. XLA's CPU runtime runs a loop body,
and each ``switch`` branch, as a sequence of kernels; a body of more than 8 kernels that do not
form one chain runs as a dataflow graph whose ready kernels are handed between threads. Two
measurements:

- **Loops of known bodies**: a ``while_loop`` whose body is a ``[rows, W] @ [W, W]`` matmul and
  a ``tanh``, then ``k`` writes of the result into an arena: into ``k`` different arenas
  (independent kernels) or ``k`` times into one (each write after the one before). Microseconds
  per iteration, best of ``--repeats`` calls of a 1000-iteration loop.
- **fold's items**: the kernels of the forward and backward loops of a training step, read from
  its compiled HLO: per loop, the operations around the ``switch`` and those of its branches.
  Models: the BiLSTM tagger with character LSTMs (batch 16, the DyNet suite's sizes) and the SST
  Tree-LSTM (batch 64, H 150).
- **Layouts of one item**: a tagger-like forward loop (LSTM cells of 50 and 64 units and a
  concatenation, taking turns, 16 rows an item) with an arena per type, as fold has them (five
  chunk writes an item, zero chunks for the types an operation does not write), with every
  type in one 128-wide arena (one write), and with arenas per type written inside the
  ``switch``'s branches, each branch its own outputs (no zero chunks; XLA's CPU backend copies
  every arena a branch updates, each iteration). Microseconds per item and kernels per
  iteration.

- **One item on XLA's threads and on one**: a treenn-like backward item (16 rows: 4 row gathers
  from a ``[2080, 128]`` arena, gates, three small matmuls of transposed weights, 3 scatter-adds)
  in a ``fori_loop``, whole, its matmuls alone, the rest alone and neither; in this process, and
  in a child process pinned to one core before JAX starts (Linux), where XLA's pool has one
  thread and hands no kernel between threads. Microseconds per iteration.

Run: ``python -m benchmarks.loop_ops --data-dir DIR`` (``--quick``: the committed sample).
Writes ``benchmarks/results/loop_ops.json`` and a plot.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import pathlib
import random
import re
import subprocess
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax import lax

import fold as fd
from benchmarks import models
from benchmarks.common import add_run_flags, figure, make_train_step, save_results
from examples import sst, tagger
from examples.common import COUNT, print_table

ITERATIONS = 1000
# Kinds of HLO instruction that run no kernel of their own.
_FREE = {"get-tuple-element", "tuple", "parameter", "constant", "bitcast"}


def loop_us(writes: int, chained: bool, rows: int, width: int, repeats: int) -> float:
    """Microseconds per iteration of the loop of known body (module docstring)."""
    arena_rows = 4096

    def run(x: jax.Array, w: jax.Array, arenas: list[jax.Array]) -> Any:
        def body(state: tuple) -> tuple:
            i, x, arenas = state
            y = jnp.tanh(x @ w)
            start = (i * rows) % arena_rows
            if chained:
                a = arenas[0]
                for j in range(writes):
                    a = lax.dynamic_update_slice(a, y * (j + 1), ((start + j * rows) % arena_rows, 0))
                arenas = [a]
            else:
                arenas = [lax.dynamic_update_slice(a, y * (j + 1), (start, 0)) for j, a in enumerate(arenas)]
            return i + 1, y, arenas

        return lax.while_loop(lambda s: s[0] < ITERATIONS, body, (0, x, arenas))[1:]

    x = jnp.ones((rows, width)) / width
    w = jnp.eye(width)
    arenas = [jnp.zeros((arena_rows, width)) for _ in range(1 if chained else writes)]
    return _best_seconds(jax.jit(run).lower(x, w, arenas).compile(), [x, w, arenas], repeats) / ITERATIONS * 1e6


ITEM_PARTS = ("whole", "matmuls", "rest", "neither")


def item_us(repeats: int, rows: int = 16, iterations: int = 200) -> dict[str, float]:
    """Microseconds per iteration of the treenn-like backward item (module docstring), per part
    of it kept (``ITEM_PARTS``), best of ``repeats`` calls."""
    arena_rows, width = 2080, 128
    keys = jax.random.split(jax.random.key(0), 5)
    u = jax.random.normal(keys[0], (256, 3 * width)) * 0.05  # read transposed, as a backward pass does
    f1, f2 = (jax.random.normal(k, (width, width)) * 0.05 for k in keys[1:3])
    arena = jax.random.normal(keys[3], (arena_rows, width))
    idx = jax.random.randint(keys[4], (iterations, 4, rows), 0, arena_rows)
    args = [arena, jnp.zeros_like(arena), u, f1, f2, idx]

    def by_t(x: jax.Array, w: jax.Array) -> jax.Array:
        return lax.dot_general(x, w, (((1,), (1,)), ((), ())))

    def make(matmuls: bool, rest: bool) -> Any:
        def run(arena: jax.Array, ct: jax.Array, u: jax.Array, f1: jax.Array, f2: jax.Array, idx: jax.Array) -> Any:
            def body(i: jax.Array, state: tuple) -> tuple:
                ct, acc = state
                ix = idx[i]
                if rest:
                    xs = [jnp.take(arena, ix[k], axis=0) for k in range(4)]
                    g = [jax.nn.sigmoid(xs[0] + xs[1]), jnp.tanh(xs[2] - xs[3]), jax.nn.sigmoid(xs[1] * xs[2])]
                    d = jnp.concatenate([g[0] * g[1], g[1] * g[2], g[0] + g[2]], axis=1)
                else:
                    d = jnp.tile(arena[:rows] * (1 + i * 1e-6), (1, 3))
                if matmuls:
                    a = by_t(d, u)
                    out = a[:, :width] + a[:, width:] + by_t(d[:, :width], f1) + by_t(d[:, width:2 * width], f2)
                else:
                    out = d[:, :width] + d[:, width:2 * width] + d[:, 2 * width:]
                if rest:
                    ct = ct.at[ix[0]].add(out).at[ix[1]].add(0.5 * out).at[ix[2]].add(-out)
                return ct, acc + out.sum()

            return lax.fori_loop(0, iterations, body, (ct, jnp.float32(0)))

        return jax.jit(run).lower(*args).compile()

    return {part: _best_seconds(make(part in ("whole", "matmuls"), part in ("whole", "rest")), args, repeats)
            / iterations * 1e6 for part in ITEM_PARTS}


def item_on_threads(repeats: int) -> dict[str, Any]:
    """``item_us`` here, on all of XLA's threads, and in a child process pinned to one core (None
    where threads cannot be pinned); for each, what the whole costs beyond its parts."""
    here = item_us(repeats)
    pinned = None
    if hasattr(os, "sched_setaffinity"):
        code = ("import json, os, sys; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
                "from benchmarks import loop_ops; print(json.dumps(loop_ops.item_us(int(sys.argv[1]))))")
        out = subprocess.run([sys.executable, "-c", code, str(repeats)], capture_output=True, text=True, check=True,
                             cwd=pathlib.Path(__file__).resolve().parents[1])
        pinned = json.loads(out.stdout.strip().splitlines()[-1])

    def beyond(us: dict[str, float]) -> float:
        return us["whole"] - (us["matmuls"] + us["rest"] - us["neither"])

    return {"threads": here, "one_core": pinned, "beyond_parts": {"threads": beyond(here),
                                                                  "one_core": beyond(pinned) if pinned else None}}


def _best_seconds(compiled: Any, args: list[Any], repeats: int) -> float:
    """The fastest of ``repeats`` calls of ``compiled`` on ``args``, after one untimed call."""
    jax.block_until_ready(compiled(*args))
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        best = min(best, time.perf_counter() - start)
    return best


def _lstm(w: jax.Array, x: jax.Array, h: jax.Array, c: jax.Array) -> tuple[jax.Array, jax.Array]:
    i, f, g, o = jnp.split(jnp.concatenate([x, h], -1) @ w, 4, -1)
    c = jax.nn.sigmoid(f + 1) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
    return c, jax.nn.sigmoid(o) * jnp.tanh(c)


def layout_items(repeats: int, rows: int = 16, items: int = 600) -> dict[str, Any]:
    """Microseconds per item (best of ``repeats``), kernels and copies of the layouts' loops
    (module docstring): ``per_type``, ``in_branch`` and ``one_arena``."""
    arena_rows, k = 8192, jax.random.key(0)
    w_word, w_char = jax.random.normal(k, (128 + 50, 200)) * 0.05, jax.random.normal(k, (20 + 64, 256)) * 0.05
    idx = jax.random.randint(k, (arena_rows, 3), 0, arena_rows // 2)
    chars = jax.random.normal(k, (arena_rows, 20))
    branch = jnp.arange(items) % 3

    def per_type(a128: jax.Array, a64: jax.Array, a50: jax.Array) -> Any:
        def body(state: tuple) -> tuple:
            i, a128, a64, a50 = state
            r = lax.dynamic_slice_in_dim(idx, (i * rows) % (arena_rows // 2), rows)
            z128, z64, z50 = jnp.zeros((1, rows, 128)), jnp.zeros((2, rows, 64)), jnp.zeros((2, rows, 50))

            def word(a128: jax.Array, a64: jax.Array, a50: jax.Array) -> tuple:
                return z128, z64, jnp.stack(_lstm(w_word, a128[r[:, 0]], a50[r[:, 1]], a50[r[:, 2]]))

            def char(a128: jax.Array, a64: jax.Array, a50: jax.Array) -> tuple:
                return z128, jnp.stack(_lstm(w_char, chars[r[:, 0]], a64[r[:, 1]], a64[r[:, 2]])), z50

            def join(a128: jax.Array, a64: jax.Array, a50: jax.Array) -> tuple:
                return jnp.concatenate([a64[r[:, 0]], a64[r[:, 1]]], -1)[None], z64, z50

            c128, c64, c50 = lax.switch(branch[i], [word, char, join], a128, a64, a50)
            out = arena_rows // 2 + (i * 5 * rows) % (arena_rows // 2 - 5 * rows)
            a128 = lax.dynamic_update_slice(a128, c128[0], (out, 0))
            for j in range(2):
                a64 = lax.dynamic_update_slice(a64, c64[j], (out + (1 + j) * rows, 0))
                a50 = lax.dynamic_update_slice(a50, c50[j], (out + (3 + j) * rows, 0))
            return i + 1, a128, a64, a50

        return lax.while_loop(lambda s: s[0] < items, body, (0, a128, a64, a50))[1:]

    def in_branch(a128: jax.Array, a64: jax.Array, a50: jax.Array) -> Any:
        def body(state: tuple) -> tuple:
            i, a128, a64, a50 = state
            r = lax.dynamic_slice_in_dim(idx, (i * rows) % (arena_rows // 2), rows)
            out = arena_rows // 2 + (i * 5 * rows) % (arena_rows // 2 - 5 * rows)

            def write(a: jax.Array, ys: tuple[jax.Array, ...], first: int) -> jax.Array:
                for j, y in enumerate(ys):
                    a = lax.dynamic_update_slice(a, y, (out + (first + j) * rows, 0))
                return a

            def word(a128: jax.Array, a64: jax.Array, a50: jax.Array) -> tuple:
                return a128, a64, write(a50, _lstm(w_word, a128[r[:, 0]], a50[r[:, 1]], a50[r[:, 2]]), 3)

            def char(a128: jax.Array, a64: jax.Array, a50: jax.Array) -> tuple:
                return a128, write(a64, _lstm(w_char, chars[r[:, 0]], a64[r[:, 1]], a64[r[:, 2]]), 1), a50

            def join(a128: jax.Array, a64: jax.Array, a50: jax.Array) -> tuple:
                return write(a128, (jnp.concatenate([a64[r[:, 0]], a64[r[:, 1]]], -1),), 0), a64, a50

            return i + 1, *lax.switch(branch[i], [word, char, join], a128, a64, a50)

        return lax.while_loop(lambda s: s[0] < items, body, (0, a128, a64, a50))[1:]

    def one_arena(a: jax.Array) -> Any:
        def body(state: tuple) -> tuple:
            i, a = state
            r = lax.dynamic_slice_in_dim(idx, (i * rows) % (arena_rows // 2), rows)

            def padded(*ys: jax.Array) -> jax.Array:
                both = jnp.concatenate(ys)
                return jnp.pad(both, ((0, 2 * rows - both.shape[0]), (0, 128 - both.shape[1])))

            def word(a: jax.Array) -> jax.Array:
                return padded(*_lstm(w_word, a[r[:, 0]], a[r[:, 1], :50], a[r[:, 2], :50]))

            def char(a: jax.Array) -> jax.Array:
                return padded(*_lstm(w_char, chars[r[:, 0]], a[r[:, 1], :64], a[r[:, 2], :64]))

            def join(a: jax.Array) -> jax.Array:
                return padded(jnp.concatenate([a[r[:, 0], :64], a[r[:, 1], :64]], -1))

            chunk = lax.switch(branch[i], [word, char, join], a)
            out = arena_rows // 2 + (i * 2 * rows) % (arena_rows // 2 - 2 * rows)
            return i + 1, lax.dynamic_update_slice(a, chunk, (out, 0))

        return lax.while_loop(lambda s: s[0] < items, body, (0, a))[1]

    typed = [jax.random.normal(k, (arena_rows, w)) for w in (128, 64, 50)]
    runs = {"per_type": (per_type, typed), "in_branch": (in_branch, typed),
            "one_arena": (one_arena, [jax.random.normal(k, (arena_rows, 128))])}
    result = {}
    for name, (fn, args) in runs.items():
        compiled = jax.jit(fn).lower(*args).compile()
        best = _best_seconds(compiled, args, repeats)
        [loop] = loop_kernels(compiled.as_text())
        result[name] = {"us_per_item": best / items * 1e6, "body": loop["body"], "branches": loop["branches"],
                        "copies": compiled.as_text().count(" copy(")}
    return result


def loop_kernels(hlo_text: str) -> list[dict[str, Any]]:
    """Per ``while`` body of ``hlo_text`` (a compiled module's text) that holds a ``conditional``:
    its kernels (the conditional counted as one) and the fewest and most of its branches'."""
    computations: dict[str, list[str]] = {}
    current = None
    for line in hlo_text.splitlines():
        m = re.match(r"^(?:ENTRY )?%(\S+) ", line)
        if m and line.rstrip().endswith("{"):
            current = m.group(1)
            computations[current] = []
        elif line.startswith("}"):
            current = None
        elif current is not None:
            computations[current].append(line.strip())

    def kernels(name: str) -> int:
        kinds = collections.Counter(m.group(1) for line in computations[name]
                                    if (m := re.match(r"(?:ROOT )?%\S+ = .*? ([a-z\-]+)\(", line)))
        return sum(n for kind, n in kinds.items() if kind not in _FREE)

    # The backward pass's loops run under ``transpose`` in their JAX names.
    bodies = {m.group(1): "backward" if "transpose(" in line else "forward"
              for text in computations.values() for line in text
              if " while(" in line and (m := re.search(r"body=%([\w.\-]+)", line))}
    loops = []
    for body, phase in sorted(bodies.items(), key=lambda kv: kv[1] == "backward"):
        switch = next((line for line in computations[body] if " conditional(" in line), None)
        if switch is None:
            continue
        names = re.search(r"branch_computations=\{([^}]*)\}", switch)
        assert names is not None  # a conditional names its branches
        branches = [kernels(b.strip().lstrip("%")) for b in names.group(1).split(",")]
        loops.append({"phase": phase, "body": kernels(body), "branches": [min(branches), max(branches)]})
    return loops


def fold_items(model: str, data_dir: str | None, quick: bool) -> dict[str, Any]:
    """Kernels per loop iteration of ``model``'s training step (forward loop first)."""
    trees = sst.load("train", sst.data_dir(data_dir, quick))
    random.Random(0).shuffle(trees)
    if model == "tagger":
        examples, batch_size = tagger.examples_of(trees), 16
        compiler = fd.Compiler.create(models.tagger_model(examples))
    else:
        examples, batch_size = trees, 64
        compiler = fd.Compiler.create(models.sst_model(sst.vocabulary(trees), 150))
    optimizer = optax.sgd(0.01)
    step = make_train_step(compiler, optimizer)
    params = compiler.init(jax.random.key(0))
    batch = next(iter(compiler.batches(examples[:batch_size * 16], batch_size)))
    text = step.lower(params, optimizer.init(params), batch, None).compile().as_text()
    loops = loop_kernels(text)
    return {"model": model, "batch_size": batch_size, "loop_items": int(batch.arrays.n_items), "loops": loops}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--writes", type=COUNT, nargs="+", default=[1, 2, 4, 8, 16])
    p.add_argument("--rows", type=COUNT, default=16, help="rows of the known bodies' matmul")
    p.add_argument("--width", type=COUNT, default=64, help="its width")
    p.add_argument("--repeats", type=COUNT, default=10, help="calls timed per loop (the best counts)")
    add_run_flags(p, "loop_ops", "writes 1 and 4, 2 calls per loop, the sample's tagger and SST")
    args = p.parse_args(argv)
    if args.quick:
        args.writes, args.repeats = [1, 4], 2
    known = [{"writes": k, "chained": chained, "us": loop_us(k, chained, args.rows, args.width, args.repeats)}
             for k in args.writes for chained in (False, True)]
    print_table(f"us per iteration: [{args.rows}, {args.width}] matmul and tanh, then k writes",
                ["k", "into k arenas", "k times into one"],
                [[k, *(f"{r['us']:.2f}" for r in known if r["writes"] == k)] for k in args.writes])
    layouts = layout_items(args.repeats)
    print_table("a tagger-like forward item: arenas per type, written after the switch or in its branches, "
                "against one arena for all types",
                ["layout", "us per item", "kernels", "copies"],
                [[name, f"{r['us_per_item']:.1f}", f"{r['body']} + {r['branches'][0]}-{r['branches'][1]}", r["copies"]]
                 for name, r in layouts.items()])
    threads = item_on_threads(args.repeats)
    print_table("us per iteration of a treenn-like backward item (16 rows), on XLA's threads and pinned to one core",
                ["part", "XLA's threads", "one core"],
                [[part, f"{threads['threads'][part]:.1f}",
                  f"{threads['one_core'][part]:.1f}" if threads["one_core"] else "-"] for part in ITEM_PARTS]
                + [["whole - parts", *(f"{v:.1f}" if v is not None else "-"
                                         for v in threads["beyond_parts"].values())]])
    items = [fold_items(model, args.data_dir, args.quick) for model in ("tagger", "sst")]
    print_table("kernels per loop iteration of a training step (around the switch + its branch)",
                ["model", "batch", "loop items", "forward", "backward"],
                [[r["model"], r["batch_size"], r["loop_items"],
                  *(" ".join(f"{lp['body']} + {lp['branches'][0]}-{lp['branches'][1]}" for lp in r["loops"]
                             if lp["phase"] == phase) for phase in ("forward", "backward"))]
                 for r in items])
    result = {"iterations": ITERATIONS, "rows": args.rows, "width": args.width, "repeats": args.repeats,
              "known_bodies": known, "layouts": layouts, "item_on_threads": threads, "fold_items": items}

    def plot(path: pathlib.Path) -> None:
        with figure(path) as ax:
            for chained, label in ((False, "writes into k arenas"), (True, "k writes into one arena")):
                mine = [r for r in known if r["chained"] == chained]
                ax.plot([r["writes"] for r in mine], [r["us"] for r in mine], marker="o", label=label)
            ax.set_xscale("log", base=2)
            ax.set_xlabel("writes per iteration (k)")
            ax.set_ylabel("us per iteration")
            ax.legend(fontsize=7)

    save_results("loop_ops", result, args, plot)
    return result


if __name__ == "__main__":
    main()
