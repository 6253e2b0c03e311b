"""The Fold paper's sentiment pipeline (section 3.3) on SST sentences.

``InputTransform(str.split) >> Map(word2vec) >> Fold(rnn_cell, Zeros(d)) >> FC(5)``
where ``word2vec`` looks a word up in the training vocabulary and embeds
it, and a word never seen in training becomes the zero vector (an
``Optional`` whose none-case is zeros). Trained with softmax cross-entropy
on the sentence's root label; reports fine-grained (5-class) and binary
(roots that are not neutral; positive vs negative probability mass)
accuracy on dev and test, for the parameters of the epoch with the best
dev fine-grained accuracy.

Run: ``python -m examples.sentiment_pipeline`` (``--quick`` for a few-second run).
"""

from __future__ import annotations

import argparse
from typing import Any

import jax.numpy as jnp
import numpy as np
import optax

import fold as fd
from examples import common, sst
from examples.common import COUNT, add_training_flags, print_table, write_report

CLASSES = 5


def sentence_block(word_idx: dict[str, int], embed_size: int, state_size: int, cell: str) -> fd.Block:
    """A sentence string -> its final RNN state."""
    embedding = fd.Embedding(len(word_idx), embed_size)
    word2vec = fd.InputTransform(word_idx.get) >> fd.Optional(fd.Scalar("int32") >> fd.Function(embedding))
    if cell == "gru":
        # Fold gives (state, word); the GRU cell takes (word, state) and returns (h, h).
        step = fd.Record([(1, fd.Identity()), (0, fd.Identity())]) >> fd.GRUCell(state_size) >> fd.GetItem(1)
    else:
        step = fd.Concat() >> fd.FC(state_size, activation=jnp.tanh)
    return (fd.InputTransform(str.split) >> fd.Map(word2vec)
            >> fd.Fold(step, fd.Zeros(fd.TensorType((state_size,)))))


def build_model(word_idx: dict[str, int], args: argparse.Namespace) -> fd.Composition:
    """(sentence, label) -> logits; metrics 'loss' and 'correct'."""
    logits = sentence_block(word_idx, args.embed_size, args.state_size, args.cell) \
        >> fd.FC(CLASSES, activation=None)

    def cross_entropy(z, y):
        return optax.softmax_cross_entropy_with_integer_labels(z, y)

    c = fd.Composition()
    with c.scope():
        z = logits.reads(c.input[0])
        y = fd.Scalar("int32").reads(c.input[1])
        fd.Metric("loss").reads(fd.Function(cross_entropy).reads(z, y))
        fd.Metric("correct").reads(
            fd.Function(lambda z_, y_: (jnp.argmax(z_, -1) == y_).astype(jnp.float32)).reads(z, y))
        c.output.reads(z)
    return c


def examples_of(trees: list[Any]) -> list[tuple[str, int]]:
    return [(" ".join(sst.words(t)), t[0]) for t in trees]


def accuracies(trainer: fd.Trainer, params: Any, data: list[tuple[str, int]]) -> dict:
    """Fine-grained accuracy and binary accuracy over non-neutral sentences."""
    return sst.sentiment_accuracies(trainer.predict(params, data), np.array([y for _, y in data]))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = sst.argument_parser(__doc__.splitlines()[0])
    p.add_argument("--cell", choices=["rnn", "gru"], default="gru", help="recurrent cell")
    p.add_argument("--embed-size", type=COUNT, default=64, help="word embedding size")
    p.add_argument("--state-size", type=COUNT, default=64, help="recurrent state size")
    add_training_flags(p, "sentiment_pipeline", epochs=6, batch_size=64, learning_rate=2e-3)
    args = p.parse_args(argv)
    if args.quick:
        args.epochs, args.embed_size, args.state_size = 3, 16, 16
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    limit = 640 if args.quick else None
    train_trees = sst.load("train", sst.data_dir(args.data_dir, args.quick), limit)
    dev = examples_of(sst.load("dev", sst.data_dir(args.data_dir, args.quick), 200 if args.quick else None))
    test = examples_of(sst.load("test", sst.data_dir(args.data_dir, args.quick), 200 if args.quick else None))
    word_idx = sst.vocabulary(train_trees)
    train_data = examples_of(train_trees)

    compiler = fd.Compiler.create(build_model(word_idx, args))
    trainer = common.trainer(compiler, optax.adam(args.learning_rate), args)
    fitted = common.fit(trainer, train_data, args, "sentiment_pipeline", monitor="dev_fine",
                        scores=lambda p: {f"dev_{k}": v for k, v in accuracies(trainer, p, dev).items()})
    best, history = fitted.best, fitted.history
    results = {split: accuracies(trainer, fitted.best_params, data) for split, data in (("dev", dev), ("test", test))}
    print_table(f"SST sentence sentiment (root labels; best dev epoch {best['epoch']})",
                ["split", "fine-grained", "binary"],
                [[split, r["fine"], r["binary"]] for split, r in results.items()])
    report = {"example": "sentiment_pipeline", "args": vars(args), "vocabulary": len(word_idx),
              "best_epoch": best["epoch"], "history": history, "results": results}
    path = write_report("sentiment_pipeline_quick" if args.quick else "sentiment_pipeline", report, args.json)
    print(f"\nreport written to {path}")
    return report


if __name__ == "__main__":
    main()
