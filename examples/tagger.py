"""A BiLSTM tagger with character BiLSTMs for rare words (the DyNet benchmark suite's
``bilstm-tagger-withchar``), tagging each word of an SST sentence with its sentiment label.

A word seen at least ``--min-count`` times in training is embedded; a rarer one (or one never
seen) is read character by character by a forward and a backward LSTM whose final states,
concatenated, stand in for its embedding (``OneOf`` on the word). A forward and a backward LSTM
over the sentence's word vectors give each word ``[forward state; backward state]``
(``RNN`` over the words, and over the words reversed with ``Slice(step=-1)``, reversed back),
then a bias-free tanh MLP gives its tag logits. Every word records its cross-entropy
(``loss``) and whether its best tag is right (``correct``): the root is a sequence of metrics,
ended with ``>> fd.Void()``.

The tags are SST's per-word sentiment labels (each leaf's label, 0-4), so the task runs on data
every user of the examples has; most words are neutral, and the report gives the
always-neutral accuracy beside the model's.

Run: ``python -m examples.tagger`` (``--quick`` for a few-second run).
"""

from __future__ import annotations

import argparse
import collections
from typing import Any

import jax
import jax.numpy as jnp
import optax

import fold as fd
from examples import common, sst
from examples.common import COUNT, add_training_flags, print_table, write_report

TAGS = 5
NEUTRAL = 2


def tagged_words(tree: Any) -> list[tuple[str, int]]:
    """An SST tree's words, left to right, each with its leaf's sentiment label."""
    return [(word, label) for label, word in sst.leaves(tree)]


def examples_of(trees: list[Any]) -> list[dict[str, list]]:
    """The tagger's examples: per sentence, its words and their tags."""
    return [{"words": [w for w, _ in tagged], "tags": [t for _, t in tagged]} for tagged in map(tagged_words, trees)]


def vocabularies(train: list[dict[str, list]], min_count: int) -> tuple[dict[str, int], dict[str, int]]:
    """The embedded words (seen at least ``min_count`` times in ``train``) and the characters of
    every training word, numbered from 1 (0 stands for a character not seen in training)."""
    counts = collections.Counter(w for e in train for w in e["words"])
    word_idx = {w: i for i, w in enumerate(sorted(w for w, c in counts.items() if c >= min_count))}
    return word_idx, {ch: i + 1 for i, ch in enumerate(sorted({ch for w in counts for ch in w}))}


def bidirectional(forward_cell: fd.Block, backward_cell: fd.Block) -> fd.Block:
    """A sequence of vectors -> per element, ``[forward output; backward output]``."""
    forward = fd.RNN(forward_cell) >> fd.GetItem(0)
    backward = fd.Slice(step=-1) >> fd.RNN(backward_cell) >> fd.GetItem(0) >> fd.Slice(step=-1)
    return fd.AllOf(forward, backward) >> fd.ZipWith(fd.Concat())


def final_states(forward_cell: fd.Block, backward_cell: fd.Block) -> fd.Block:
    """A sequence of vectors -> ``[forward final h; backward final h]`` (an LSTM's state is ``(c, h)``)."""
    forward = fd.RNN(forward_cell) >> fd.GetItem(1) >> fd.GetItem(1)
    backward = fd.Slice(step=-1) >> fd.RNN(backward_cell) >> fd.GetItem(1) >> fd.GetItem(1)
    return fd.AllOf(forward, backward) >> fd.Concat()


def build_model(word_idx: dict[str, int], char_idx: dict[str, int], args: argparse.Namespace) -> fd.Block:
    """``{"words": [str], "tags": [int]}`` -> void; a ``loss`` and a ``correct`` entry per word.
    ``char_idx`` numbers the characters from 1: 0 is any character it lacks."""
    half = args.word_size // 2
    chars = (fd.InputTransform(lambda w: [char_idx.get(ch, 0) for ch in w])
             >> fd.Map(fd.Scalar("int32") >> fd.Embedding(len(char_idx) + 1, args.char_size, name="char_embedding"))
             >> final_states(fd.LSTMCell(half, name="char_forward"),
                             fd.LSTMCell(args.word_size - half, name="char_backward")))
    word = fd.OneOf(lambda w: w in word_idx, {
        True: (fd.InputTransform(word_idx.__getitem__) >> fd.Scalar("int32")
               >> fd.Embedding(len(word_idx), args.word_size, name="word_embedding")),
        False: chars})
    mlp = (fd.FC(args.mlp_size, activation=jnp.tanh, use_bias=False, name="mlp_hidden")
           >> fd.FC(TAGS, activation=None, use_bias=False, name="mlp_out"))
    words = bidirectional(fd.LSTMCell(args.hidden, name="forward"), fd.LSTMCell(args.hidden, name="backward"))
    logits = fd.Map(word) >> words >> fd.Map(mlp)

    def score(tag: jax.Array, z: jax.Array) -> tuple[jax.Array, jax.Array]:
        return (optax.softmax_cross_entropy_with_integer_labels(z, tag),
                (jnp.argmax(z, -1) == tag).astype(jnp.float32))

    per_word = fd.Function(score) >> fd.Record((fd.Metric("loss"), fd.Metric("correct")))
    # A dict Record sorts its keys: each zipped pair is (tag, logits).
    tagger = fd.Record({"words": logits, "tags": fd.Map(fd.Scalar("int32"))}) >> fd.ZipWith(per_word)
    return tagger >> fd.Void()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = sst.argument_parser(__doc__.splitlines()[0])
    p.add_argument("--min-count", type=COUNT, default=5,
                   help="words seen fewer times in training are read by their characters")
    p.add_argument("--char-size", type=COUNT, default=20, help="character embedding size")
    p.add_argument("--word-size", type=COUNT, default=128,
                   help="word embedding size (and of the character LSTMs' two final states together)")
    p.add_argument("--hidden", type=COUNT, default=50, help="state size of each word LSTM")
    p.add_argument("--mlp-size", type=COUNT, default=32, help="hidden units of the tag MLP")
    add_training_flags(p, "tagger", epochs=4, batch_size=16, learning_rate=2e-3)
    args = p.parse_args(argv)
    if args.quick:
        args.epochs, args.word_size, args.hidden, args.mlp_size, args.char_size = 2, 16, 16, 16, 8
    if args.word_size < 2:
        p.error(f"--word-size must be at least 2 (a forward and a backward character LSTM), got {args.word_size}")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    folder = sst.data_dir(args.data_dir, args.quick)
    limit = 320 if args.quick else None
    train_trees = sst.load("train", folder, limit)
    train = examples_of(train_trees)
    dev, test = (examples_of(sst.load(split, folder, 200 if args.quick else None)) for split in ("dev", "test"))
    word_idx, char_idx = vocabularies(train, args.min_count)

    compiler = fd.Compiler.create(build_model(word_idx, char_idx, args))
    trainer = common.trainer(compiler, optax.adam(args.learning_rate), args)
    fitted = common.fit(trainer, train, args, "tagger", monitor="dev_correct",
                        scores=lambda p: {"dev_correct": float(trainer.evaluate(p, dev)["correct"])})
    results = {split: float(trainer.evaluate(fitted.best_params, data)["correct"])
               for split, data in (("dev", dev), ("test", test))}
    neutral = {split: sum(t == NEUTRAL for e in data for t in e["tags"]) / sum(len(e["tags"]) for e in data)
               for split, data in (("dev", dev), ("test", test))}
    rare = sum(w not in word_idx for e in train for w in e["words"]) / sum(len(e["words"]) for e in train)
    print_table(f"per-word sentiment tags (best dev epoch {fitted.best['epoch']}; {rare:.1%} of training words "
                "read by their characters)", ["split", "accuracy", "always neutral"],
                [[split, results[split], neutral[split]] for split in results])
    stats = compiler.stats()
    report = {"example": "tagger", "args": vars(args), "vocabulary": len(word_idx), "characters": len(char_idx),
              "rare_word_share": rare, "best_epoch": fitted.best["epoch"], "history": fitted.history,
              "results": results, "always_neutral": neutral, "layouts": stats.layouts}
    if args.quick:
        print("(a quick run is too short to learn more than the majority tag: see docs/examples/tagger.md)")
    path = write_report("tagger_quick" if args.quick else "tagger", report, args.json)
    print(f"\nreport written to {path}")
    return report


if __name__ == "__main__":
    main()
