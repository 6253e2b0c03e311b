"""An LSTM decoder that writes SST sentences, word by word until it predicts the end, from the
sentence's sentiment: ``fd.SequenceDecoder``, the sequence counterpart of ``tree_decoder``.

The start state is embedded from the root's sentiment label (0-4), as in ``tree_decoder``; each
step embeds the word just emitted and runs an LSTM; a linear readout gives the next word's
logits (the end token among them). Training is teacher forcing on the treebank's sentences (the
loss: each word's and the end's negative log-probability, averaged); then ``fd.Generator``
writes sentences for every sentiment at once on the device, sampled, and the report prints some
with their lengths and what the model thinks of them against the dev sentences.

Run: ``python -m examples.sentence_decoder`` (``--quick`` for a few-second run).
"""

from __future__ import annotations

import argparse
from typing import Any

import jax.numpy as jnp
import numpy as np

import fold as fd
from examples import sst
from examples.common import COUNT, NATURAL, add_training_flags, print_table, write_report
from examples.tree_decoder import SENTIMENTS, UNK, split_state, train_and_generate

END = "<end>"


def examples_of(trees: list[Any], word_idx: dict[str, int]) -> list[tuple[int, list[int]]]:
    """Per tree: ``(root sentiment, word ids)``."""
    return [(tree[0], [word_idx.get(w, word_idx[UNK]) for w in sst.words(tree)]) for tree in trees]


def build_decoder(vocabulary: int, args: argparse.Namespace) -> fd.SequenceDecoder:
    """The LSTM decoder: a step embeds the emitted word and runs the LSTM; the readout is linear."""
    step = (fd.Record((fd.Identity(), fd.Embedding(vocabulary, args.embedding, name="embedding")))
            >> fd.Function(lambda state, word: (word, state), name="word_first")
            >> fd.LSTMCell(args.hidden, name="lstm") >> fd.GetItem(1))
    return fd.SequenceDecoder(step, fd.GetItem(1) >> fd.FC(vocabulary, activation=None, name="word"),
                              end_token=0, max_length=args.max_length)


def build_model(decoder: fd.SequenceDecoder, args: argparse.Namespace) -> fd.Block:
    """``(sentiment, word ids) -> void``: a ``loss`` entry per word and one for the end."""
    start = (fd.Scalar("int32") >> fd.Embedding(SENTIMENTS, 2 * args.hidden, name="start")
             >> fd.Function(split_state, name="split_state"))
    scores = fd.Record((start, fd.Map(fd.Scalar("int32")))) >> decoder
    return scores >> fd.Map(fd.Function(jnp.negative, name="nll") >> fd.Metric("loss")) >> fd.Void()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = sst.argument_parser(__doc__.splitlines()[0])
    p.add_argument("--hidden", type=COUNT, default=128, help="LSTM units")
    p.add_argument("--embedding", type=COUNT, default=64, help="word embedding size")
    p.add_argument("--min-count", type=COUNT, default=3, help="rarer training words are <unk>")
    p.add_argument("--max-length", type=COUNT, default=60, help="words a generated sentence may have")
    p.add_argument("--samples", type=NATURAL, default=64, help="sentences generated per sentiment")
    add_training_flags(p, "sentence_decoder", epochs=4, batch_size=32, learning_rate=2e-3)
    args = p.parse_args(argv)
    if args.quick:
        args.epochs, args.hidden, args.embedding, args.samples = 2, 16, 8, 8
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    folder = sst.data_dir(args.data_dir, args.quick)
    train_trees = sst.load("train", folder, 320 if args.quick else None)
    dev_trees = sst.load("dev", folder, 100 if args.quick else None)
    word_idx = {END: 0, UNK: 1, **{w: i + 2 for w, i in sst.vocabulary(train_trees, args.min_count).items()}}
    words = sorted(word_idx, key=word_idx.__getitem__)
    train, dev = examples_of(train_trees, word_idx), examples_of(dev_trees, word_idx)

    decoder = build_decoder(len(word_idx), args)
    trainer, fitted, sentiments, out = train_and_generate("sentence_decoder", decoder, build_model(decoder, args),
                                                          train, dev, args)
    params = fitted.best_params
    sentences = out.sequences()
    lengths, ended = np.asarray(out.lengths), np.asarray(out.ended)
    generated = [(int(s), seq) for s, seq in zip(sentiments, sentences)]
    generated_loss = float(trainer.evaluate(params, generated)["loss"])
    dev_loss = float(trainer.evaluate(params, dev)["loss"])
    rows = [[s, float(lengths[sentiments == s].mean()), float(1 - ended[sentiments == s].mean())]
            for s in range(SENTIMENTS)]
    print_table("Generated sentences per sentiment", ["sentiment", "mean words", "cut at max length"], rows)
    print(f"\nloss per word: dev sentences {dev_loss:.3f}, generated sentences {generated_loss:.3f}; dev sentences "
          f"have {np.mean([len(sst.words(t)) for t in dev_trees]):.1f} words on average")
    every = max(1, len(sentences) // 5)
    shown = [f"[{s}] " + " ".join(words[w] for w in seq) for s, seq in zip(sentiments[::every], sentences[::every])]
    print("\nsome generated sentences:")
    for text in shown[:5]:
        print(f"  {text[:200]}")
    report = {"args": {k: v for k, v in vars(args).items() if k != "json"}, "history": fitted.history,
              "dev_loss": dev_loss, "generated_loss": generated_loss, "generated_mean_words": float(lengths.mean()),
              "generated_cut": float(1 - ended.mean()), "vocabulary": len(word_idx), "examples": shown[:5]}
    write_report("sentence_decoder_quick" if args.quick else "sentence_decoder", report, args.json)
    return report


if __name__ == "__main__":
    main()
