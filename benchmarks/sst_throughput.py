"""Tree-LSTM training throughput on real SST: fold against the peers, in the same run.

The model is ``benchmarks.models.sst_model`` (binary Tree-LSTM, per-node
5-way softmax loss, SGD). For each hidden size and batch size, fold's
trees/s is measured three ways: the device alone on pre-built batches, the
host alone (``build_batch``), and end to end through ``compiler.batches``
with ``--workers 0`` and with worker processes building ahead, and end to
end from examples recorded once (``compiler.record``). The peers
(``benchmarks/sst_peers.py``, the same model and loss from the same
parameters) run on the same trees:

- PyTorch eager, one tree at a time (``--peer-trees`` trees);
- PyTorch with hand-written level batching, flattening each batch's trees
  every step, and (to compare with fold's recorded examples) on batches
  flattened once before timing;
- DyNet's automatic batching (``--dynet-trees`` trees; optional, ``pip
  install dynet38``);
- plain JAX ``jit`` per tree shape (once per hidden size, on
  ``--jax-trees`` trees: time with compilations, time once compiled, and
  the compile time one epoch would need for the train set's distinct shapes).

Goals at batch 64, hidden 150: >= 10x PyTorch eager, >= 1.5x level batching,
>= 900 trees/s. PyTorch is optional (``pip install torch==2.13.0``); without
it those columns are skipped.

Run: ``python -m benchmarks.sst_throughput`` (``--quick`` for a seconds-long run).
"""

from __future__ import annotations

import argparse
import importlib.util
import random
from collections.abc import Callable
from typing import Any

import jax
import optax

import fold as fd
from benchmarks import models, sst_peers
from benchmarks.common import add_run_flags, figure, make_train_step, median_seconds, save_results, timed
from examples import sst
from examples.common import COUNT, print_table
from fold.compiler.saving import BACKWARDS

LEARNING_RATE = 0.05
GOALS = {"batch_size": 64, "hidden": 150, "vs_torch_eager": 10.0, "vs_torch_levels": 1.5, "trees_per_s": 900}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-sizes", type=COUNT, nargs="+", default=[25, 64, 128, 256])
    p.add_argument("--hidden", type=COUNT, nargs="+", default=[150, 300])
    p.add_argument("--embed-size", type=COUNT, default=100)
    p.add_argument("--trees", type=COUNT, default=2048, help="training trees per fold and level-batching run")
    p.add_argument("--peer-trees", type=COUNT, default=256, help="trees for PyTorch eager (slow)")
    p.add_argument("--jax-trees", type=COUNT, default=16, help="trees for JAX jit per tree (compiles per shape)")
    p.add_argument("--dynet-trees", type=COUNT, default=512, help="trees for DyNet autobatching")
    p.add_argument("--backward", choices=BACKWARDS, default="auto", help="fold's backward through the loop")
    p.add_argument("--workers", type=COUNT, default=1, help="worker processes for the background run")
    p.add_argument("--repeats", type=COUNT, default=3)
    p.add_argument("--no-peers", action="store_true", help="measure fold only")
    add_run_flags(p, "sst_throughput", "the committed sample, tiny model")
    args = p.parse_args(argv)
    if args.quick:
        args.batch_sizes, args.hidden, args.embed_size = [16], [16], 16
        args.trees, args.peer_trees, args.jax_trees, args.dynet_trees, args.repeats = 64, 16, 1, 32, 1
    return args


def full_batches(trees: list, batch_size: int) -> list[list]:
    """``trees`` cut into batches of ``batch_size``, dropping the remainder (one layout)."""
    return [trees[i:i + batch_size] for i in range(0, len(trees) - batch_size + 1, batch_size)]


def rate(seconds: float, trees: int) -> float:
    return trees / seconds if seconds > 0 else float("inf")


def measure_fold(trees: list, word_idx: dict, batch_size: int, hidden: int,
                 args: argparse.Namespace) -> tuple[dict[str, Any], dict]:
    """fold's host, device and end-to-end trees/s for one (batch size, hidden) pair, and its initial params."""
    compiler = fd.Compiler.create(models.sst_model(word_idx, state_size=hidden, embed_size=args.embed_size),
                                  backward=args.backward)
    params = compiler.init(jax.random.key(0))
    optimizer = optax.sgd(LEARNING_RATE)
    opt_state = optimizer.init(params)
    step = make_train_step(compiler, optimizer)
    key = jax.random.key(0)
    chunks = full_batches(trees, batch_size)
    n = len(chunks) * batch_size

    def run(batches: Any) -> None:
        p, s, loss = params, opt_state, None
        for b in batches:
            p, s, loss = step(p, s, b, key)
        jax.block_until_ready(loss)

    built = [compiler.build_batch(c) for c in chunks]  # also warms the host walk up
    host = median_seconds(lambda: [compiler.build_batch(c) for c in chunks], args.repeats)
    _, compile_s = timed(lambda: run(built[:1]))
    run(built)  # compiles the other layouts these batches have: steady state is what is timed
    device = median_seconds(lambda: run(built), args.repeats)
    flat = [x for c in chunks for x in c]
    serial = median_seconds(lambda: run(compiler.batches(flat, batch_size)), args.repeats)
    ahead = median_seconds(lambda: run(compiler.batches(flat, batch_size, num_workers=args.workers)), args.repeats)
    recorded, record_s = timed(lambda: compiler.record(flat))
    from_records = median_seconds(lambda: run(compiler.batches(recorded, batch_size)), args.repeats)
    return {"trees": n, "batches": len(chunks), "compile_s": compile_s, "record_s": record_s,
            "trees_per_s_recorded": rate(from_records, n), "host_share_recorded": max(0.0, 1.0 - device / from_records),
            "host_s_per_batch": host / len(chunks), "device_s_per_batch": device / len(chunks),
            "host_trees_per_s": rate(host, n), "device_trees_per_s": rate(device, n),
            "trees_per_s": rate(serial, n), "trees_per_s_workers": rate(ahead, n),
            # The share of a step that is not device time. Even with no workers JAX's asynchronous
            # dispatch lets the host build batch i + 1 while the device runs step i.
            "host_share_serial": max(0.0, 1.0 - device / serial),
            "host_share_workers": max(0.0, 1.0 - device / ahead)}, params


def measure_peer(make: Callable[[], Any], trees: list, batch_size: int, repeats: int,
                 prepare: Callable[[list], Any] | None = None) -> dict[str, float]:
    """Trees/s of a peer's ``train_step`` over ``trees`` in batches (one warm-up batch first); with
    ``prepare``, each batch is prepared once before timing and the peer trains on what it returns."""
    chunks = full_batches(trees, batch_size) or [trees]
    n = sum(map(len, chunks))
    if prepare is not None:
        chunks = [prepare(c) for c in chunks]
    model = make()
    model.train_step(chunks[0])

    def run() -> None:
        for c in chunks:
            model.train_step(c)

    return {"trees": n, "trees_per_s": rate(median_seconds(run, repeats), n)}


def measure_jax_per_tree(params: dict, word_idx: dict, trees: list, all_trees: list) -> dict[str, float]:
    """Plain JAX jit per tree shape: first pass (compiling each new shape), second pass (all compiled),
    and the compile time one epoch over ``all_trees`` would need."""
    model = sst_peers.JaxPerTree(params, word_idx, LEARNING_RATE)
    _, cold = timed(lambda: model.train_step(trees))
    _, warm = timed(lambda: model.train_step(trees))
    shapes = len({sst_peers.shape_of(t) for t in all_trees})
    per_shape = max(cold - warm, 0.0) / len(model.compiled)
    return {"trees": len(trees), "distinct_shapes_in_sample": len(model.compiled),
            "trees_per_s_compiling": rate(cold, len(trees)), "trees_per_s_compiled": rate(warm, len(trees)),
            "compile_s_per_shape": per_shape, "distinct_shapes_in_train": shapes,
            "estimated_epoch_compile_s": per_shape * shapes}


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    all_trees = sst.load("train", sst.data_dir(args.data_dir, args.quick))
    word_idx = sst.vocabulary(all_trees)
    rng = random.Random(0)
    trees = rng.sample(all_trees, min(args.trees, len(all_trees)))
    has_torch = importlib.util.find_spec("torch") is not None and not args.no_peers
    if not has_torch and not args.no_peers:
        print("PyTorch is not installed (pip install torch==2.13.0): its peers are skipped")
    if has_torch:
        import torch

        torch.manual_seed(0)
    has_dynet = importlib.util.find_spec("dynet") is not None and not args.no_peers
    if not has_dynet and not args.no_peers:
        print("DyNet is not installed (pip install dynet38): its autobatching peer is skipped")

    results: dict[str, Any] = {"args": vars(args), "goals": GOALS, "torch": has_torch, "runs": [], "jax_per_tree": {}}
    for hidden in args.hidden:
        for b in args.batch_sizes:
            print(f"hidden {hidden}, batch {b}: fold ...", flush=True)
            fold_run, params = measure_fold(trees, word_idx, b, hidden, args)
            run = {"hidden": hidden, "batch_size": b, "fold": fold_run}
            plain = sst_peers.plain_params(params)
            if has_torch:
                print(f"hidden {hidden}, batch {b}: PyTorch eager and level batching ...", flush=True)
                run["torch_eager"] = measure_peer(lambda: sst_peers.TorchEager(plain, word_idx, LEARNING_RATE),
                                                  trees[:args.peer_trees], b, 1)
                levels = lambda: sst_peers.TorchLevels(plain, word_idx, LEARNING_RATE)  # noqa: E731
                run["torch_levels"] = measure_peer(levels, trees, b, args.repeats)
                run["torch_levels_prepared"] = measure_peer(levels, trees, b, args.repeats,
                                                            prepare=lambda c: sst_peers.Flat(c, word_idx))
            if has_dynet:
                print(f"hidden {hidden}, batch {b}: DyNet autobatching ...", flush=True)
                run["dynet_autobatch"] = measure_peer(
                    lambda: sst_peers.DynetAutobatch(plain, word_idx, LEARNING_RATE), trees[:args.dynet_trees], b, 1)
            results["runs"].append(run)
        if not args.no_peers:
            print(f"hidden {hidden}: plain JAX jit per tree ({args.jax_trees} trees) ...", flush=True)
            results["jax_per_tree"][str(hidden)] = measure_jax_per_tree(plain, word_idx, trees[:args.jax_trees],
                                                                       all_trees)
    report(results, args)
    save_results("sst_throughput", results, args, lambda png: plot(results, png))
    return results


def report(results: dict, args: argparse.Namespace) -> None:
    """Prints the tables, and fold's speedups over each peer."""
    rows, recorded_rows = [], []
    for r in results["runs"]:
        f = r["fold"]
        eager = r.get("torch_eager", {}).get("trees_per_s")
        levels = r.get("torch_levels", {}).get("trees_per_s")
        jit = results["jax_per_tree"].get(str(r["hidden"]), {}).get("trees_per_s_compiled")
        prepared = r.get("torch_levels_prepared", {}).get("trees_per_s")
        dynet = r.get("dynet_autobatch", {}).get("trees_per_s")
        r["speedup"] = {"vs_dynet_autobatch": f["trees_per_s"] / dynet if dynet else None,
                        "vs_torch_eager": f["trees_per_s"] / eager if eager else None,
                        "vs_torch_levels": f["trees_per_s"] / levels if levels else None,
                        "recorded_vs_torch_levels_prepared": f["trees_per_s_recorded"] / prepared if prepared else None,
                        "vs_jax_per_tree_compiled": f["trees_per_s"] / jit if jit else None}
        cell = lambda v: f"{v:.0f}" if v else "-"  # noqa: E731
        ratio = lambda v: f"{v:.1f}x" if v else "-"  # noqa: E731
        rows.append([r["hidden"], r["batch_size"], cell(f["trees_per_s"]), cell(f["trees_per_s_workers"]),
                     cell(f["device_trees_per_s"]), cell(f["host_trees_per_s"]), f"{100 * f['host_share_serial']:.0f}%",
                     f"{100 * f['host_share_workers']:.0f}%", cell(eager), cell(levels), cell(dynet),
                     ratio(r["speedup"]["vs_torch_eager"]), ratio(r["speedup"]["vs_torch_levels"]),
                     ratio(r["speedup"]["vs_dynet_autobatch"])])
        recorded_rows.append([r["hidden"], r["batch_size"], f"{f['record_s']:.2f}", cell(f["trees_per_s_recorded"]),
                              f"{100 * f['host_share_recorded']:.0f}%", cell(prepared),
                              ratio(r["speedup"]["recorded_vs_torch_levels_prepared"])])
    print_table(f"SST Tree-LSTM training, trees/s (workers = {args.workers} in the background column)",
                ["H", "batch", "fold", "fold+workers", "device only", "host only", "host share", "share w/ workers",
                 "torch eager", "torch levels", "dynet", "vs eager", "vs levels", "vs dynet"], rows)
    print_table("Examples prepared once: fold from compiler.record, PyTorch levels on batches flattened once",
                ["H", "batch", "record (s)", "fold, recorded", "host share", "torch levels, prepared",
                 "vs prepared levels"], recorded_rows)
    for hidden, j in results["jax_per_tree"].items():
        print(f"\nplain JAX jit per tree, H={hidden}: {j['trees_per_s_compiling']:.1f} trees/s while compiling "
              f"({j['compile_s_per_shape']:.2f} s per new shape), {j['trees_per_s_compiled']:.0f} trees/s once "
              f"compiled; the train set has {j['distinct_shapes_in_train']} distinct shapes: about "
              f"{j['estimated_epoch_compile_s'] / 60:.0f} min of compiling before the first epoch ends")


def plot(results: dict, path: Any) -> None:
    """Trees/s against batch size per hidden size: fold (serial and with workers) and the peers, log y."""
    with figure(path, (7, 4)) as ax:
        for hidden in sorted({r["hidden"] for r in results["runs"]}):
            runs = [r for r in results["runs"] if r["hidden"] == hidden]
            sizes = [r["batch_size"] for r in runs]
            ax.plot(sizes, [r["fold"]["trees_per_s"] for r in runs], "o-", label=f"fold H={hidden}")
            ax.plot(sizes, [r["fold"]["trees_per_s_workers"] for r in runs], "o:", label=f"fold+workers H={hidden}")
            ax.plot(sizes, [r["fold"]["trees_per_s_recorded"] for r in runs], "o-.", label=f"fold recorded H={hidden}")
            for peer, style in (("torch_eager", "s--"), ("torch_levels", "^--"), ("dynet_autobatch", "v--")):
                if peer in runs[0]:
                    ax.plot(sizes, [r[peer]["trees_per_s"] for r in runs], style, label=f"{peer} H={hidden}")
        ax.set(xscale="log", yscale="log", xlabel="batch size", ylabel="trees / s", title="SST Tree-LSTM training")
        ax.legend(fontsize=7)


if __name__ == "__main__":
    main()
