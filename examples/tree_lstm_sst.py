"""Binary Tree-LSTM sentiment on SST with a loss on every node (Fold paper, section 3.5).

``ForwardDeclaration`` makes the model recursive, ``OneOf(key_fn=len, ...)``
dispatches leaves ``(label, word)`` and pairs ``(label, left, right)``, and a
``BinaryTreeLSTMCell`` (Tai et al. 2015) combines children. Every node's
state goes through a shared softmax layer; its cross-entropy against the
node's label is the ``loss`` metric, averaged over all nodes of a batch.
Reports fine-grained accuracy (5 classes) at the root and over all nodes,
and binary accuracy over non-neutral roots, on dev and test, for the
parameters of the epoch with the best dev root accuracy.

``--paper`` selects the Fold paper's variant: state 300 and dropout after
Semeniuta et al. (2016), i.e. recurrent dropout on the cell's candidate
update plus dropout on the word vectors, both at rate 0.25 (keep 0.75), no
L2. Dropout runs during training steps only (``compiler.apply`` gets a key).

Words are embedded from scratch, or from a GloVe-format text file
(``--glove PATH``: ``word v1 v2 ...`` per line). Words not seen in training
embed to zeros; with ``--word-dropout P`` they share a learned vector instead,
which training learns by replacing each word with it with probability P.

Run: ``python -m examples.tree_lstm_sst`` (``--quick`` for a few-second run).
"""

from __future__ import annotations

import argparse
import pathlib
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

import fold as fd
from examples import common, sst
from examples.common import COUNT, FRACTION, RATE, add_training_flags, number, print_table, write_report

CLASSES = 5
NEUTRAL = 2
# The vocabulary's entry for words not seen in training, with --word-dropout.
UNKNOWN = "<unknown>"


def load_glove(path: str | pathlib.Path, word_idx: dict[str, int], size: int, seed: int) -> np.ndarray:
    """An embedding table for ``word_idx``: GloVe vectors where known, small random values elsewhere."""
    table = np.random.default_rng(seed).normal(0, 0.05, (len(word_idx), size)).astype(np.float32)
    found = 0
    with open(path, encoding="utf-8") as f:
        for line in f:
            parts = line.rstrip().split(" ")
            i = word_idx.get(parts[0])
            if i is None:
                continue
            if len(parts) - 1 != size:
                raise ValueError(f"{path}: vectors have {len(parts) - 1} values, --embed-size is {size}")
            table[i] = np.asarray(parts[1:], np.float32)
            found += 1
    print(f"GloVe: {found} of {len(word_idx)} words found in {path}")
    return table


class WordDropout(fd.Layer):
    """Word ids -> the same ids, each replaced by ``unknown`` with probability ``rate`` when
    ``compiler.apply`` gets a key (Iyyer et al. 2015): training then learns the vector that words
    not seen in training get at evaluation."""

    stochastic = True

    def __init__(self, rate: float, unknown: int):
        super().__init__()
        if not 0.0 <= rate < 1.0:
            raise ValueError(f"WordDropout needs a rate in [0, 1), got {rate}")
        self.rate, self.unknown = rate, unknown

    def init(self, key: jax.Array, input_type: fd.Type) -> dict:
        return {}

    def apply(self, params: dict, ids: jax.Array, key: jax.Array | None = None) -> jax.Array:
        if key is None or not self.rate:
            return ids
        return jnp.where(jax.random.bernoulli(key, self.rate, ids.shape), self.unknown, ids)


def build_model(word_idx: dict[str, int], args: argparse.Namespace, table: np.ndarray | None = None) -> fd.Block:
    """SST tree -> root logits; metrics over every node and at the root. With ``args.binary``,
    two classes (negative: labels 0-1, positive: 3-4) and no metrics on neutral nodes."""
    h = fd.TensorType((args.state_size,))
    state = fd.TupleType(h, h)
    # Named: the optimizer finds the embedding by its name (make_optimizer), benchmarks and tools
    # the cell and the readout by theirs, whatever models the process built before.
    cell = fd.BinaryTreeLSTMCell(args.state_size, recurrent_dropout=args.recurrent_dropout,
                                 name="binary_tree_lstm_cell")
    embedding = fd.Embedding(len(word_idx), args.embed_size, initializer=table, name="embedding")
    embed_dropout = fd.Dropout(args.embed_dropout) if args.embed_dropout else None
    word_dropout = WordDropout(args.word_dropout, word_idx[UNKNOWN]) if args.word_dropout else None
    readout = fd.FC(2 if args.binary else CLASSES, activation=None, name="fc")
    output_dropout = fd.Dropout(args.output_dropout) if args.output_dropout else None

    def to_logits() -> fd.Block:
        """state -> logits. The logits read h through ``output_dropout``, the parent reads h
        without it (Fold's ``DropoutWrapper`` with ``output_keep_prob``)."""
        h = fd.GetItem(1) >> fd.Function(output_dropout) if output_dropout else fd.GetItem(1)
        return h >> fd.Function(readout)

    def label() -> fd.Block:
        """node -> its class: the label, or with ``args.binary`` 1 for positive labels."""
        y = fd.GetItem(0) >> fd.InputTransform(lambda y: int(y > NEUTRAL)) if args.binary else fd.GetItem(0)
        return y >> fd.Scalar("int32")

    def cross_entropy(z, y):
        return optax.softmax_cross_entropy_with_integer_labels(z, y)

    def accuracy(z, y):
        return (jnp.argmax(z, -1) == y).astype(jnp.float32)

    def with_node_metrics(compute_state: fd.Block) -> fd.Composition:
        """node -> state, emitting the node's loss and correctness."""
        c = fd.Composition()
        with c.scope():
            s = compute_state.reads(c.input)
            logits = to_logits().reads(s)
            y = label().reads(c.input)
            fd.Metric("loss").reads(fd.Function(cross_entropy).reads(logits, y))
            fd.Metric("node_correct").reads(fd.Function(accuracy).reads(logits, y))
            c.output.reads(s)
        return c

    def node(compute_state: Callable[[], fd.Block]) -> fd.Block:
        """node -> state with its metrics; with ``args.binary``, a neutral node has none."""
        if not args.binary:
            return with_node_metrics(compute_state())
        return fd.OneOf(lambda n: n[0] == NEUTRAL, {True: compute_state(), False: with_node_metrics(compute_state())})

    def word() -> fd.Block:
        """leaf -> its word's vector (zeros for words not seen in training, unless ``word_dropout``)."""
        vector = fd.Function(embedding) >> fd.Function(embed_dropout) if embed_dropout else fd.Function(embedding)
        if word_dropout:
            return (fd.GetItem(1) >> fd.InputTransform(lambda w: word_idx.get(w, word_dropout.unknown))
                    >> fd.Scalar("int32") >> fd.Function(word_dropout) >> vector)
        return fd.GetItem(1) >> fd.InputTransform(word_idx.get) >> fd.Optional(fd.Scalar("int32") >> vector)

    def leaf() -> fd.Block:
        return fd.AllOf(word(), fd.Zeros(fd.TupleType(state, state))) >> fd.Function(cell) >> fd.GetItem(1)

    def pair() -> fd.Block:
        return (fd.AllOf(fd.Zeros(fd.TensorType((args.embed_size,))), fd.Record([(1, tree()), (2, tree())]))
                >> fd.Function(cell) >> fd.GetItem(1))

    tree = fd.ForwardDeclaration(fd.PyObjectType(), state)
    tree.resolve_to(fd.OneOf(len, {2: node(leaf), 3: node(pair)}))
    if args.binary:
        return tree() >> to_logits()
    root = fd.Composition()
    with root.scope():
        logits = (tree() >> to_logits()).reads(root.input)
        fd.Metric("root_correct").reads(fd.Function(accuracy).reads(logits, label().reads(root.input)))
        root.output.reads(logits)
    return root


def evaluate(trainer: fd.Trainer, params: Any, trees: list[Any], recorded: fd.RecordedExamples | None = None,
             binary: bool = False) -> dict[str, float]:
    """Root and all-node fine-grained accuracy; binary accuracy over non-neutral roots. With
    ``binary`` (a model of ``--binary``), binary accuracy at the root and over non-neutral nodes.
    ``recorded``: ``trees`` recorded by the trainer's compiler (faster than walking them again)."""
    data = trees if recorded is None else recorded
    logits, labels = trainer.predict(params, data), np.array([t[0] for t in trees])
    if binary:
        polar = labels != NEUTRAL
        return {"root_binary": float((logits[polar].argmax(1) == (labels[polar] > NEUTRAL)).mean()),
                "all_nodes_binary": float(trainer.evaluate(params, data)["node_correct"])}
    root = sst.sentiment_accuracies(logits, labels)
    node = trainer.evaluate(params, data, per_example=True)["node_correct"]
    sizes = np.array([sst.nodes(t) for t in trees])
    return {"root_fine": root["fine"], "all_nodes_fine": float((node * sizes).sum() / sizes.sum()),
            "root_binary": root["binary"]}


def _adagrad(learning_rate: float) -> optax.GradientTransformation:
    """Adagrad as Tai et al. ran it (torch7's ``optim.adagrad``): the accumulator starts at zero,
    so a first step moves each weight by about the learning rate. optax's default start of 0.1
    made steps of about 0.16 x the gradient, and a run from scratch stayed at chance for 5 epochs."""
    return optax.adagrad(learning_rate, initial_accumulator_value=0.0, eps=1e-10)


def make_optimizer(args: argparse.Namespace, steps_per_epoch: int = 1) -> optax.GradientTransformation:
    """``--optimizer`` at ``--learning-rate``, with L2 (``--l2``, as weight decay added to the
    gradient) on every weight but the word embeddings, which train at ``--embed-learning-rate``
    (default: ``--learning-rate``), as Tai et al. (2015) trained them with Adagrad. Both rates
    are multiplied by ``--lr-decay`` after every epoch of ``steps_per_epoch`` steps.

    >>> import jax.numpy as jnp
    >>> args = argparse.Namespace(optimizer="adagrad", learning_rate=0.05, embed_learning_rate=0.1, l2=1e-4,
    ...                           lr_decay=1.0)
    >>> params = {"embedding": {"table": jnp.ones(2)}, "fc": {"w": jnp.ones(2)}}
    >>> updates, _ = make_optimizer(args).update(jax.tree.map(jnp.zeros_like, params),
    ...                                          make_optimizer(args).init(params), params)
    >>> float(updates["embedding"]["table"][0]) == 0, float(updates["fc"]["w"][0]) < 0
    (True, True)
    """
    optimizer = {"adam": optax.adam, "adagrad": _adagrad, "sgd": optax.sgd}[args.optimizer]

    def base(rate: float) -> optax.GradientTransformation:
        if args.lr_decay == 1.0:
            return optimizer(rate)
        return optimizer(optax.exponential_decay(rate, steps_per_epoch, args.lr_decay, staircase=True))

    rest = base(args.learning_rate)
    if args.l2:
        rest = optax.chain(optax.add_decayed_weights(args.l2), rest)
    embedding = base(args.embed_learning_rate or args.learning_rate)

    def labels(params: dict) -> dict:
        return {k: jax.tree.map(lambda _, k=k: "embedding" if k == "embedding" else "rest", v)
                for k, v in params.items()}

    return optax.multi_transform({"embedding": embedding, "rest": rest}, labels)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = sst.argument_parser(__doc__.splitlines()[0])
    p.add_argument("--glove", default=None, help="GloVe-format text file for the initial embeddings")
    p.add_argument("--embed-size", type=COUNT, default=100, help="word embedding size")
    p.add_argument("--state-size", type=COUNT, default=150, help="Tree-LSTM state size")
    p.add_argument("--recurrent-dropout", type=FRACTION, default=0.0,
                   help="dropout rate on the cell's candidate update (Semeniuta et al. 2016)")
    p.add_argument("--embed-dropout", type=FRACTION, default=0.0, help="dropout rate on the word vectors")
    p.add_argument("--output-dropout", type=FRACTION, default=0.0,
                   help="dropout rate on each node's state where its logits read it (its parent reads it whole)")
    p.add_argument("--word-dropout", type=FRACTION, default=0.0,
                   help="replace each training word by a learned unknown-word vector with this probability; "
                        "words not seen in training get that vector (default 0: they embed to zeros)")
    p.add_argument("--binary", action="store_true",
                   help="Tai et al.'s binary model: classes negative (labels 0-1) and positive (3-4), neutral nodes "
                        "without loss; reports binary accuracy only and stops early on dev root binary accuracy")
    p.add_argument("--paper", action="store_true",
                   help="the Fold paper's variant: --state-size 300 --recurrent-dropout 0.25 --embed-dropout 0.25")
    p.add_argument("--optimizer", choices=("adam", "adagrad", "sgd"), default="adam",
                   help="Adam, or Adagrad as Tai et al. (2015): --optimizer adagrad --learning-rate 0.05 --l2 1e-4")
    p.add_argument("--l2", type=number(float, 0), default=0.0,
                   help="L2 weight decay on every weight but the embeddings")
    p.add_argument("--embed-learning-rate", type=RATE, default=None,
                   help="step size for the word embeddings (default: --learning-rate)")
    p.add_argument("--patience", type=COUNT, default=None,
                   help="stop after this many epochs without a better dev root accuracy (default: never)")
    p.add_argument("--lr-decay", type=RATE, default=1.0,
                   help="multiply the learning rates by this after every epoch (1: constant)")
    p.add_argument("--no-test", action="store_true",
                   help="evaluate on dev only, as a search should (the test set once, at the end)")
    add_training_flags(p, "tree_lstm_sst", epochs=10, batch_size=25, learning_rate=1e-3,
                       learning_rate_help="step size of --optimizer")
    args = p.parse_args(argv)
    for flag in ("recurrent_dropout", "embed_dropout", "output_dropout", "word_dropout"):
        if not 0.0 <= getattr(args, flag) < 1.0:
            p.error(f"--{flag.replace('_', '-')} must be in [0, 1), got {getattr(args, flag)}")
    if not 0.0 < args.lr_decay <= 1.0:
        p.error(f"--lr-decay must be in (0, 1], got {args.lr_decay}")
    if args.paper:
        args.state_size, args.recurrent_dropout, args.embed_dropout = 300, 0.25, 0.25
    if args.quick:
        args.epochs, args.embed_size, args.state_size, args.batch_size = 3, 16, 16, 64
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    small = 640 if args.quick else None
    train_trees = sst.load("train", sst.data_dir(args.data_dir, args.quick), small)
    dev = sst.load("dev", sst.data_dir(args.data_dir, args.quick), 200 if args.quick else None)
    word_idx = sst.vocabulary(train_trees)
    if args.word_dropout:
        word_idx[UNKNOWN] = len(word_idx)
    table = load_glove(args.glove, word_idx, args.embed_size, args.seed) if args.glove else None

    compiler = fd.Compiler.create(build_model(word_idx, args, table))
    trainer = common.trainer(compiler, make_optimizer(args, len(train_trees) // args.batch_size), args)
    dev_recorded = compiler.record(dev)
    monitor = "dev_root_binary" if args.binary else "dev_root_fine"
    fitted = common.fit(trainer, train_trees, args, "tree_lstm_sst", monitor=monitor, patience=args.patience,
                        scores=lambda p: {f"dev_{k}": v for k, v in
                                          evaluate(trainer, p, dev, dev_recorded, args.binary).items()})
    best, history = fitted.best, fitted.history
    results = {"dev": evaluate(trainer, fitted.best_params, dev, dev_recorded, args.binary)}
    if not args.no_test:
        test = sst.load("test", sst.data_dir(args.data_dir, args.quick), 200 if args.quick else None)
        results["test"] = evaluate(trainer, fitted.best_params, test, binary=args.binary)
    columns = {"root_fine": "root fine-grained", "all_nodes_fine": "all nodes fine-grained",
               "root_binary": "root binary", "all_nodes_binary": "non-neutral nodes binary"}
    shown = list(results["dev"])
    print_table(f"SST Tree-LSTM (best dev epoch {best['epoch']})", ["split", *(columns[k] for k in shown)],
                [[s, *(r[k] for k in shown)] for s, r in results.items()])
    report = {"example": "tree_lstm_sst", "args": vars(args), "vocabulary": len(word_idx),
              "best_epoch": best["epoch"], "history": history, "results": results}
    path = write_report("tree_lstm_sst_quick" if args.quick else "tree_lstm_sst", report, args.json)
    print(f"\nreport written to {path}")
    return report


if __name__ == "__main__":
    main()
