"""TensorFlow Fold's own g3doc examples (blocks.md and types.md) and its calculator and sentiment
models (blocks/examples/calculator/model.py, blocks/examples/sentiment/sentiment.py), run as written
there with ``td.`` -> ``fd.`` and TensorFlow layers and ops replaced by this library's and JAX's
(``ScopedLayer(BasicLSTMCell(n))`` -> ``LSTMCell(n)``, ``tf.nn.sigmoid`` -> ``jax.nn.sigmoid``),
each checked against a NumPy or per-example JAX reference where it computes something.

The sentiment model's other changes, each marked where it is made: its TensorFlow cell subclass
and ``DropoutWrapper`` are ``BinaryTreeLSTMCell(recurrent_dropout=...)``, whose ``state_type``
replaces ``state_size``; ``Embedding.num_units_out`` replaces ``output_type.shape[0]``; labels
are parsed with ``int`` (Fold's ``Scalar`` read the string ``'2'``, here a string is not a
number); nltk's ``sexpr_tokenize`` is written out; hits are float32 (JAX's default)."""

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


# --- the rest of blocks.md ---------------------------------------------------------------------

def test_from_tensor_constants():
    """``FromTensor(np.zeros([]))`` is float64 in Fold; JAX keeps float32 unless x64 is enabled.
    (Fold's third line, a ``tf.Variable``, is a parameter here: a layer's.)"""
    assert fd.FromTensor(np.zeros([])).output_type == fd.TensorType(())
    assert fd.FromTensor(jnp.zeros([])).output_type == fd.TensorType(())
    assert float(fd.FromTensor(jnp.zeros([])).eval(None)) == 0.0


def test_one_fc_layer_shared_by_three_functions():
    fclayer = fd.FC(16)
    ffnet = fd.Function(fclayer) >> fd.Function(fclayer) >> fd.Function(fclayer)
    compiler = fd.Compiler.create(fd.Vector(16) >> ffnet)
    params = compiler.init(jax.random.key(0))
    assert list(params) == [fclayer.name]  # one set of weights
    w, b = np.asarray(params[fclayer.name]["w"]), np.asarray(params[fclayer.name]["b"])
    x = np.linspace(-1, 1, 16, dtype=np.float32)
    want = x
    for _ in range(3):
        want = np.maximum(want @ w + b, 0)
    out = compiler.apply(params, compiler.build_batch([x.tolist()])).outputs[0]
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)


def test_mnist_model():
    mnist_model = (fd.InputTransform(lambda s: [ord(c) / 255.0 for c in s]) >>
                   fd.Vector(784) >>             # convert python list to tensor
                   fd.Function(fd.FC(100)) >>    # layer 1, 100 hidden units
                   fd.Function(fd.FC(100)))      # layer 2, 100 hidden units
    compiler = fd.Compiler.create(mnist_model)
    params = compiler.init(jax.random.key(0))
    image = "".join(chr(i % 256) for i in range(784))
    h = np.array([ord(c) / 255.0 for c in image], np.float32)
    for name in sorted(params, key=lambda n: params[n]["w"].shape[0], reverse=True):  # 784 -> 100 -> 100
        h = np.maximum(h @ np.asarray(params[name]["w"]) + np.asarray(params[name]["b"]), 0)
    np.testing.assert_allclose(compiler.apply(params, compiler.build_batch([image])).outputs[0], h,
                               rtol=1e-4, atol=1e-5)


def test_abs_sum_and_a_character_rnn():
    shape = ()
    def abs_():
        return fd.Map(fd.Scalar() >> fd.Function(jnp.abs))

    sum_in_order = fd.Fold(fd.Function(jnp.add), fd.FromTensor(jnp.zeros(shape)))
    sum_in_parallel = fd.Reduce(fd.Function(jnp.add))
    assert float((abs_() >> sum_in_order).eval([1, -2, 3])) == 6.0
    assert float((abs_() >> sum_in_parallel).eval([1, -2, 3, -4])) == 10.0

    char_rnn = (fd.InputTransform(lambda s: [ord(c) for c in s]) >>
                # Embed each character using an embedding table of size 128 x 16
                fd.Map(fd.Scalar("int32") >>
                       fd.Function(fd.Embedding(128, 16, name="chars"))) >>
                # Fold over the sequence of embedded characters,
                # producing an output vector of length 64.
                fd.Fold(fd.Concat() >> fd.Function(fd.FC(64, name="fold_fc")),
                        fd.FromTensor(jnp.zeros(64))))
    compiler = fd.Compiler.create(char_rnn)
    params = compiler.init(jax.random.key(0))
    table, w, b = (np.asarray(params["chars"]["table"]), np.asarray(params["fold_fc"]["w"]),
                   np.asarray(params["fold_fc"]["b"]))
    state = np.zeros(64, np.float32)
    for c in "fold":
        state = np.maximum(np.concatenate([state, table[ord(c)]]) @ w + b, 0)
    np.testing.assert_allclose(compiler.apply(params, compiler.build_batch(["fold"])).outputs[0], state,
                               rtol=1e-5, atol=1e-6)


def test_record_of_an_id_a_name_and_a_location():
    num_ids, embed_len = 16, 16
    char_rnn = (fd.InputTransform(lambda s: [ord(c) for c in s])
                >> fd.Map(fd.Scalar("int32") >> fd.Function(fd.Embedding(128, 16)))
                >> fd.Fold(fd.Concat() >> fd.Function(fd.FC(64)), fd.FromTensor(jnp.zeros(64))))
    rec = (fd.Record([("id", fd.Scalar("int32") >>
                       fd.Function(fd.Embedding(num_ids, embed_len))),
                      ("name", char_rnn),
                      ("location", fd.Vector(2))]) >>
           fd.Concat() >> fd.Function(fd.FC(128)))
    out = rec.eval({"id": 8, "name": "Joe Smith", "location": (2.5, 7.0)})
    assert out.shape == (128,) and np.isfinite(out).all()


# --- types.md ----------------------------------------------------------------------------------

def test_types_md():
    assert fd.Scalar().input_type == fd.PyObjectType()
    assert fd.Scalar().output_type == fd.TensorType((), "float32")
    assert fd.Length().input_type is None
    assert fd.Length().output_type == fd.TensorType((), "float32")

    length_block = fd.Length()
    seq_len = fd.Map(fd.Scalar()) >> length_block
    assert length_block.input_type == fd.SequenceType(fd.TensorType((), "float32"))
    assert seq_len.output_type == fd.TensorType(())

    length_block = fd.Length()
    length_block.set_input_type(fd.SequenceType(fd.TensorType((), "float32")))
    assert length_block.input_type == fd.SequenceType(fd.TensorType((), "float32"))

    with pytest.raises(TypeError, match="Length takes a sequence or a non-empty tuple, not VoidType"):
        fd.Length().set_input_type(fd.VoidType())

    length_block = fd.Length()
    length_block.set_input_type(fd.PyObjectType())
    with pytest.raises(TypeError, match=r"Map has output type SequenceType\(TensorType\(\(\), 'float32'\)\) "
                                        r"but Length has PyObjectType\(\)"):
        fd.Map(fd.Scalar()) >> length_block

    f = fd.Function(jnp.add)
    (fd.Scalar(), fd.Scalar()) >> f
    assert f.input_type == fd.TupleType(fd.TensorType((), "float32"), fd.TensorType((), "float32"))

    assert fd.Map(fd.Scalar()).output_type == fd.SequenceType(fd.TensorType((), "float32"))
    assert fd.InputTransform(str.lower).output_type == fd.PyObjectType()
    assert fd.Map(fd.InputTransform(str.lower)).output_type == fd.PyObjectType()


# --- Fold's calculator example (blocks/examples/calculator/model.py) -----------------------------

NUM_LABELS = 3  # negative, zero and positive.


def preprocess_expression(expr):
    # Set the op field for numbers, so we can handle cases uniformly.
    if expr["number"] is not None:
        expr["op"] = {"name": "NUM"}
    return expr


def result_sign(result):
    if result < 0:
        return 0
    if result == 0:
        return 1
    return 2


def calculator_model(state_size: int) -> fd.Block:
    """Fold's CalculatorModel.__init__ up to ``Compiler.create``, with ``td.`` -> ``fd.``."""
    expr_decl = fd.ForwardDeclaration(fd.PyObjectType(), state_size)
    digit = (fd.GetItem("number") >> fd.Scalar(dtype="int32") >>
             fd.Function(fd.Embedding(10, state_size, name="terminal_embed")))

    def bin_op(name):
        return (fd.Record([("left", expr_decl()), ("right", expr_decl())]) >>
                fd.Concat() >>
                fd.FC(state_size, name="FC_" + name))

    cases = fd.OneOf(lambda x: x["op"]["name"],
                     {"NUM": digit,
                      "PLUS": bin_op("PLUS"),
                      "MINUS": bin_op("MINUS"),
                      "TIMES": bin_op("TIMES"),
                      "DIV": bin_op("DIV")})
    expression = fd.InputTransform(preprocess_expression) >> cases
    expr_decl.resolve_to(expression)
    expression_logits = (expression >>
                         fd.FC(NUM_LABELS, activation=None, name="FC_logits"))
    expression_label = (fd.GetItem("result") >>
                        fd.InputTransform(result_sign) >>
                        fd.OneHot(NUM_LABELS))
    return fd.AllOf(expression_logits, expression_label)


def _number(n):
    return {"number": n, "op": None, "result": n}


def _op(name, left, right, result):
    return {"number": None, "op": {"name": name}, "left": left, "right": right, "result": result}


def test_fold_calculator_model():
    state_size = 8
    compiler = fd.Compiler.create(calculator_model(state_size))
    params = compiler.init(jax.random.key(0))
    examples = [_op("PLUS", _number(3), _op("TIMES", _number(2), _number(4), 8), 11),
                _number(0),
                _op("MINUS", _number(1), _op("DIV", _number(9), _number(3), 3), -2)]

    def p(name):
        return np.asarray(params[name]["w"]), np.asarray(params[name]["b"])

    def encode(e):  # the model, one expression at a time, in NumPy
        if e["number"] is not None:
            return np.asarray(params["terminal_embed"]["table"])[e["number"]]
        w, b = p("FC_" + e["op"]["name"])
        return np.maximum(np.concatenate([encode(e["left"]), encode(e["right"])]) @ w + b, 0)

    w, b = p("FC_logits")
    want_logits = np.stack([encode(e) @ w + b for e in [dict(x) for x in examples]])
    logits, labels = compiler.apply(params, compiler.build_batch(examples)).outputs
    np.testing.assert_allclose(logits, want_logits, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(labels, np.eye(NUM_LABELS)[[2, 1, 0]])
    # Fold's loss and accuracy on the two outputs.
    loss = jnp.mean(optax_softmax_cross_entropy(logits, labels))
    assert np.isfinite(float(loss))


def optax_softmax_cross_entropy(logits, labels):
    import optax

    return optax.softmax_cross_entropy(logits, labels)


# --- Fold's sentiment example (blocks/examples/sentiment/sentiment.py) --------------------------

NUM_CLASSES = 5


def sexpr_tokenize(s):
    """nltk's ``sexpr_tokenize`` for the strings the example gives it: the top-level
    parenthesised groups and words of ``s``."""
    out, i = [], 0
    while i < len(s):
        if s[i].isspace():
            i += 1
        elif s[i] == "(":
            depth, j = 0, i
            while True:
                depth += {"(": 1, ")": -1}.get(s[j], 0)
                j += 1
                if depth == 0:
                    break
            out.append(s[i:j])
            i = j
        else:
            j = i
            while j < len(s) and not s[j].isspace() and s[j] != "(":
                j += 1
            out.append(s[i:j])
            i = j
    return out


def tokenize(s):
    # sexpr_tokenize can't parse 'foo bar', only '(foo) (bar)', so we
    # use split to handle the case of a leaf (e.g. 'label word').
    label, phrase = s[1:-1].split(None, 1)
    return int(label), sexpr_tokenize(phrase)  # Fold's Scalar read the string '2'; here labels are ints


def _loss(logits, labels):
    return optax_softmax_cross_entropy_with_integer_labels(logits, labels)


def tf_binary_hits(logits, y_):
    softmax = jax.nn.softmax(logits)
    binary_y = (softmax[:, 3] + softmax[:, 4]) > (softmax[:, 0] + softmax[:, 1])
    binary_y_ = y_ > 2
    return (binary_y == binary_y_).astype(jnp.float32)


def add_metrics(is_root, is_neutral):
    """A block that adds metrics for loss and hits; output is the LSTM state."""
    c = fd.Composition(name=f"predict(is_root={is_root}, is_neutral={is_neutral})")
    with c.scope():
        # destructure the input; (label, (logits, state))
        y_ = c.input[0]
        logits = fd.GetItem(0).reads(c.input[1])
        state = fd.GetItem(1).reads(c.input[1])
        # predict the label from the logits
        y = fd.Function(lambda x: jnp.argmax(x, 1).astype(jnp.int32)).reads(logits)
        # calculate loss
        loss = fd.Function(_loss)
        fd.Metric("all_loss").reads(loss.reads(logits, y_))
        if is_root:
            fd.Metric("root_loss").reads(loss)
        # calculate hits
        hits = fd.Function(lambda y, y_: (y == y_).astype(jnp.float32))
        fd.Metric("all_hits").reads(hits.reads(y, y_))
        if is_root:
            fd.Metric("root_hits").reads(hits)
        # calculate binary hits, if the label is not neutral
        if not is_neutral:
            binary_hits = fd.Function(tf_binary_hits).reads(logits, y_)
            fd.Metric("all_binary_hits").reads(binary_hits)
            if is_root:
                fd.Metric("root_binary_hits").reads(binary_hits)
        # output the state, which will be read by our by parent's LSTM cell
        c.output.reads(state)
    return c


def embed_tree(logits_and_state, is_root):
    """Creates a block that embeds trees; output is tree LSTM state."""
    return fd.InputTransform(tokenize) >> fd.OneOf(
        key_fn=lambda pair: pair[0] == 2,  # label 2 means neutral
        case_blocks=(add_metrics(is_root, is_neutral=False),
                     add_metrics(is_root, is_neutral=True)),
        pre_block=(fd.Scalar("int32"), logits_and_state))


def create_model(word_embedding, word_idx, lstm_num_units, keep_prob=1):
    """Creates a sentiment model (Fold's, down to the compiler; the TensorFlow cell subclass and
    its DropoutWrapper are this library's BinaryTreeLSTMCell)."""
    tree_lstm = fd.BinaryTreeLSTMCell(lstm_num_units, recurrent_dropout=1 - keep_prob, name="tree_lstm")
    state = tree_lstm.state_type  # (c, h); Fold: tree_lstm.state_size
    output_layer = fd.FC(NUM_CLASSES, activation=None, name="output_layer")
    embed_subtree = fd.ForwardDeclaration(output_type=state)
    unknown_idx = len(word_idx)

    def lookup_word(word):
        return word_idx.get(word, unknown_idx)

    def logits_and_state():
        """Creates a block that goes from tokens to (logits, state) tuples."""
        word2vec = (fd.GetItem(0) >> fd.InputTransform(lookup_word) >>
                    fd.Scalar("int32") >> word_embedding)
        pair2vec = (embed_subtree(), embed_subtree())
        # Trees are binary, so the tree layer takes two states as its input_state.
        zero_state = fd.Zeros((state,) * 2)
        # Input is a word vector.
        zero_inp = fd.Zeros(word_embedding.num_units_out)  # Fold: word_embedding.output_type.shape[0]
        word_case = fd.AllOf(word2vec, zero_state)
        pair_case = fd.AllOf(zero_inp, pair2vec)
        tree2vec = fd.OneOf(len, [(1, word_case), (2, pair_case)])
        return tree2vec >> tree_lstm >> (output_layer, fd.Identity())

    model = embed_tree(logits_and_state(), is_root=True)
    embed_subtree.resolve_to(embed_tree(logits_and_state(), is_root=False))
    return fd.Compiler.create(model)


def optax_softmax_cross_entropy_with_integer_labels(logits, labels):
    import optax

    return optax.softmax_cross_entropy_with_integer_labels(logits, labels)


def test_fold_sentiment_model():
    trees = ["(3 (2 It) (4 (4 (2 's) (4 (3 a) (4 (3 lovely) (2 film)))) (2 .)))",
             "(1 (2 Not) (1 (2 (2 a) (1 movie)) (2 .)))",
             "(2 Fine)"]
    words = sorted({w for t in trees for w in re_words(t)})
    word_idx = {w: i for i, w in enumerate(words[:-1])}  # the last word is unknown
    table = np.random.default_rng(0).normal(size=(len(word_idx) + 1, 6)).astype(np.float32)
    word_embedding = fd.Embedding(*table.shape, initializer=table, name="word_embedding")
    compiler = create_model(word_embedding, word_idx, lstm_num_units=4)
    params = compiler.init(jax.random.key(0))
    metrics = compiler.apply(params, compiler.build_batch(trees)).metrics
    cell = fd.BinaryTreeLSTMCell(4)
    w, b = params["output_layer"]["w"], params["output_layer"]["b"]
    zero = jnp.zeros((1, 4))
    all_loss, root_loss, root_binary = [], [], []

    def run(s, is_root):  # the model, one node at a time
        label, parts = tokenize(s)
        if len(parts) == 1:
            x = jnp.asarray(table[word_idx.get(parts[0], len(word_idx))])[None]
            h, state = cell.apply(params["tree_lstm"], x, ((zero, zero), (zero, zero)))
        else:
            left, right = run(parts[0], False), run(parts[1], False)
            h, state = cell.apply(params["tree_lstm"], jnp.zeros((1, 6)), (left, right))
        logits = h @ w + b
        loss = float(_loss(logits, jnp.asarray([label]))[0])
        all_loss.append(loss)
        if is_root:
            root_loss.append(loss)
            if label != 2:
                root_binary.append(float(tf_binary_hits(logits, jnp.asarray([label]))[0]))
        return state

    for t in trees:
        run(t, True)
    np.testing.assert_allclose(np.sort(np.asarray(metrics["all_loss"].values)), np.sort(all_loss), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(metrics["root_loss"].values), root_loss, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(metrics["root_binary_hits"].values), root_binary)
    assert len(metrics["all_hits"].values) == len(all_loss) == 11 + 7 + 1  # every node of the three trees


def re_words(tree: str) -> list[str]:
    import re

    return re.findall(r"\(\d ([^()\s]+)\)", tree)
