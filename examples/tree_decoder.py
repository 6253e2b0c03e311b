"""A top-down Tree-LSTM (Zhang et al. 2016) that grows SST parse trees, words at the leaves, from
the sentence's sentiment.

The decoder (``fd.TreeDecoder``) starts from a state embedded from the root's sentiment label
(0-4); a child's state is an LSTM step from its previous sibling's state with its parent's
hidden state as input; every node decides whether it is a leaf or has two children, and every
leaf decides its word. Training is teacher forcing on the treebank's binary trees (the loss:
each decision's negative log-probability, averaged); then ``fd.Generator`` grows trees from each
sentiment on the device, every tree at once, and the report prints some as sentences (bracketed
by their structure), their sizes, and what the model thinks of them against the dev trees.

Words seen fewer than ``--min-count`` times in training are ``<unk>``.

Run: ``python -m examples.tree_decoder`` (``--quick`` for a few-second run).
"""

from __future__ import annotations

import argparse
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

import fold as fd
from examples import common, sst
from examples.common import COUNT, NATURAL, add_training_flags, print_table, write_report

SENTIMENTS = 5
UNK = "<unk>"


def shape(tree: Any, word_idx: dict[str, int]) -> Any:
    """An SST tree as ``fd.TreeDecoder`` reads it: a leaf's word id, or a pair of subtrees (the
    phrase labels dropped)."""
    if len(tree) == 2 and isinstance(tree[1], str):
        return word_idx.get(tree[1], word_idx[UNK])
    return tuple(shape(child, word_idx) for child in tree[1:])


def examples_of(trees: list[Any], word_idx: dict[str, int]) -> list[tuple[int, Any]]:
    """Per tree: ``(root sentiment, shape)``."""
    return [(tree[0], shape(tree, word_idx)) for tree in trees]


def build_decoder(vocabulary: int, args: argparse.Namespace) -> fd.TreeDecoder:
    """The top-down Tree-LSTM: LSTM child steps, a leaf-or-two-children decision, a word per leaf."""
    child = (fd.Function(lambda parent, sibling: (parent[1], sibling), name="parent_h")
             >> fd.LSTMCell(args.hidden, name="child") >> fd.GetItem(1))
    return fd.TreeDecoder(child, fd.GetItem(1) >> fd.FC(2, activation=None, name="expand"),
                          fd.GetItem(1) >> fd.FC(vocabulary, activation=None, name="word"),
                          arities=(0, 2), max_levels=args.max_levels, max_nodes=args.max_nodes)


def split_state(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """A ``[rows, 2H]`` vector as an LSTM state ``(c, h)``."""
    c, h = jnp.split(x, 2, axis=-1)
    return c, h


def build_model(decoder: fd.TreeDecoder, args: argparse.Namespace) -> fd.Block:
    """``(sentiment, tree) -> void``: a ``loss`` entry per decision (its negative log-probability)."""
    start = (fd.Scalar("int32") >> fd.Embedding(SENTIMENTS, 2 * args.hidden, name="start")
             >> fd.Function(split_state, name="split_state"))
    scores = fd.Record((start, fd.Identity())) >> decoder
    return scores >> fd.Map(fd.Function(jnp.negative, name="nll") >> fd.Metric("loss")) >> fd.Void()


def start_states(params: Any, sentiments: np.ndarray) -> tuple[jax.Array, jax.Array]:
    """The start states the model embeds for ``sentiments``."""
    return split_state(params["start"]["table"][jnp.asarray(sentiments)])


def train_and_generate(name: str, decoder: fd.TreeDecoder | fd.SequenceDecoder, model: fd.Block, train: list,
                       dev: list, args: argparse.Namespace) -> tuple[fd.Trainer, fd.FitResult, np.ndarray, Any]:
    """Trains ``model`` (teacher forcing through ``decoder``), keeping the parameters of the best
    dev loss, then samples ``args.samples`` structures per sentiment with them, all at once on the
    device: the trainer, the fit, each structure's sentiment and what ``fd.Generator`` returned."""
    trainer = common.trainer(fd.Compiler.create(model), optax.adam(args.learning_rate), args)
    fitted = common.fit(trainer, train, args, name, monitor="dev_loss", mode="min",
                        scores=lambda p: {"dev_loss": float(trainer.evaluate(p, dev)["loss"])})
    params = fitted.best_params
    sentiments = np.repeat(np.arange(SENTIMENTS), args.samples)
    out = fd.Generator(decoder).generate(params, start_states(params, sentiments), key=jax.random.key(args.seed))
    return trainer, fitted, sentiments, out


def sentence(tree: Any, words: list[str]) -> str:
    """A generated tree as text: its words, each pair in brackets."""
    if isinstance(tree, tuple):
        return "(" + " ".join(sentence(t, words) for t in tree) + ")"
    return words[tree]


def tree_layout(tree: Any) -> tuple[list[tuple[float, float, int | None]], list[tuple[int, int]]]:
    """Where to draw a tree's nodes: ``(x, y, word id or None)`` per node (leaves at ``x`` = 0, 1,
    ... left to right on ``y`` = -depth, a pair centred over its children) and the edges as
    ``(parent, child)`` node indices. Iterative, so a deep generated tree draws too."""
    nodes: list[tuple[float, float, int | None]] = []
    edges: list[tuple[int, int]] = []
    leaves = 0
    # (subtree or, once its children are placed, a pair's index; depth; parent index; placed?)
    stack: list[tuple[Any, int, int | None, bool]] = [(tree, 0, None, False)]
    pending: dict[int, list[int]] = {}
    while stack:
        t, depth, parent, done = stack.pop()
        if done:  # ``t`` is a pair's index: its children are placed
            kids = pending.pop(t)
            nodes[t] = (sum(nodes[k][0] for k in kids) / len(kids), nodes[t][1], None)
        elif not isinstance(t, tuple):
            nodes.append((float(leaves), -float(depth), int(t)))
            leaves += 1
            if parent is not None:
                edges.append((parent, len(nodes) - 1))
                pending[parent].append(len(nodes) - 1)
        else:
            me = len(nodes)
            nodes.append((0.0, -float(depth), None))
            pending[me] = []
            if parent is not None:
                edges.append((parent, me))
                pending[parent].append(me)
            stack.append((me, depth, parent, True))  # placed once its children are
            stack.extend((child, depth + 1, me, False) for child in reversed(t))
    return nodes, edges


def draw_tree(ax: Any, tree: Any, words: list[str], title: str = "") -> None:
    """Draws a generated tree on matplotlib axes ``ax``: edges, a dot per pair, each leaf's word."""
    nodes, edges = tree_layout(tree)
    for a, b in edges:
        ax.plot([nodes[a][0], nodes[b][0]], [nodes[a][1], nodes[b][1]], color="0.6", linewidth=0.8, zorder=1)
    pairs = [(x, y) for x, y, w in nodes if w is None]
    if pairs:
        ax.scatter(*zip(*pairs), s=8, color="0.3", zorder=2)
    for x, y, w in nodes:
        if w is not None:
            ax.text(x, y - 0.15, words[w], rotation=90, ha="center", va="top", fontsize=7)
    ax.set_title(title, fontsize=9)
    ax.set_axis_off()
    ax.margins(0.05, 0.25)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = sst.argument_parser(__doc__.splitlines()[0])
    p.add_argument("--hidden", type=COUNT, default=128, help="LSTM units")
    p.add_argument("--min-count", type=COUNT, default=3, help="rarer training words are <unk>")
    p.add_argument("--max-levels", type=COUNT, default=12, help="levels a generated tree may have below its root")
    p.add_argument("--max-nodes", type=COUNT, default=79, help="nodes a generated tree may have")
    p.add_argument("--samples", type=NATURAL, default=64, help="trees generated per sentiment")
    add_training_flags(p, "tree_decoder", epochs=4, batch_size=32, learning_rate=2e-3)
    args = p.parse_args(argv)
    if args.quick:
        args.epochs, args.hidden, args.samples = 2, 16, 8
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    folder = sst.data_dir(args.data_dir, args.quick)
    train_trees = sst.load("train", folder, 320 if args.quick else None)
    dev_trees = sst.load("dev", folder, 100 if args.quick else None)
    word_idx = {UNK: 0, **{w: i + 1 for w, i in sst.vocabulary(train_trees, args.min_count).items()}}
    words = sorted(word_idx, key=word_idx.__getitem__)
    train, dev = examples_of(train_trees, word_idx), examples_of(dev_trees, word_idx)

    decoder = build_decoder(len(word_idx), args)
    trainer, fitted, sentiments, out = train_and_generate("tree_decoder", decoder, build_model(decoder, args),
                                                          train, dev, args)
    params = fitted.best_params
    trees = out.trees()
    generated = [(int(s), t) for s, t in zip(sentiments, trees)]
    nodes = np.asarray(out.num_nodes)
    per_decision = float(trainer.evaluate(params, generated)["loss"]) if generated else float("nan")
    dev_loss = float(trainer.evaluate(params, dev)["loss"])
    rows = [[s, float(nodes[sentiments == s].mean()), float(np.asarray(out.truncated)[sentiments == s].mean())]
            for s in range(SENTIMENTS)]
    print_table("Generated trees per root sentiment", ["sentiment", "mean nodes", "truncated"], rows)
    print(f"\nloss per decision: dev trees {dev_loss:.3f}, generated trees {per_decision:.3f}; "
          f"dev trees have {np.mean([sst.nodes(t) for t in dev_trees]):.1f} nodes on average")
    shown = [sentence(t, words) for t in trees[:: max(1, len(trees) // 5)][:5]]
    print("\nsome generated trees:")
    for s, text in zip(sentiments[:: max(1, len(trees) // 5)], shown):
        print(f"  [{s}] {text[:200]}")
    report = {"args": {k: v for k, v in vars(args).items() if k != "json"}, "history": fitted.history,
              "dev_loss": dev_loss, "generated_loss": per_decision, "generated_mean_nodes": float(nodes.mean()),
              "generated_truncated": float(np.mean(out.truncated)), "vocabulary": len(word_idx),
              "dev_mean_nodes": float(np.mean([sst.nodes(t) for t in dev_trees])), "examples": shown}
    write_report("tree_decoder_quick" if args.quick else "tree_decoder", report, args.json)
    return report


if __name__ == "__main__":
    main()
