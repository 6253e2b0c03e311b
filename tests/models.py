"""Models shared by the differential and gradient tests, with NumPy references.

Each ``make_*`` returns ``(block, reference, examples)``: ``reference(params,
example)`` evaluates one example recursively in NumPy, independently of fold.
"""

from __future__ import annotations

import random

import jax
import jax.numpy as jnp
import numpy as np

import fold as fd


def enable_x64():
    """float64 mode as a context manager, on old and new JAX alike."""
    if hasattr(jax, "enable_x64"):
        return jax.enable_x64(True)
    from jax.experimental import enable_x64 as legacy  # JAX < 0.7

    return legacy()


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def np_params(params: dict) -> dict:
    return {k: {n: np.asarray(v, np.float64) for n, v in p.items()} for k, p in params.items()}


def random_tree(rng: random.Random, leaves: int, leaf=lambda r: r.randrange(50)):
    """``make(n) = leaf if n <= 1 else (make(r), make(n - r))``, r uniform in [1, n-1]."""
    if leaves <= 1:
        return leaf(rng)
    r = rng.randint(1, leaves - 1)
    return (random_tree(rng, r, leaf), random_tree(rng, leaves - r, leaf))


# ----------------------------------------------------------------- sequence RNN
def make_rnn(dtype: str = "float32", seed: int = 0, n: int = 20):
    cell = fd.LSTMCell(8)
    block = fd.Map(fd.Vector(3, dtype)) >> fd.RNN(cell) >> fd.GetItem(1) >> fd.GetItem(1)
    rng = np.random.default_rng(seed)
    examples = [rng.normal(size=(int(k), 3)).tolist() for k in rng.integers(0, 12, n)]
    examples[0] = []

    def reference(params: dict, xs: list) -> np.ndarray:
        p = np_params(params)[cell.name]
        c = h = np.zeros(8)
        for x in xs:
            z = np.concatenate([np.asarray(x, np.float64), h]) @ p["w"] + p["b"]
            i, f, g, o = np.split(z, 4)
            c = sigmoid(f + 1.0) * c + sigmoid(i) * np.tanh(g)
            h = sigmoid(o) * np.tanh(c)
        return h

    return block, reference, examples


# ------------------------------------------------------- expression evaluator
def make_calculator(dtype: str = "float32", seed: int = 0, n: int = 20):
    decl = fd.ForwardDeclaration(fd.PyObjectType(), fd.TensorType((), dtype))
    scale = fd.FC(1, activation=None)
    lit = fd.GetItem("val") >> fd.Scalar(dtype)
    add = fd.Record({"left": decl(), "right": decl()}) >> fd.Function(jnp.add)
    mul = fd.Record({"left": decl(), "right": decl()}) >> fd.Function(jnp.multiply)
    squash = (fd.GetItem("arg") >> decl() >> fd.Function(lambda x: x[:, None]) >> fd.Function(scale)
              >> fd.Function(lambda y: jnp.tanh(y[:, 0])))
    decl.resolve_to(fd.OneOf(lambda e: e["op"], {"lit": lit, "add": add, "mul": mul, "squash": squash}))
    block = decl()

    rng = random.Random(seed)

    def expr(depth: int):
        if depth == 0 or rng.random() < 0.25:
            return {"op": "lit", "val": round(rng.uniform(-2, 2), 3)}
        op = rng.choice(["add", "mul", "squash"])
        if op == "squash":
            return {"op": op, "arg": expr(depth - 1)}
        return {"op": op, "left": expr(depth - 1), "right": expr(depth - 1)}

    examples = [expr(rng.randint(0, 6)) for _ in range(n)]

    def reference(params: dict, e: dict) -> float:
        p = np_params(params)[scale.name]
        if e["op"] == "lit":
            return float(e["val"])
        if e["op"] == "squash":
            return float(np.tanh(reference(params, e["arg"]) * p["w"][0, 0] + p["b"][0]))
        a, b = reference(params, e["left"]), reference(params, e["right"])
        return a + b if e["op"] == "add" else a * b

    return block, reference, examples


# ------------------------------------------------------------ Tree-LSTM
def make_tree_lstm(dtype: str = "float32", seed: int = 0, n: int = 20, hidden: int = 6, words: int = 50,
                   recurrent_dropout: float = 0.0):
    cell = fd.BinaryTreeLSTMCell(hidden, recurrent_dropout=recurrent_dropout)
    embed = fd.Embedding(words, 4, dtype=dtype)
    h = fd.TensorType((hidden,), dtype)
    state = fd.TupleType(h, h)
    decl = fd.ForwardDeclaration(fd.PyObjectType(), state)
    leaf = (fd.Scalar("int32") >> fd.Function(embed)
            >> fd.AllOf(fd.Identity(), fd.Zeros(fd.TupleType(state, state))) >> fd.Function(cell) >> fd.GetItem(1))
    inner = fd.AllOf(fd.Zeros(fd.TensorType((4,), dtype)), fd.Record((decl(), decl()))) >> fd.Function(cell) \
        >> fd.GetItem(1)
    decl.resolve_to(fd.OneOf(lambda t: isinstance(t, tuple), {False: leaf, True: inner}))
    block = decl() >> fd.GetItem(1)

    rng = random.Random(seed)
    examples = [random_tree(rng, rng.randint(1, 16), lambda r: r.randrange(words)) for _ in range(n)]

    def reference(params: dict, tree) -> np.ndarray:
        p = np_params(params)
        w, b = p[cell.name]["w"], p[cell.name]["b"]

        def cell_fn(x, left, right):
            z = np.concatenate([x, left[1], right[1]]) @ w + b
            i, fl, fr, o, u = np.split(z, 5)
            c = sigmoid(i) * np.tanh(u) + sigmoid(fl + 1.0) * left[0] + sigmoid(fr + 1.0) * right[0]
            return c, sigmoid(o) * np.tanh(c)

        zero = (np.zeros(hidden), np.zeros(hidden))

        def go(t):
            if isinstance(t, tuple):
                return cell_fn(np.zeros(4), go(t[0]), go(t[1]))
            return cell_fn(p[embed.name]["table"][t % words], zero, zero)

        return go(tree)[1]

    return block, reference, examples


# ------------------------------------------- feed-forward attention (Composition)
def make_attention(dtype: str = "float32", seed: int = 0, n: int = 20, dim: int = 5):
    """Raffel & Ellis feed-forward attention, as in the Fold paper: a DAG."""
    score = fd.FC(1, activation=jnp.tanh)
    c = fd.Composition()
    with c.scope():
        seq = fd.Map(fd.Vector(dim, dtype)).reads(c.input)
        weights = fd.Map(fd.Function(score) >> fd.Function(lambda s: jnp.exp(s[:, 0]))).reads(seq)
        total = fd.Sum().reads(weights)
        weighted = fd.ZipWith(fd.Function(lambda x, w: x * w[:, None])).reads(seq, weights)
        context = fd.Sum().reads(weighted)
        c.output.reads(fd.Function(lambda num, den: num / den[:, None]).reads(context, total))
    rng = np.random.default_rng(seed)
    examples = [rng.normal(size=(int(k), dim)).tolist() for k in rng.integers(1, 10, n)]

    def reference(params: dict, xs: list) -> np.ndarray:
        p = np_params(params)[score.name]
        x = np.asarray(xs, np.float64)
        e = np.exp(np.tanh(x @ p["w"] + p["b"])[:, 0])
        return (e[:, None] * x).sum(0) / e.sum()

    return c, reference, examples


MODELS = {
    "rnn": make_rnn,
    "calculator": make_calculator,
    "tree_lstm": make_tree_lstm,
    "attention": make_attention,
}
