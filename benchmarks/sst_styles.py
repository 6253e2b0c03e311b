"""One SST Tree-LSTM written three ways, each timed in three training loops, against PyTorch levels.

A regression that hits one way of writing a model, or one way of training it, shows here. The
styles compute the same loss from the same parameters (``tests/benchmarks/test_sst_styles.py``):

- ``blocks``: the examples' model (``benchmarks.models.sst_model``): built-in
  ``BinaryTreeLSTMCell``, ``Embedding`` and ``FC``, the per-node loss an ``fd.Function``;
- ``layers``: custom ``fd.Layer``s as a user writes them: a word lookup with its own table, the
  cell (one layer for leaves and pairs), and the per-node loss as a layer with the readout inside;
- ``function loss``: the custom lookup and cell, the readout a built-in ``FC`` and the loss a
  plain ``fd.Function`` of the logits and the label.

Loops, both one SGD step per batch (``--batch-size``, default 64):

- ``blocking``: ``build_batch`` then the step, reading the loss back every step (a loop that
  logs its loss): host building and device work do not overlap;
- ``prefetched``: iterating ``compiler.batches``, reading the loss back every step: its
  background thread builds batch i + 1 while step i runs;
- ``stream``: iterating ``compiler.batches`` and blocking once at the end: JAX's asynchronous
  dispatch lets the host build batch i + 1 while the device runs step i, on the thread or not.

PyTorch level batching (``benchmarks.sst_peers.TorchLevels``) and DyNet's automatic batching
(``DynetAutobatch``) read their loss every step too, and are measured in the same run (optional:
``pip install torch dynet38``).

Run: ``python -m benchmarks.sst_styles --data-dir DIR`` (``--quick``: the committed sample).
"""

from __future__ import annotations

import argparse
import importlib.util
import random
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

import fold as fd
from benchmarks import models, sst_peers
from benchmarks.common import add_run_flags, figure, interleaved_medians, make_train_step, save_results
from examples import sst
from examples.common import COUNT, print_table

LEARNING_RATE = 0.05
STYLES = ("blocks", "layers", "function loss")


class Lookup(fd.Layer):
    """A word index -> its row of the layer's own table (-1, an unknown word: zeros)."""

    def __init__(self, words: int, embed: int):
        super().__init__("lookup")
        self.words, self.embed = words, embed

    def init(self, key: jax.Array, input_type: fd.Type) -> dict:
        return {"table": jax.random.normal(key, (self.words, self.embed)) * 0.1}

    def apply(self, params: dict, word: jax.Array) -> jax.Array:
        return jnp.where((word >= 0)[..., None], params["table"][jnp.maximum(word, 0)], 0.0)


class Cell(fd.Layer):
    """``(x, c_l, h_l, c_r, h_r) -> (c, h)``: the binary Tree-LSTM cell, for leaves (zero
    children) and pairs (zero ``x``) alike."""

    def __init__(self, embed: int, hidden: int):
        super().__init__("cell")
        self.embed, self.hidden = embed, hidden

    def init(self, key: jax.Array, input_type: fd.Type) -> dict:
        return {"w": jax.nn.initializers.glorot_uniform()(key, (self.embed + 2 * self.hidden, 5 * self.hidden)),
                "b": jnp.zeros(5 * self.hidden)}

    def apply(self, params: dict, x: jax.Array, cl: jax.Array, hl: jax.Array, cr: jax.Array,
              hr: jax.Array) -> tuple:
        return sst_peers.jax_cell(params["w"], params["b"], x, cl, hl, cr, hr)


class NodeLoss(fd.Layer):
    """``(h, label) -> cross-entropy`` of the readout ``h @ w + b``."""

    def __init__(self, hidden: int):
        super().__init__("readout")
        self.hidden = hidden

    def init(self, key: jax.Array, input_type: fd.Type) -> dict:
        return {"w": jax.nn.initializers.glorot_uniform()(key, (self.hidden, sst_peers.CLASSES)),
                "b": jnp.zeros(sst_peers.CLASSES)}

    def apply(self, params: dict, h: jax.Array, label: jax.Array) -> jax.Array:
        return optax.softmax_cross_entropy_with_integer_labels(h @ params["w"] + params["b"], label)


def _cross_entropy(logits: jax.Array, label: jax.Array) -> jax.Array:
    return optax.softmax_cross_entropy_with_integer_labels(logits, label)


def custom_model(word_idx: dict[str, int], hidden: int, embed: int, loss_as_layer: bool) -> fd.Block:
    """The SST Tree-LSTM with custom layers, its per-node loss as the ``loss`` metric: a layer, or
    a built-in ``FC`` readout and a plain ``fd.Function``."""
    h = fd.TensorType((hidden,))
    cell = Cell(embed, hidden)
    loss_layer = NodeLoss(hidden)
    readout = fd.FC(sst_peers.CLASSES, activation=None, name="readout")

    def node_loss() -> fd.Block:  # one block per place it is used; the layers are shared
        if loss_as_layer:
            return fd.Function(loss_layer)
        return fd.Record((fd.Function(readout), fd.Identity())) >> fd.Function(_cross_entropy)

    def with_loss(state: fd.Block) -> fd.Composition:
        c = fd.Composition()
        with c.scope():
            s = state.reads(c.input)
            label = (fd.GetItem(0) >> fd.Scalar("int32")).reads(c.input)
            fd.Metric("loss").reads(node_loss().reads(fd.GetItem(1).reads(s), label))
            c.output.reads(s)
        return c

    tree = fd.ForwardDeclaration(fd.PyObjectType(), fd.TupleType(h, h))
    word = fd.GetItem(1) >> fd.InputTransform(lambda w: word_idx.get(w, -1)) >> fd.Scalar("int32")
    leaf = fd.AllOf(word >> fd.Function(Lookup(len(word_idx), embed)), *(fd.Zeros(h) for _ in range(4))) \
        >> fd.Function(cell)
    pair = (fd.AllOf(fd.Zeros(fd.TensorType((embed,))), fd.Record([(1, tree()), (2, tree())]))
            >> fd.Function(lambda x, lr: (x, *lr[0], *lr[1])) >> fd.Function(cell))
    tree.resolve_to(fd.OneOf(len, {2: with_loss(leaf), 3: with_loss(pair)}))
    return tree() >> fd.GetItem(1)


def style_model(style: str, word_idx: dict[str, int], hidden: int, embed: int) -> fd.Block:
    if style == "blocks":
        return models.sst_model(word_idx, state_size=hidden, embed_size=embed)
    return custom_model(word_idx, hidden, embed, loss_as_layer=style == "layers")


def style_params(style: str, plain: dict[str, np.ndarray]) -> dict:
    """``sst_peers.plain_params``'s arrays in ``style``'s parameter layout."""
    if style == "blocks":
        return {"embedding": {"table": plain["embedding"]}, "fc": {"w": plain["out_w"], "b": plain["out_b"]},
                "binary_tree_lstm_cell": {"w": plain["cell_w"], "b": plain["cell_b"]}}
    return {"lookup": {"table": plain["embedding"]}, "cell": {"w": plain["cell_w"], "b": plain["cell_b"]},
            "readout": {"w": plain["out_w"], "b": plain["out_b"]}}


def fold_loops(compiler: fd.Compiler, params: dict, chunks: list[list]) -> dict[str, Callable[[], Any]]:
    """The three training loops over ``chunks`` (batches of trees) as functions to time."""
    optimizer = optax.sgd(LEARNING_RATE)
    step = make_train_step(compiler, optimizer)
    opt_state = optimizer.init(params)
    flat = [t for c in chunks for t in c]

    def blocking() -> None:
        p, s = params, opt_state
        for c in chunks:
            p, s, loss = step(p, s, compiler.build_batch(c), None)
            float(loss)

    def prefetched() -> None:
        p, s = params, opt_state
        for b in compiler.batches(flat, len(chunks[0])):
            p, s, loss = step(p, s, b, None)
            float(loss)

    def stream() -> None:
        p, s, loss = params, opt_state, None
        for b in compiler.batches(flat, len(chunks[0])):
            p, s, loss = step(p, s, b, None)
        jax.block_until_ready(loss)

    return {"blocking": blocking, "prefetched": prefetched, "stream": stream}


def _peer_loop(model: Any, chunks: list[list]) -> Callable[[], None]:
    """A peer's training loop over ``chunks``, one step per batch (its loss read back every step),
    after a warm-up step."""
    model.train_step(chunks[0])

    def loop() -> None:
        for c in chunks:
            model.train_step(c)

    return loop


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-size", type=COUNT, default=64)
    p.add_argument("--hidden", type=COUNT, default=150)
    p.add_argument("--embed-size", type=COUNT, default=100)
    p.add_argument("--trees", type=COUNT, default=1024, help="training trees per timed loop")
    p.add_argument("--repeats", type=COUNT, default=5, help="rounds, each timing every loop in turn")
    add_run_flags(p, "sst_styles", "a few batches of sample trees")
    args = p.parse_args(argv)
    if args.quick:
        args.trees, args.repeats, args.batch_size = min(args.trees, 32), min(args.repeats, 2), min(args.batch_size, 8)
    trees = sst.load("train", sst.data_dir(args.data_dir, args.quick))
    random.Random(0).shuffle(trees)
    word_idx = sst.vocabulary(trees)
    trees = trees[:args.trees]
    chunks = [trees[i:i + args.batch_size] for i in range(0, len(trees) - args.batch_size + 1, args.batch_size)]
    if not chunks:
        raise SystemExit(f"--trees {args.trees} holds no batch of {args.batch_size}")
    n = len(chunks) * args.batch_size
    base = fd.Compiler.create(style_model("blocks", word_idx, args.hidden, args.embed_size))
    plain = sst_peers.plain_params(base.init(jax.random.key(0)))
    loops: dict[str, Callable[[], Any]] = {}
    for style in STYLES:
        compiler = fd.Compiler.create(style_model(style, word_idx, args.hidden, args.embed_size))
        params = jax.tree_util.tree_map(jnp.asarray, style_params(style, plain))
        for loop, fn in fold_loops(compiler, params, chunks).items():
            fn()  # compiles this style's layouts
            loops[f"{style}, {loop}"] = fn
    peers = {"PyTorch levels, blocking": ("torch", sst_peers.TorchLevels),
             "DyNet autobatch, blocking": ("dynet", sst_peers.DynetAutobatch)}
    for name, (module, peer) in peers.items():
        if importlib.util.find_spec(module) is None:
            print(f"{module} is not installed: {name.split(',')[0]} is skipped")
            continue
        loops[name] = _peer_loop(peer(plain, word_idx, lr=LEARNING_RATE), chunks)
    print(f"timing {len(loops)} loops over {n} trees in {len(chunks)} batches, {args.repeats} rounds ...")
    seconds = interleaved_medians(loops, args.repeats)
    rates = {k: n / s for k, s in seconds.items()}
    levels, dynet = rates.get("PyTorch levels, blocking"), rates.get("DyNet autobatch, blocking")
    rows = [[k, f"{r:.0f}", f"{r / levels:.2f}x" if levels else "-", f"{r / dynet:.2f}x" if dynet else "-"]
            for k, r in rates.items()]
    print_table(f"SST Tree-LSTM, batch {args.batch_size}, H {args.hidden}: trees/s",
                ["style, loop", "trees/s", "vs PyTorch levels", "vs DyNet"], rows)
    result = {"batch_size": args.batch_size, "hidden": args.hidden, "trees": n, "repeats": args.repeats,
              "trees_per_s": rates, "vs_torch_levels": {k: r / levels for k, r in rates.items()} if levels else None,
              "vs_dynet": {k: r / dynet for k, r in rates.items()} if dynet else None}

    def plot(path: Any) -> None:
        with figure(path, (7, 3)) as ax:
            ax.barh(list(rates), list(rates.values()))
            ax.set_xlabel("trees/s")

    save_results("sst_styles", result, args, plot)
    return result


if __name__ == "__main__":
    main()
