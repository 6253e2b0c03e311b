"""fold against DyNet's automatic batching on the DyNet benchmark suite's Tree-LSTM (``treenn``).

The suite's ``treenn`` (neulab/dynet-benchmark, sizes of its ``run-tests.sh``: words 128, hidden
128) on SST's binary trees, with a softmax loss over the 5 sentiment labels at every node:

- a leaf embeds its word (the training vocabulary, index 0 for the rest) and computes
  ``i, o, u`` from it: ``c = σ(i) ⊙ tanh(u)``, ``h = σ(o) ⊙ tanh(c)``;
- a pair reads its children's ``(c, h)``: ``i, o, u`` from ``[h_l; h_r]``, a forget gate per child
  from that child's ``h`` alone (one bias for both), ``c = σ(i) ⊙ tanh(u) + σ(f_l) ⊙ c_l +
  σ(f_r) ⊙ c_r``, ``h = σ(o) ⊙ tanh(c)``;
- every node's ``h`` goes through a bias-free readout to the 5 labels; the loss is the sum of
  the nodes' cross-entropies over the batch, trained with Adam (DyNet's ``AdamTrainer``
  defaults: learning rate 0.001; no gradient clipping and dense updates, the suite's
  ``SPARSE=0``).

The suite updates after every tree (its ``treenn-bulk`` after 50); here both update after each
batch of ``--batch-sizes`` trees, as the issue asks. One departure, in both peers alike: the
suite's leaves reuse the pairs' ``i, o, u`` biases, fold's layers keep their own parameters, so
the leaf cell has biases of its own. Both start from the same parameters (fold's ``init``, copied
into DyNet), so their losses can be compared batch for batch (``--sparse-updates``: DyNet's
Adam moves only the embedding rows a batch uses, as DyNet does by default, and the losses part).

- fold: ``build_model``, batches from ``compiler.batches`` (built ahead on a thread), one jitted
  step per batch, ``float(loss)`` after each.
- DyNet (``pip install dynet38``): the suite's graph, written tree by tree with one expression
  per gate, ``autobatch=1`` batching the batch's operations, ``loss.value()``, ``backward`` and
  ``AdamTrainer.update``.

Run: ``python -m benchmarks.dynet_treenn --data-dir DIR`` (``--quick``: seconds, on the sample).
Writes ``benchmarks/results/dynet_treenn.json``.
"""

from __future__ import annotations

import argparse
import collections
import random
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

import fold as fd
from benchmarks.against_dynet import (
    DYNET,
    FOLD,
    Steps,
    add_race_flags,
    batches_of,
    fold_steps,
    race,
    report,
    start_dynet,
)
from benchmarks.common import add_run_flags, save_results
from examples import sst

CLASSES = 5
WORD_SIZE = 128
HIDDEN = 128
LEARNING_RATE = 0.001  # DyNet's AdamTrainer default
UNKNOWN = "_UNK_"  # the suite's vocabulary entry 0, for words not seen in training


class LeafCell(fd.Layer):
    """word vector -> ``(c, h)``: the suite's leaf LSTM, gates ``i, o, u`` from the word alone."""

    def __init__(self, hidden: int, name: str | None = None):
        super().__init__(name=name)
        self.hidden = hidden

    def init(self, key: jax.Array, input_type: fd.Type) -> dict:
        return {"w": jax.nn.initializers.glorot_uniform()(key, (input_type.shape[0], 3 * self.hidden)),
                "b": jnp.zeros(3 * self.hidden)}

    def apply(self, params: dict, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        i, o, u = jnp.split(x @ params["w"] + params["b"], 3, axis=-1)
        c = jax.nn.sigmoid(i) * jnp.tanh(u)
        return c, jax.nn.sigmoid(o) * jnp.tanh(c)


class PairCell(fd.Layer):
    """``((c_l, h_l), (c_r, h_r))`` -> ``(c, h)``: the suite's binary Tree-LSTM, a forget gate per
    child reading that child's ``h`` only."""

    def __init__(self, hidden: int, name: str | None = None):
        super().__init__(name=name)
        self.hidden = hidden

    def init(self, key: jax.Array, input_type: fd.Type) -> dict:
        h = self.hidden
        k, kl, kr = jax.random.split(key, 3)
        glorot = jax.nn.initializers.glorot_uniform()
        return {"u": glorot(k, (2 * h, 3 * h)), "b": jnp.zeros(3 * h),
                "f_left": glorot(kl, (h, h)), "f_right": glorot(kr, (h, h)), "b_f": jnp.zeros(h)}

    def apply(self, params: dict, left: tuple[jax.Array, jax.Array],
              right: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        (c_l, h_l), (c_r, h_r) = left, right
        i, o, u = jnp.split(jnp.concatenate([h_l, h_r], -1) @ params["u"] + params["b"], 3, axis=-1)
        f_l = jax.nn.sigmoid(h_l @ params["f_left"] + params["b_f"])
        f_r = jax.nn.sigmoid(h_r @ params["f_right"] + params["b_f"])
        c = jax.nn.sigmoid(i) * jnp.tanh(u) + f_l * c_l + f_r * c_r
        return c, jax.nn.sigmoid(o) * jnp.tanh(c)


def vocabulary(trees: list[Any]) -> dict[str, int]:
    """The suite's vocabulary: ``UNKNOWN`` at 0, then every word of ``trees`` in order of appearance."""
    words = collections.Counter(w for t in trees for w in sst.words(t))
    return {w: i for i, w in enumerate([UNKNOWN, *words])}


def build_model(word_idx: dict[str, int], word_size: int = WORD_SIZE, hidden: int = HIDDEN) -> fd.Block:
    """SST tree -> nothing, with the ``loss`` metric (a cross-entropy) at every node."""
    h = fd.TensorType((hidden,))
    readout = fd.FC(CLASSES, activation=None, use_bias=False, name="treenn_readout")

    def with_loss(state: fd.Block) -> fd.Composition:
        """node -> its state ``(c, h)``, emitting the node's loss."""
        c = fd.Composition()
        with c.scope():
            s = state.reads(c.input)
            logits = (fd.GetItem(1) >> readout).reads(s)
            label = (fd.GetItem(0) >> fd.Scalar("int32")).reads(c.input)
            fd.Metric("loss").reads(fd.Function(optax.softmax_cross_entropy_with_integer_labels).reads(logits, label))
            c.output.reads(s)
        return c

    leaf = (fd.GetItem(1) >> fd.InputTransform(lambda w: word_idx.get(w, 0)) >> fd.Scalar("int32")
            >> fd.Embedding(len(word_idx), word_size, name="treenn_embedding") >> LeafCell(hidden, name="treenn_leaf"))
    tree = fd.ForwardDeclaration(fd.PyObjectType(), fd.TupleType(h, h))
    pair = fd.Record([(1, tree()), (2, tree())]) >> PairCell(hidden, name="treenn_pair")
    tree.resolve_to(fd.OneOf(len, {2: with_loss(leaf), 3: with_loss(pair)}))
    return tree() >> fd.Void()


class DynetTreeNN:
    """The suite's ``treenn`` in DyNet, its parameters copied from fold's (``build_model``'s)."""

    def __init__(self, params: Any, word_idx: dict[str, int], lr: float = LEARNING_RATE, sparse: bool = False):
        self.dy = dy = start_dynet()
        self.word_idx = word_idx
        m = self.model = dy.ParameterCollection()
        p = jax.tree_util.tree_map(np.asarray, params)

        def gates(w: np.ndarray, b: np.ndarray, n: int) -> list[tuple[Any, Any]]:
            """``n`` gates' ``(W, b)`` from fold's ``x @ w + b`` (DyNet multiplies ``W x``)."""
            return [(m.parameters_from_numpy(wk.T.copy()), m.parameters_from_numpy(bk.copy()))
                    for wk, bk in zip(np.split(w, n, axis=1), np.split(b, n))]

        self.embedding = m.lookup_parameters_from_numpy(p["treenn_embedding"]["table"])
        self.leaf = gates(p["treenn_leaf"]["w"], p["treenn_leaf"]["b"], 3)
        self.pair = gates(p["treenn_pair"]["u"], p["treenn_pair"]["b"], 3)
        self.f_left = m.parameters_from_numpy(p["treenn_pair"]["f_left"].T.copy())
        self.f_right = m.parameters_from_numpy(p["treenn_pair"]["f_right"].T.copy())
        self.b_f = m.parameters_from_numpy(p["treenn_pair"]["b_f"].copy())
        self.readout = m.parameters_from_numpy(p["treenn_readout"]["w"].T.copy())
        self.trainer = dy.AdamTrainer(m, alpha=lr)
        self.trainer.set_clip_threshold(-1.0)  # as the suite: no clipping
        # The suite's SPARSE=0 by default: every row of the embedding moves each step, as in optax's
        # Adam; sparse updates (DyNet's own default) leave the rows a batch does not use, moments and
        # all, untouched, so the two peers' losses part.
        self.trainer.set_sparse_updates(sparse)

    def node(self, tree: Any, losses: list[Any]) -> tuple[Any, Any]:
        """``tree``'s ``(c, h)``, appending each of its nodes' losses to ``losses``."""
        dy = self.dy
        if len(tree) == 2:
            x = self.embedding[self.word_idx.get(tree[1], 0)]
            i, o, u = [W * x + b for W, b in self.leaf]
            c = dy.cmult(dy.logistic(i), dy.tanh(u))
        else:
            c_l, h_l = self.node(tree[1], losses)
            c_r, h_r = self.node(tree[2], losses)
            e = dy.concatenate([h_l, h_r])
            i, o, u = [W * e + b for W, b in self.pair]
            f_l = dy.logistic(self.f_left * h_l + self.b_f)
            f_r = dy.logistic(self.f_right * h_r + self.b_f)
            c = dy.cmult(dy.logistic(i), dy.tanh(u)) + dy.cmult(f_l, c_l) + dy.cmult(f_r, c_r)
        h = dy.cmult(dy.logistic(o), dy.tanh(c))
        losses.append(dy.pickneglogsoftmax(self.readout * h, tree[0]))
        return c, h

    def loss(self, batch: list[Any]) -> Any:
        """The summed loss of ``batch``'s nodes, in a fresh graph."""
        self.dy.renew_cg()
        losses: list[Any] = []
        for tree in batch:
            self.node(tree, losses)
        return self.dy.esum(losses)

    def step(self, batch: list[Any]) -> float:
        """One Adam step on the summed loss of ``batch``; returns the loss."""
        loss = self.loss(batch)
        value = loss.value()
        loss.backward()
        self.trainer.update()
        return float(value)


def dynet_steps(params: Any, word_idx: dict[str, int], trees: list[Any], batch_size: int, sparse: bool) -> Steps:
    """DyNet's steps on the same batches as fold's (``against_dynet.fold_steps``)."""
    model = DynetTreeNN(params, word_idx, sparse=sparse)
    for batch in batches_of(trees, batch_size):
        yield model.step(list(batch))


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_race_flags(p, [16, 64])
    p.add_argument("--sparse-updates", action="store_true",
                   help="DyNet updates only the embedding rows a batch uses (the suite's SPARSE=1, DyNet's default)")
    add_run_flags(p, "dynet_treenn", "batch size 8, few batches, small sizes, on the sample")
    args = p.parse_args(argv)
    word_size, hidden = (16, 16) if args.quick else (WORD_SIZE, HIDDEN)
    if args.quick:
        args.batch_sizes, args.warmup, args.batches, args.rounds = [8], 2, 3, 1
    trees = sst.load("train", sst.data_dir(args.data_dir, args.quick))
    random.Random(0).shuffle(trees)
    word_idx = vocabulary(trees)
    compiler = fd.Compiler.create(build_model(word_idx, word_size, hidden))
    params = compiler.init(jax.random.key(0))
    runs = [race({FOLD: fold_steps(compiler, params, optax.adam(LEARNING_RATE), trees, batch_size),
                  DYNET: dynet_steps(params, word_idx, trees, batch_size, args.sparse_updates)}, batch_size, args)
            for batch_size in args.batch_sizes]
    plot = report(f"treenn (Tree-LSTM, words {word_size}, hidden {hidden}), training (trees/s)", runs)
    result = {"runs": runs, "warmup": args.warmup, "batches": args.batches, "rounds": args.rounds,
              "dynet_sparse_updates": args.sparse_updates,
              "sizes": {"word_size": word_size, "hidden": hidden, "vocabulary": len(word_idx)}}
    save_results("dynet_treenn", result, args, plot)
    return result


if __name__ == "__main__":
    main()
