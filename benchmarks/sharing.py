"""DAGs with exponentially many paths: host and device time against distinct nodes, not paths.

Each example is a chain of ``n`` pairs over one leaf: ``k`` of them read the pair before twice
(``(x, x)``, doubling the paths), the others read it and a new leaf (``(x, leaf)``), so the
example has ``n`` distinct pairs and at least ``2**k`` paths from its root to the first leaf. The
model is ``docs/sharing.md``'s: a ``fd.Shared`` recursion, ``Concat`` then a dense layer per
pair, a dense layer per leaf. Two sweeps, each point a batch of ``--examples`` examples:

- ``n`` from 64 to 4,096 at ``k = min(n, 60)``: host time to build the batch and device time of
  the jitted forward pass, which should grow linearly in ``n``;
- ``k`` from 0 to 60 at ``n = 1,024``: both should stay flat.

Run: ``python -m benchmarks.sharing`` (``--quick``: small, seconds). Writes
``benchmarks/results/sharing.json`` and a plot.
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Callable
from typing import Any

import jax

import fold as fd
from benchmarks.common import add_run_flags, figure, median_seconds, save_results


def model(hidden: int) -> fd.Block:
    expr = fd.ForwardDeclaration(fd.PyObjectType(), fd.TensorType((hidden,)))
    leaf = fd.Scalar() >> fd.Function(lambda x: x[:, None]) >> fd.FC(hidden, name="leaf")
    pair = fd.Record((expr(), expr())) >> fd.Concat() >> fd.FC(hidden, name="pair")
    expr.resolve_to(fd.Shared(fd.OneOf(lambda x: isinstance(x, tuple), {False: leaf, True: pair})))
    return expr()


def dag(rng: random.Random, n: int, k: int) -> tuple:
    """``n`` pairs in a chain, ``k`` of them (at random places) doubling the paths."""
    doubling = set(rng.sample(range(n), k))
    x: Any = rng.random()
    for i in range(n):
        x = (x, x) if i in doubling else (x, rng.random())
    return x


def point(compiler: fd.Compiler, forward: Callable, params: dict, n: int, k: int, args: argparse.Namespace) -> dict:
    rng = random.Random(n * 100 + k)
    examples = [dag(rng, n, k) for _ in range(args.examples)]
    batch = compiler.build_batch(examples)
    jax.block_until_ready(forward(params, batch))
    build = median_seconds(lambda: compiler.build_batch(examples), args.repeats)
    device = median_seconds(lambda: jax.block_until_ready(forward(params, batch)), args.repeats)
    row = {"n": n, "k": k, "paths_log2": k, "calls": batch.stats.num_nodes, "build_seconds": build,
           "device_seconds": device}
    print(f"n {n:5d}  k {k:2d}: {row['calls']:6d} calls, build {build * 1e3:8.2f} ms, device {device * 1e3:8.2f} ms")
    return row


def run(args: argparse.Namespace) -> dict[str, Any]:
    compiler = fd.Compiler.create(model(args.hidden))
    params = compiler.init(jax.random.key(0))
    forward = jax.jit(lambda p, b: compiler.apply(p, b).outputs)
    by_n = [point(compiler, forward, params, n, min(n, 60), args) for n in args.sizes]
    by_k = [point(compiler, forward, params, args.fixed_n, k, args) for k in args.doublings]
    return {"args": {k: v for k, v in vars(args).items() if k != "json"}, "by_n": by_n, "by_k": by_k}


def plot(result: dict[str, Any]) -> Callable[[Any], None]:
    def draw(path: Any) -> None:
        with figure(path, size=(9, 3.5)) as ax:
            rows = result["by_n"]
            for key, label in (("build_seconds", "host build"), ("device_seconds", "device forward")):
                ax.plot([r["n"] for r in rows], [r[key] * 1e3 for r in rows], marker="o",
                        label=f"{label}, k = min(n, 60)")
            rows = result["by_k"]
            for key, label in (("build_seconds", "host build"), ("device_seconds", "device forward")):
                ax.plot([rows[0]["n"]] * len(rows), [r[key] * 1e3 for r in rows], linestyle="none", marker="x",
                        label=f"{label}, n = {rows[0]['n']}, k = 0..60")
            ax.set(xscale="log", yscale="log", xlabel="distinct pairs n per example", ylabel="ms per batch",
                   title=f"DAGs with 2^k paths, {result['args']['examples']} examples a batch")
            ax.legend(fontsize=7)
    return draw


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[64, 256, 1024, 4096])
    p.add_argument("--doublings", type=int, nargs="+", default=[0, 15, 30, 45, 60])
    p.add_argument("--fixed-n", type=int, default=1024)
    p.add_argument("--examples", type=int, default=4, help="examples per batch")
    p.add_argument("--hidden", type=int, default=16)
    p.add_argument("--repeats", type=int, default=5)
    add_run_flags(p, "sharing", "n up to 256, k up to 60", data_dir=False)
    args = p.parse_args(argv)
    if args.quick:
        args.sizes, args.doublings, args.fixed_n, args.repeats = [64, 256], [0, 60], 128, 2
    if any(k > args.fixed_n for k in args.doublings):
        p.error(f"--doublings must be at most --fixed-n ({args.fixed_n}), got {args.doublings}")
    result = run(args)
    save_results("sharing", result, args, plot(result))
    return result


if __name__ == "__main__":
    main()
