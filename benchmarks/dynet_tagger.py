"""fold against DyNet's automatic batching on the DyNet benchmark suite's BiLSTM tagger with
character LSTMs for rare words (``bilstm-tagger-withchar``).

Both train the same model on the same batches of SST sentences, tagged with their per-word
sentiment labels (``examples.tagger``): words seen at least 5 times in training are embedded
(128), rarer ones are read by a forward and a backward character LSTM (characters 20, 64 units
each) whose final states stand in for the embedding; a forward and a backward word LSTM (50
each), then a bias-free tanh MLP (32) per word and a softmax loss per word, summed over the
batch; plain SGD, and the loss read after every step (as a training loop that logs does).

- fold: ``examples.tagger.build_model``, batches from ``compiler.batches`` (built ahead on a
  thread), one jitted step per batch, ``float(loss)`` after each.
- DyNet (``pip install dynet38``): the suite's script as written, one graph per batch built
  sentence by sentence with ``VanillaLSTMBuilder``s, ``autobatch=1`` batching its operations,
  ``loss.value()`` then ``backward`` and ``SimpleSGDTrainer.update``.

Each first runs ``--warmup`` batches (fold compiles its layout there), then the next
``--batches`` are timed; ``--rounds`` rounds take turns. Reports sentences per second and fold
over DyNet (the issue's goal: 1.5x at batch 16 and 64).

Run: ``python -m benchmarks.dynet_tagger --data-dir DIR`` (``--quick``: seconds, on the sample).
Writes ``benchmarks/results/dynet_tagger.json``.
"""

from __future__ import annotations

import argparse
import random
from typing import Any

import jax
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
from examples import sst, tagger

# DyNet's trainers clip the gradients' global norm to this by default.
DYNET_CLIP = 5.0


class DynetTagger:
    """The suite's ``bilstm-tagger-withchar`` in DyNet, sized as ``examples.tagger``'s defaults."""

    def __init__(self, word_idx: dict[str, int], char_idx: dict[str, int], args: argparse.Namespace, lr: float):
        self.dy = dy = start_dynet()
        self.word_idx, self.char_idx = word_idx, char_idx
        m = self.model = dy.ParameterCollection()
        self.words = m.add_lookup_parameters((len(word_idx), args.word_size))
        self.chars = m.add_lookup_parameters((len(char_idx) + 1, args.char_size))
        half = args.word_size // 2
        self.char_fw = dy.VanillaLSTMBuilder(1, args.char_size, half, m)
        self.char_bw = dy.VanillaLSTMBuilder(1, args.char_size, args.word_size - half, m)
        self.fw = dy.VanillaLSTMBuilder(1, args.word_size, args.hidden, m)
        self.bw = dy.VanillaLSTMBuilder(1, args.word_size, args.hidden, m)
        self.hidden = m.add_parameters((args.mlp_size, 2 * args.hidden))
        self.out = m.add_parameters((tagger.TAGS, args.mlp_size))
        self.trainer = dy.SimpleSGDTrainer(m, learning_rate=lr)

    def word(self, w: str, char_fw: Any, char_bw: Any) -> Any:
        if w in self.word_idx:
            return self.words[self.word_idx[w]]
        embs = [self.chars[self.char_idx.get(ch, 0)] for ch in w]
        return self.dy.concatenate([char_fw.transduce(embs)[-1], char_bw.transduce(embs[::-1])[-1]])

    def sentence_loss(self, example: dict[str, list]) -> Any:
        dy = self.dy
        char_fw, char_bw = self.char_fw.initial_state(), self.char_bw.initial_state()
        vectors = [self.word(w, char_fw, char_bw) for w in example["words"]]
        forward = self.fw.initial_state().transduce(vectors)
        backward = self.bw.initial_state().transduce(vectors[::-1])[::-1]
        return dy.esum([dy.pickneglogsoftmax(self.out * dy.tanh(self.hidden * dy.concatenate([f, b])), t)
                        for f, b, t in zip(forward, backward, example["tags"])])

    def step(self, batch: list[dict[str, list]]) -> float:
        """One SGD step on the summed loss of ``batch``; returns the loss."""
        self.dy.renew_cg()
        loss = self.dy.esum([self.sentence_loss(e) for e in batch])
        value = loss.value()
        loss.backward()
        self.trainer.update()
        return float(value)


def fold_peer(examples: list, word_idx: dict, char_idx: dict, args: argparse.Namespace, batch_size: int,
              lr: float) -> Steps:
    """fold's steps (``against_dynet.fold_steps``) on the tagger, with DyNet's clipped SGD."""
    compiler = fd.Compiler.create(tagger.build_model(word_idx, char_idx, args))
    # DyNet's trainers rescale gradients whose global norm exceeds 5: without it, fold's SGD on the
    # summed loss diverged where DyNet's did not (the runs' mean losses differed 5-90x).
    optimizer = optax.chain(optax.clip_by_global_norm(DYNET_CLIP), optax.sgd(lr))
    return fold_steps(compiler, compiler.init(jax.random.key(0)), optimizer, examples, batch_size)


def dynet_steps(examples: list, word_idx: dict, char_idx: dict, args: argparse.Namespace, batch_size: int,
                lr: float) -> Steps:
    """DyNet's steps on the same batches."""
    model = DynetTagger(word_idx, char_idx, args, lr)
    for batch in batches_of(examples, batch_size):
        yield model.step(list(batch))


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_race_flags(p, [16, 64])
    add_run_flags(p, "dynet_tagger", "batch size 8, few batches, on the sample")
    args = p.parse_args(argv)
    if args.quick:
        args.batch_sizes, args.warmup, args.batches, args.rounds = [8], 2, 3, 1
    trees = sst.load("train", sst.data_dir(args.data_dir, args.quick))
    random.Random(0).shuffle(trees)
    examples = tagger.examples_of(trees)
    sizes = tagger.parse_args(["--quick"] if args.quick else [])
    word_idx, char_idx = tagger.vocabularies(examples, sizes.min_count)
    lr = 0.01
    runs = [race({FOLD: fold_peer(examples, word_idx, char_idx, sizes, batch_size, lr),
                  DYNET: dynet_steps(examples, word_idx, char_idx, sizes, batch_size, lr)}, batch_size, args)
            for batch_size in args.batch_sizes]
    plot = report("BiLSTM tagger with character LSTMs, training (sentences/s)", runs)
    result = {"runs": runs, "warmup": args.warmup, "batches": args.batches, "rounds": args.rounds,
              "sizes": {k: getattr(sizes, k) for k in ("word_size", "char_size", "hidden", "mlp_size", "min_count")}}
    save_results("dynet_tagger", result, args, plot)
    return result


if __name__ == "__main__":
    main()
