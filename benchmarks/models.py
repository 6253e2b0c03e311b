"""The benchmark models: the Fold paper's Table 1 Tree-LSTM on random trees, SST's Tree-LSTM, and a
BiLSTM tagger on SST's words."""

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


def tagged_words(tree: Any) -> list[tuple[str, int]]:
    """An SST tree's words, left to right, each with its leaf's sentiment label (0-4): a
    per-word tagging task on real sentences for sequence models."""
    out, stack = [], [tree]
    while stack:
        node = stack.pop()
        if len(node) == 2 and isinstance(node[1], str):
            out.append((node[1], node[0]))
        else:
            stack.extend(reversed(node[1:]))
    return out


def tagger_examples(trees: list, word_idx: dict[str, int]) -> list[dict[str, list[int]]]:
    """``bilstm_tagger``'s examples from SST trees: word ids and per-word labels."""
    return [{"words": [word_idx[w] for w, _ in tagged], "tags": [tag for _, tag in tagged]}
            for tagged in map(tagged_words, trees)]


def bilstm_tagger(vocab: int, hidden: int = 128, embed_size: int = 64, tags: int = 5) -> fd.Block:
    """A BiLSTM tagger (as the DyNet benchmark suite's ``bilstm-tagger``, without its character
    LSTMs): word embeddings, a forward and a backward ``LSTMCell`` over the sentence, an FC to
    ``tags`` logits per word and a softmax loss per word (``loss`` metric)."""
    forward = fd.RNN(fd.LSTMCell(hidden)) >> fd.GetItem(0)
    backward = fd.Slice(step=-1) >> fd.RNN(fd.LSTMCell(hidden)) >> fd.GetItem(0) >> fd.Slice(step=-1)
    words = (fd.Map(fd.Scalar("int32") >> fd.Embedding(vocab, embed_size))
             >> fd.AllOf(forward, backward) >> fd.ZipWith(fd.Concat()) >> fd.Map(fd.FC(tags, activation=None)))
    score = fd.Function(lambda tag, logits: -jax.nn.log_softmax(logits)[jnp.arange(tag.shape[0]), tag])
    tagger = fd.Record({"words": words, "tags": fd.Map(fd.Scalar("int32"))}) >> fd.ZipWith(score >> fd.Metric("loss"))
    return tagger >> fd.Void()
