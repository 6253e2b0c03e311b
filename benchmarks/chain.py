"""A loop item against a step of a hand-written ``lax.scan``: what one iteration costs.

Chains are the case where fold's per-item cost is all there is: every depth holds one row per
example, so a batch of ``B`` chains of length ``L`` is ``L`` loop items of ``B`` rows. This
trains a one-layer tanh RNN over chains of scalars (an embedding ``FC`` per element, then
``h = tanh([h; e] W + b)`` along the chain, loss ``sum(h_L ** 2)`` per chain, SGD) in fold
(``fd.Map`` and ``fd.Fold``) and as the same network in plain JAX: the embeddings as one call,
the recurrence as one ``lax.scan``, jitted with its gradient and update, the way one writes a
fixed-length RNN by hand. Both start from the same parameters and their losses and updated
parameters are checked equal. Steps take turns, at two chain lengths: the difference of the
step times over the difference of the lengths is what one more loop item costs (fold) and one
more scan step (JAX), with the step's fixed costs (the embeddings, the loss, the weight pass,
the call itself) taken out. Their ratio is 1 where a loop item costs what XLA's own loop step
costs on this machine.

Run: ``python -m benchmarks.chain`` (``--quick``: a seconds-long run). Writes
``benchmarks/results/chain.json`` and a plot.
"""

from __future__ import annotations

import argparse
import pathlib
import random
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

import fold as fd
from benchmarks.common import add_run_flags, figure, interleaved_medians, make_train_step, save_results
from examples.common import COUNT, print_table


def fold_model(hidden: int) -> fd.Block:
    """A chain of floats -> ``sum(h ** 2)`` of the RNN's last state, as the ``loss`` metric."""
    element = fd.Scalar() >> fd.Function(lambda x: x[:, None]) >> fd.FC(hidden, activation=jnp.tanh, name="embed")
    cell = fd.Concat() >> fd.FC(hidden, activation=jnp.tanh, name="cell")
    last = fd.Map(element) >> fd.Fold(cell, fd.Zeros(hidden))
    return last >> fd.Function(lambda h: jnp.sum(h * h, axis=-1)) >> fd.Metric("loss")


def scan_loss(params: Any, xs: jax.Array) -> jax.Array:
    """The same network in plain JAX on ``xs`` ``[length, batch]``: its mean loss over the batch."""
    embed, cell = params["embed"], params["cell"]
    e = jnp.tanh(xs[..., None] @ embed["w"] + embed["b"])

    def step(h: jax.Array, e_t: jax.Array) -> tuple[jax.Array, None]:
        return jnp.tanh(jnp.concatenate([h, e_t], -1) @ cell["w"] + cell["b"]), None

    h, _ = jax.lax.scan(step, jnp.zeros((xs.shape[1], cell["b"].shape[0]), xs.dtype), e)
    return jnp.mean(jnp.sum(h * h, axis=-1))


def steps(batch_size: int, length: int, hidden: int, seed: int = 0) -> tuple[dict[str, Any], int, int, float]:
    """Both training steps on ``batch_size`` random chains of ``length``, as zero-argument calls;
    fold's loop items and C, and how far apart the two steps' losses and updated parameters are."""
    rng = random.Random(seed)
    chains = [[rng.uniform(-1, 1) for _ in range(length)] for _ in range(batch_size)]
    compiler = fd.Compiler.create(fold_model(hidden))
    params = compiler.init(jax.random.key(seed))
    optimizer = optax.sgd(0.01)
    fold_step = make_train_step(compiler, optimizer)
    batch = jax.device_put(compiler.build_batch(chains))
    fold_args = (params, optimizer.init(params), batch, None)

    @jax.jit
    def scan_step(params: Any, opt_state: Any, xs: jax.Array) -> tuple:
        loss, grads = jax.value_and_grad(scan_loss)(params, xs)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    scan_args = (params, optimizer.init(params), jnp.asarray(np.array(chains, np.float32).T))
    fold_out = jax.block_until_ready(fold_step(*fold_args))
    scan_out = jax.block_until_ready(scan_step(*scan_args))
    gap = max(float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
              for a, b in zip(jax.tree_util.tree_leaves((fold_out[0], fold_out[2])),
                              jax.tree_util.tree_leaves((scan_out[0], scan_out[2]))))
    calls = {"fold": lambda: jax.block_until_ready(fold_step(*fold_args)),
             "scan": lambda: jax.block_until_ready(scan_step(*scan_args))}
    return calls, int(batch.arrays.n_items), batch.layout.chunk, gap


def measure(batch_size: int, lengths: tuple[int, int], hidden: int, repeats: int) -> dict[str, Any]:
    """Both steps at both ``lengths``, taking turns: their times and the cost of one more loop
    item (fold) and one more scan step (JAX)."""
    calls: dict[str, Any] = {}
    items, chunks, gaps = {}, {}, []
    for length in lengths:
        made, items[length], chunks[length], gap = steps(batch_size, length, hidden)
        calls.update({f"{name} {length}": call for name, call in made.items()})
        gaps.append(gap)
    ms = {key: 1000 * s for key, s in interleaved_medians(calls, repeats).items()}
    short, long = lengths
    per_item = 1000 * (ms[f"fold {long}"] - ms[f"fold {short}"]) / (items[long] - items[short])
    per_step = 1000 * (ms[f"scan {long}"] - ms[f"scan {short}"]) / (long - short)
    return {"batch_size": batch_size, "hidden": hidden, "lengths": list(lengths), "chunk": chunks[long],
            "loop_items": [items[n] for n in lengths],
            "ms": {name: [ms[f"{name} {n}"] for n in lengths] for name in ("fold", "scan")},
            "us_per_fold_item": per_item, "us_per_scan_step": per_step, "item_vs_scan_step": per_item / per_step,
            "largest_gap": max(gaps)}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-sizes", type=COUNT, nargs="+", default=[1, 16, 64, 256])
    p.add_argument("--hidden", type=COUNT, nargs="+", default=[64, 256])
    p.add_argument("--lengths", type=COUNT, nargs=2, default=[16, 48], help="the two chain lengths")
    p.add_argument("--repeats", type=COUNT, default=15, help="timed rounds")
    add_run_flags(p, "chain", "batch sizes 1 and 16, width 16, lengths 4 and 8, 3 rounds", data_dir=False)
    args = p.parse_args(argv)
    if args.quick:
        args.batch_sizes, args.hidden, args.lengths, args.repeats = [1, 16], [16], [4, 8], 3
    if args.lengths[0] >= args.lengths[1]:
        p.error(f"--lengths needs a shorter then a longer length, got {args.lengths}")
    runs = []
    for hidden in args.hidden:
        for batch_size in args.batch_sizes:
            runs.append(measure(batch_size, tuple(args.lengths), hidden, args.repeats))
            r = runs[-1]
            print(f"H {hidden}, batch {batch_size}: a loop item {r['us_per_fold_item']:.0f} us, a scan step "
                  f"{r['us_per_scan_step']:.0f} us (x{r['item_vs_scan_step']:.2f})", flush=True)
    short, long = args.lengths
    print_table(f"training steps (ms) on chains of {short} and {long}; what one more loop item and one more "
                "scan step cost (us)",
                ["H", "batch", "C", f"fold, {short}", f"fold, {long}", f"scan, {short}", f"scan, {long}",
                 "loop item", "scan step", "item / scan step"],
                [[r["hidden"], r["batch_size"], r["chunk"], *(f"{t:.2f}" for t in r["ms"]["fold"]),
                  *(f"{t:.2f}" for t in r["ms"]["scan"]), f"{r['us_per_fold_item']:.0f}",
                  f"{r['us_per_scan_step']:.0f}", f"{r['item_vs_scan_step']:.2f}"] for r in runs])
    result = {"runs": runs, "lengths": args.lengths, "repeats": args.repeats}

    def plot(path: pathlib.Path) -> None:
        with figure(path) as ax:
            for hidden in args.hidden:
                mine = [r for r in runs if r["hidden"] == hidden]
                ax.plot([r["batch_size"] for r in mine], [r["us_per_fold_item"] for r in mine], marker="o",
                        label=f"fold loop item, H {hidden}")
                ax.plot([r["batch_size"] for r in mine], [r["us_per_scan_step"] for r in mine], marker="s", ls="--",
                        label=f"lax.scan step, H {hidden}")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("batch size (chains)")
            ax.set_ylabel("us per loop item / scan step")
            ax.legend(fontsize=7)

    save_results("chain", result, args, plot)
    return result


if __name__ == "__main__":
    main()
