"""The benchmark models: the Fold paper's Table 1 Tree-LSTM on random trees, SST's Tree-LSTM, and
sequence models on SST's sentences (a BiLSTM tagger with character LSTMs, an LSTM language model)."""

from __future__ import annotations

import random
from typing import Any

import jax
import jax.numpy as jnp

import fold as fd


def random_tree(rng: random.Random, leaves: int) -> Any:
    """``make(n) = leaf if n <= 1 else (make(r), make(n - r))``, r uniform in [1, n-1];
    a leaf is an index into a table of ``leaves`` rows."""
    stack: list[Any] = []
    # Iterative post-order build: deep trees must not hit the recursion limit.
    todo: list[tuple[int, bool]] = [(leaves, False)]
    while todo:
        n, ready = todo.pop()
        if n <= 1:
            stack.append(rng.randrange(max(leaves, 1)))
        elif ready:
            right, left = stack.pop(), stack.pop()
            stack.append((left, right))
        else:
            r = rng.randint(1, n - 1)
            todo += [(n, True), (n - r, False), (r, False)]
    return stack[0]


class Table1Cell(fd.Layer):
    """The paper's Tree-LSTM variant: ``h0 = relu([l, r] W0 + b0)``, ``[fl, fr, i, g] = h0 W + b``,
    ``y = sigmoid(fl) l + sigmoid(fr) r + sigmoid(i) tanh(g)``."""

    def init(self, key: jax.Array, input_type: fd.Type) -> dict:
        h = input_type[0].shape[0]
        k0, k1 = jax.random.split(key)
        glorot = jax.nn.initializers.glorot_uniform()
        return {"w0": glorot(k0, (2 * h, h)), "b0": jnp.zeros(h), "w": glorot(k1, (h, 4 * h)), "b": jnp.zeros(4 * h)}

    def apply(self, params: dict, left: jax.Array, right: jax.Array) -> jax.Array:
        return table1_cell(params, left, right)


def table1_cell(params: dict, left: jax.Array, right: jax.Array) -> jax.Array:
    """One batched application of the Table 1 cell (shared with the hand-batched baseline)."""
    h0 = jax.nn.relu(jnp.concatenate([left, right], -1) @ params["w0"] + params["b0"])
    fl, fr, i, g = jnp.split(h0 @ params["w"] + params["b"], 4, axis=-1)
    return jax.nn.sigmoid(fl) * left + jax.nn.sigmoid(fr) * right + jax.nn.sigmoid(i) * jnp.tanh(g)


def table1_model(hidden: int, leaves: int) -> fd.Block:
    """Random tree -> root vector, with an embedding of ``leaves`` rows of size ``hidden``."""
    tree = fd.ForwardDeclaration(fd.PyObjectType(), fd.TensorType((hidden,)))
    leaf = fd.Scalar("int32") >> fd.Embedding(max(leaves, 1), hidden, name="embedding")
    pair = fd.Record((tree(), tree())) >> Table1Cell(name="cell")
    tree.resolve_to(fd.OneOf(lambda t: isinstance(t, tuple), {False: leaf, True: pair}))
    return tree()


def sst_model(word_idx: dict[str, int], state_size: int = 150, embed_size: int = 100) -> fd.Block:
    """The examples' SST Tree-LSTM with a per-node softmax loss (``loss`` metric)."""
    from examples import tree_lstm_sst

    args = tree_lstm_sst.parse_args(["--state-size", str(state_size), "--embed-size", str(embed_size)])
    return tree_lstm_sst.build_model(word_idx, args)



def tagger_model(train: list[dict[str, list]], hidden: int = 50) -> fd.Block:
    """``examples.tagger``'s BiLSTM tagger with character LSTMs for rare words (the DyNet benchmark
    suite's sizes: words 128, characters 20, MLP 32), its vocabularies from ``train``
    (``examples.tagger.examples_of``) and ``hidden`` units per word LSTM."""
    from examples import tagger

    args = tagger.parse_args(["--hidden", str(hidden)])
    return tagger.build_model(*tagger.vocabularies(train, args.min_count), args)


def lm_examples(trees: list, word_idx: dict[str, int]) -> list[list[int]]:
    """``rnn_lm``'s examples: each SST sentence's word ids (0 for words ``word_idx`` lacks), of
    sentences of at least two words."""
    from examples import sst

    return [ids for ids in ([word_idx.get(w, -1) + 1 for w in sst.words(t)] for t in trees) if len(ids) > 1]


def rnn_lm(vocab: int, hidden: int = 128, embed_size: int = 64) -> fd.Block:
    """An LSTM language model (the DyNet benchmark suite's ``rnnlm``): a sentence of word ids in
    ``[0, vocab)`` -> void, the cross-entropy of each next word given the words before it
    (``loss`` metric, one entry per word after the first)."""
    states = (fd.Map(fd.Scalar("int32") >> fd.Embedding(vocab, embed_size)) >> fd.RNN(fd.LSTMCell(hidden))
              >> fd.GetItem(0) >> fd.Slice(stop=-1) >> fd.Map(fd.FC(vocab, activation=None)))
    following = fd.Slice(start=1) >> fd.Map(fd.Scalar("int32"))
    score = fd.Function(lambda z, y: -jax.nn.log_softmax(z)[jnp.arange(y.shape[0]), y])
    return fd.AllOf(states, following) >> fd.ZipWith(score >> fd.Metric("loss")) >> fd.Void()
