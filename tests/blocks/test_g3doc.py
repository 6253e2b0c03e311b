"""TensorFlow Fold's own g3doc examples (blocks.md), run as written there with ``td.`` -> ``fd.``
and TensorFlow layers replaced by this library's (``ScopedLayer(BasicLSTMCell(n))`` -> ``LSTMCell(n)``,
``tf.nn.sigmoid`` -> ``jax.nn.sigmoid``)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fold as fd


def _lstm_reference(cell: fd.LSTMCell, p: dict, xs: list) -> tuple:
    """The final (c, h) of ``cell`` over vectors ``xs``, one step at a time."""
    c = h = jnp.zeros((1, cell.num_units))
    for x in xs:
        _, (c, h) = cell.apply(p, jnp.asarray(x, jnp.float32)[None], (c, h))
    return c[0], h[0]


def test_the_hierarchical_lstm_runs_as_written():
    char_cell = fd.LSTMCell(16, name="char_cell")
    word_cell = fd.LSTMCell(32, name="word_cell")

    # character LSTM converts a string to a word vector
    char_lstm = (fd.InputTransform(lambda s: [ord(c) for c in s]) >>
                 fd.Map(fd.Scalar("int32") >>
                        fd.Function(fd.Embedding(128, 8, name="chars"))) >>
                 fd.RNN(char_cell))
    # word LSTM converts a sequence of word vectors to a sentence vector.
    word_lstm = fd.Map(char_lstm >> fd.GetItem(1)) >> fd.RNN(word_cell)

    compiler = fd.Compiler.create(word_lstm >> fd.GetItem(1) >> fd.GetItem(1))
    params = compiler.init(jax.random.key(0))
    sentences = [["hello", "world"], ["a"], ["fold", "in", "jax"]]
    out = compiler.apply(params, compiler.build_batch(sentences)).outputs

    def reference(sentence):
        words = []
        for word in sentence:
            chars = [params["chars"]["table"][ord(ch) % 128] for ch in word]
            c, h = _lstm_reference(char_cell, params["char_cell"], chars)
            words.append(jnp.concatenate([c, h]))  # the word's final state (c, h), as one input
        return _lstm_reference(word_cell, params["word_cell"], words)[1]

    np.testing.assert_allclose(out, jnp.stack([reference(s) for s in sentences]), rtol=1e-5, atol=1e-6)


def _composition_lstm_cell(num_hidden: int) -> fd.Composition:
    # The input to lstm_cell is (input_vec, (previous_cell_state, previous_output_vec))
    # The output of lstm_cell is (output_vec, (next_cell_state, output_vec))
    lstm_cell = fd.Composition()
    with lstm_cell.scope():
        in_state = fd.Identity().reads(lstm_cell.input[1])
        bx = fd.Concat().reads(lstm_cell.input[0], in_state[1])     # inputs to gates
        bi = fd.Function(fd.FC(num_hidden, jax.nn.sigmoid, name="i")).reads(bx)  # input gate
        bf = fd.Function(fd.FC(num_hidden, jax.nn.sigmoid, name="f")).reads(bx)  # forget gate
        bo = fd.Function(fd.FC(num_hidden, jax.nn.sigmoid, name="o")).reads(bx)  # output gate
        bg = fd.Function(fd.FC(num_hidden, jnp.tanh, name="g")).reads(bx)     # modulation
        bc = fd.Function(lambda c, i, f, g: c * f + i * g).reads(in_state[0], bi, bf, bg)
        by = fd.Function(lambda c, o: jnp.tanh(c) * o).reads(bc, bo)    # final output
        out_state = fd.Identity().reads(bc, by)   # make a tuple of (bc, by)
        lstm_cell.output.reads(by, out_state)
    return lstm_cell


def test_the_composition_lstm_cell_needs_its_state_declared_and_says_how():
    with pytest.raises(TypeError, match=r"RNN cannot infer its state type: its cell Composition declares none.*"
                                        r"initial_state=fd.Zeros\(state type\)"):
        fd.Compiler.create(fd.Map(fd.Vector(3)) >> fd.RNN(_composition_lstm_cell(8)))
    model = fd.Map(fd.Vector(3)) >> fd.RNN(_composition_lstm_cell(8), initial_state=fd.Zeros(((8,), (8,))))
    compiler = fd.Compiler.create(model >> fd.GetItem(1) >> fd.GetItem(1))
    params = compiler.init(jax.random.key(0))
    sequences = [[[1.0, 0.0, 2.0], [0.5, -1.0, 0.0]], [[0.0, 0.0, 1.0]], []]

    def reference(xs):
        c = h = jnp.zeros(8)
        for x in xs:
            gx = jnp.concatenate([jnp.asarray(x, jnp.float32), h])

            def gate(name, act):
                return act(gx @ params[name]["w"] + params[name]["b"])
            c = c * gate("f", jax.nn.sigmoid) + gate("i", jax.nn.sigmoid) * gate("g", jnp.tanh)
            h = jnp.tanh(c) * gate("o", jax.nn.sigmoid)
        return h

    out = compiler.apply(params, compiler.build_batch(sequences)).outputs
    np.testing.assert_allclose(out, jnp.stack([reference(s) for s in sequences]), rtol=1e-5, atol=1e-6)


def test_cells_take_a_tuple_of_vectors_as_their_input():
    """A word's final LSTM state (c, h) is a tuple; the next LSTM reads it concatenated, as FC does."""
    cell = fd.GRUCell(4, name="gru")
    model = fd.Map(fd.Record((fd.Vector(2), fd.Vector(3)))) >> fd.RNN(cell) >> fd.GetItem(1)
    compiler = fd.Compiler.create(model)
    params = compiler.init(jax.random.key(0))
    assert params["gru"]["w_cand"].shape == (2 + 3 + 4, 4)
    seqs = [[([1.0, 2.0], [0.0, 1.0, 0.5])], [([0.0, 1.0], [1.0, 1.0, 1.0]), ([2.0, 0.0], [0.0, 0.0, 0.0])]]
    out = compiler.apply(params, compiler.build_batch(seqs)).outputs

    def reference(xs):
        h = jnp.zeros((1, 4))
        for a, b in xs:
            _, h = cell.apply(params["gru"], jnp.asarray(a + b, jnp.float32)[None], h)
        return h[0]

    np.testing.assert_allclose(out, jnp.stack([reference(s) for s in seqs]), rtol=1e-5, atol=1e-6)
