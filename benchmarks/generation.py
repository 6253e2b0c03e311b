"""Tree generation throughput: fold's device generation against per-example loops.

The model is a top-down Tree-LSTM decoder (Zhang et al. 2016, as Recursive Dataflow Graphs
benchmark it): a child's state is an LSTM step from its previous sibling's state (zeros for the
first child) with its parent's hidden state as input; every node chooses between a leaf and two
children (a linear layer on ``h``), and every leaf its label among ``--labels`` (another). Trees
are greedy from random start states, bounded by ``--max-levels`` and ``--max-nodes``.

- fold: ``fd.Generator`` on a ``fd.TreeDecoder``: every example's tree grown at once in one
  jitted ``while_loop`` (``generate``, rows padded to a power of two: batch 64 runs on 64 rows),
  the trees only (``states=False``) as the loops make them; timed again returning every node's
  state too (``generate``'s default).
- JAX per example: the same decoder one node at a time, Python recursion (a queue) on the host:
  one jitted call for a node's decisions and one for each child's state, the choice read back
  to the host after each node (as a per-example loop does).
- PyTorch eager per example (``pip install torch``): the same loop in PyTorch, no autograd.

All three use the same parameters and start states; the report gives trees per second, fold's
speedup over each, and how many trees each baseline grew exactly as fold did (float rounding
may flip a near-tie). The *cell need* is the decoder's work as one batched call per part, no
dependencies (a child step and the arity on every node, the label on every leaf): no generator
computes less, so a baseline's time over it bounds the speedup any batching can reach on the
machine. Goals (issue 51): batch 64 at least
20x the JAX loop and 5x PyTorch; batch 1 no slower than the JAX loop.

Run: ``python -m benchmarks.generation`` (``--quick``: small, seconds). Writes
``benchmarks/results/generation.json``.
"""

from __future__ import annotations

import argparse
import collections
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import fold as fd
from benchmarks.common import add_run_flags, figure, interleaved_medians, median_seconds, save_results

Tree = Any
"""A generated tree: a leaf's label (int) or a tuple of subtrees."""

# Seconds each generator runs untimed before its timed call in a round (``interleaved_medians``):
# fold's 5 ms calls ran 1.4x slower for 40 ms after the PyTorch loop's turn; the loops' own calls
# (50-100 ms) take that long anyway.
SETTLE = 0.1

FOLD_STATES = "fold, with per-node states"
"""fold returning every node's state too (``generate``'s default), beside the trees the loops make."""


def decoder(hidden: int, labels: int, max_levels: int, max_nodes: int) -> fd.TreeDecoder:
    """The top-down Tree-LSTM decoder (see the module docstring)."""
    child = fd.Function(lambda parent, sibling: (parent[1], sibling), name="parent_h") \
        >> fd.LSTMCell(hidden, name="child") >> fd.GetItem(1)
    return fd.TreeDecoder(child, fd.GetItem(1) >> fd.FC(2, activation=None, name="arity"),
                          fd.GetItem(1) >> fd.FC(labels, activation=None, name="label"),
                          arities=(0, 2), max_levels=max_levels, max_nodes=max_nodes)


def grow(start: Any, zeros: Any, decide: Callable[[Any], tuple[int, int]], step: Callable[[Any, Any], Any],
         max_levels: int, max_nodes: int) -> Tree:
    """One example's tree, one node at a time, with ``fd.TreeDecoder``'s queue and bounds:
    ``decide(state) -> (wants children, label)``, ``step(parent, sibling) -> state``."""
    state, depth, arity, label, kids = {0: start}, {0: 0}, {}, {}, collections.defaultdict(list)
    queue = collections.deque([(None, 0, None, 0)])  # (parent, position, previous sibling, number)
    count, refused = 1, False
    while queue:
        parent, position, sibling, number = queue.popleft()
        if parent is not None:
            state[number] = step(state[parent], state[sibling] if sibling is not None else zeros)
            depth[number] = depth[parent] + 1
            kids[parent].append(number)
        expands, leaf_label = decide(state[number])
        asks = 2 if expands and depth[number] < max_levels and not refused else 0
        granted = asks > 0 and count + asks <= max_nodes
        refused |= asks > 0 and not granted
        arity[number] = 2 if granted else 0
        label[number] = leaf_label
        first = count
        count += arity[number]
        if parent is not None and position + 1 < arity[parent]:
            queue.append((parent, position + 1, number, number + 1))
        if granted:
            queue.append((number, 0, None, first))
    built: dict[int, Tree] = {}
    for n in range(count - 1, -1, -1):  # children are numbered after their parent
        built[n] = label[n] if arity[n] == 0 else tuple(built.pop(k) for k in kids[n])
    return built[0]


class JaxPerExample:
    """The decoder one node at a time in JAX: a jitted call per node's decisions and per child."""

    def __init__(self, generator: fd.Generator, params: Any, args: argparse.Namespace):
        fns = generator._functions()
        self.args = args

        @jax.jit
        def decide(s):
            return jnp.argmax(fns["arity"](params, s), -1)[0], jnp.argmax(fns["label"](params, s), -1)[0]

        self.decide = decide
        self.step = jax.jit(lambda parent, sibling: fns["child"](params, (parent, sibling)))
        self.zeros = (jnp.zeros((1, args.hidden)), jnp.zeros((1, args.hidden)))

    def trees(self, starts: tuple[np.ndarray, np.ndarray]) -> list[Tree]:
        def decide(s):
            expands, label = self.decide(s)
            return int(expands) == 1, int(label)

        return [grow((jnp.asarray(c[None]), jnp.asarray(h[None])), self.zeros, decide, self.step,
                     self.args.max_levels, self.args.max_nodes) for c, h in zip(*starts)]


class TorchPerExample:
    """The decoder one node at a time in PyTorch eager mode (no autograd)."""

    def __init__(self, params: Any, args: argparse.Namespace):
        import torch

        # One thread: a node's ops are far too small to split, and threads fight the other loops' (a
        # 63-node tree took 2.5 s with the default threads on a busy 2-core machine).
        torch.set_num_threads(1)
        self.torch, self.args = torch, args
        self.p = {layer: {k: torch.tensor(np.asarray(v)) for k, v in leaves.items()}
                  for layer, leaves in params.items()}
        self.zeros = (torch.zeros(args.hidden), torch.zeros(args.hidden))

    def step(self, parent, sibling):
        t, p = self.torch, self.p["child"]
        z = t.cat([parent[1], sibling[1]]) @ p["w"] + p["b"]
        i, f, g, o = z.chunk(4)
        c = t.sigmoid(f + 1.0) * sibling[0] + t.sigmoid(i) * t.tanh(g)
        return c, t.sigmoid(o) * t.tanh(c)

    def decide(self, s):
        p = self.p
        expands = int((s[1] @ p["arity"]["w"] + p["arity"]["b"]).argmax()) == 1
        return expands, int((s[1] @ p["label"]["w"] + p["label"]["b"]).argmax())

    def trees(self, starts: tuple[np.ndarray, np.ndarray]) -> list[Tree]:
        t = self.torch
        with t.no_grad():
            return [grow((t.tensor(c), t.tensor(h)), self.zeros, self.decide, self.step, self.args.max_levels,
                         self.args.max_nodes) for c, h in zip(*starts)]


def cell_floor(generator: fd.Generator, params: Any, hidden: int, nodes: int, leaves: int, repeats: int) -> float:
    """Seconds of the decoder's work with no dependencies, jitted: a child step and the arity
    logits on ``nodes`` rows, the label logits on ``leaves`` rows, one batched call each. No
    schedule of those trees computes less: the bound on any generator's time (and on fold's
    speedup)."""
    fns = generator._functions()

    @jax.jit
    def cells(s, leaf):
        return fns["child"](params, (s, s)), fns["arity"](params, s), fns["label"](params, leaf)

    rows = (jnp.ones((nodes, hidden)), jnp.ones((nodes, hidden)))
    leaf_rows = (jnp.ones((leaves, hidden)), jnp.ones((leaves, hidden)))
    jax.block_until_ready(cells(rows, leaf_rows))
    return median_seconds(lambda: jax.block_until_ready(cells(rows, leaf_rows)), repeats)


def size(tree: Tree) -> int:
    return 1 + sum(map(size, tree)) if isinstance(tree, tuple) else 1


def run(args: argparse.Namespace) -> dict[str, Any]:
    generator = fd.Generator(decoder(args.hidden, args.labels, args.max_levels, args.max_nodes),
                             state_type=fd.TupleType(fd.TensorType((args.hidden,)), fd.TensorType((args.hidden,))))
    params = generator.init(jax.random.key(0))
    params["arity"]["b"] = jnp.array([0.0, args.expand_bias])
    peers: dict[str, Any] = {"JAX per example": JaxPerExample(generator, params, args)}
    try:
        peers["PyTorch per example"] = TorchPerExample(params, args)
    except ImportError:
        print("PyTorch is not installed: its loop is skipped (pip install torch)")
    rng = np.random.default_rng(0)
    runs = []
    for batch in args.batch_sizes:
        starts = tuple((args.start_scale * rng.normal(size=(batch, args.hidden))).astype(np.float32) for _ in range(2))

        def fold_trees(starts=starts, states=False):
            out = generator.generate(params, starts, states=states)
            jax.block_until_ready(out.log_prob)
            return out

        out = fold_trees()
        trees = out.trees()
        nodes = int(np.sum(out.num_nodes))
        leaves = int(np.sum(np.asarray(out.arity) == 0))
        floor = cell_floor(generator, params, args.hidden, nodes, leaves, args.repeats)
        agree = {}
        for name, peer in peers.items():
            theirs = peer.trees(starts)  # also warms its jitted calls up
            agree[name] = sum(a == b for a, b in zip(trees, theirs)) / batch
        # Taking turns: the machine's drift between the loops would otherwise enter their ratios.
        seconds = interleaved_medians(
            {"fold": fold_trees, FOLD_STATES: lambda: fold_trees(states=True),
             **{name: lambda peer=peer: peer.trees(starts) for name, peer in peers.items()}},
            args.repeats, warmup=2, settle=SETTLE)
        rate = {name: batch / s for name, s in seconds.items()}
        run = {"batch_size": batch, "trees_per_s": rate, "seconds": seconds, "same_trees": agree,
               "fold_speedup": {name: rate["fold"] / rate[name] for name in peers},
               "nodes": nodes, "leaves": leaves, "cell_need_seconds": floor,
               "fold_vs_cell_need": seconds["fold"] / floor,
               "speedup_at_cell_need": {name: seconds[name] / floor for name in peers},
               "mean_nodes": float(np.mean([size(t) for t in trees])), "truncated": float(np.mean(out.truncated))}
        runs.append(run)
        print(f"batch {batch}: " + ", ".join(f"{n} {r:.1f} trees/s" for n, r in rate.items())
              + f"; fold x{', x'.join(f'{v:.1f}' for v in run['fold_speedup'].values())}; mean nodes "
              f"{run['mean_nodes']:.1f}; same trees " + ", ".join(f"{v:.0%}" for v in agree.values())
              + f"; fold {run['fold_vs_cell_need']:.2f}x its cell need", flush=True)
    return {"runs": runs, "args": {k: v for k, v in vars(args).items() if k != "json"}}


def plot(result: dict[str, Any]) -> Callable[[Any], None]:
    def draw(path: Any) -> None:
        with figure(path) as ax:
            names = list(result["runs"][0]["trees_per_s"])
            width = 0.8 / len(names)
            for k, name in enumerate(names):
                ax.bar([i + k * width for i in range(len(result["runs"]))],
                       [r["trees_per_s"][name] for r in result["runs"]], width, label=name)
            ax.set_xticks([i + width for i in range(len(result["runs"]))],
                          [f"batch {r['batch_size']}" for r in result["runs"]])
            ax.set_yscale("log")
            ax.set_ylabel("trees per second")
            ax.set_title("Top-down Tree-LSTM generation")
            ax.legend()
    return draw


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 64])
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--labels", type=int, default=1000, help="leaf labels (a vocabulary)")
    p.add_argument("--max-levels", type=int, default=10)
    p.add_argument("--max-nodes", type=int, default=63)
    p.add_argument("--expand-bias", type=float, default=0.3,
                   help="bias of the expand logit: tree sizes (0.3: 28 nodes on average at batch 64)")
    p.add_argument("--start-scale", type=float, default=2.0, help="spread of the random start states")
    p.add_argument("--repeats", type=int, default=9)
    add_run_flags(p, "generation", "batch 1 and 8, small model", data_dir=False)
    args = p.parse_args(argv)
    if args.quick:
        args.batch_sizes, args.hidden, args.labels, args.repeats, args.max_nodes = [1, 8], 16, 20, 3, 31
    result = run(args)
    save_results("generation", result, args, plot(result))
    return result


if __name__ == "__main__":
    main()
