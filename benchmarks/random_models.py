"""Random well-typed models, each with an independent per-example reference.

``random_model(seed)`` draws a model from a small grammar over ``Map``, ``Fold``, ``RNN``,
``Reduce``, ``Sum``, ``Mean``, ``Max``, ``OneOf``, ``Record``, ``Concat``, ``Function``, ``FC``
(a layer drawn again for the same widths is shared), ``Embedding``, ``OneHot`` and recursion
(``ForwardDeclaration`` over binary and n-ary trees), together with a ``reference(params,
example)`` that evaluates one example at a time in plain ``jax.numpy``: it shares nothing with
fold's scheduler and executor (the recurrent cells' own ``apply`` runs on one row), so any
difference in outputs or gradients is a batching bug. ``wide`` models have 128-wide states, so
``backward="auto"`` saves their loop operations' matmuls as ``"save"`` does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

import fold as fd


class Spec(NamedTuple):
    """A block from the host object to a float32 vector, and how to check it."""

    block: fd.Block
    width: int
    reference: Callable[[dict, Any], jax.Array]  # (params, one example) -> [width]
    sample: Callable[[], Any]                     # draws one example
    text: str                                     # what it is, for failure messages


class RandomModel(NamedTuple):
    block: fd.Block
    reference: Callable[[dict, Any], jax.Array]
    examples: list
    text: str


def random_model(seed: int, n: int = 6, depth: int = 3, wide: bool = False) -> RandomModel:
    """A random model of at most ``depth`` nested productions and ``n`` examples for it."""
    grammar = _Grammar(np.random.default_rng(seed), wide)
    spec = grammar.expr(depth)
    return RandomModel(spec.block, spec.reference, [spec.sample() for _ in range(n)], spec.text)


def fc_reference(layer: fd.FC, x: jax.Array, p: dict) -> jax.Array:
    q = p[layer.name]
    y = x @ q["w"] + q["b"]
    return y if layer.activation is None else layer.activation(y)


def halve(layer: fd.FC, ys: list, p: dict) -> jax.Array:
    """``Reduce``'s halving rule over ``ys`` (at least one), combining with ``layer``."""
    if len(ys) == 1:
        return ys[0]
    h = len(ys) // 2
    return fc_reference(layer, jnp.concatenate([halve(layer, ys[:h], p), halve(layer, ys[h:], p)]), p)


class _Grammar:
    def __init__(self, rng: np.random.Generator, wide: bool):
        self.rng = rng
        self.state_widths = (128,) if wide else (3, 4, 6)
        self.fcs: dict = {}

    def pick(self, options: Any) -> Any:
        return options[int(self.rng.integers(len(options)))]

    def length(self, low: int = 0, high: int = 4) -> int:
        return int(self.rng.integers(low, high + 1))

    def fc(self, w_in: int, w_out: int) -> fd.FC:
        """An FC from ``w_in`` to ``w_out`` units: the one drawn before for these widths, half the time."""
        if (w_in, w_out) in self.fcs and self.rng.random() < 0.5:
            return self.fcs[(w_in, w_out)]
        layer = fd.FC(w_out, activation=jnp.tanh)
        self.fcs[(w_in, w_out)] = layer
        return layer

    def expr(self, depth: int, width: int | None = None) -> Spec:
        """A random production of at most ``depth`` levels; ``width`` forces its output width."""
        leaves = [self.vector, self.scalar, self.one_hot, self.embedding]
        inner = [self.dense, self.function, self.record, self.pool, self.fold, self.reduce, self.rnn, self.one_of,
                 self.tree]
        spec = self.pick(leaves)() if depth <= 0 else self.pick(inner)(depth - 1)
        return spec if width is None or spec.width == width else self.adapt(spec, width)

    # ---------------------------------------------------------------- leaves
    def vector(self) -> Spec:
        w, rng = int(self.rng.integers(1, 4)), self.rng
        return Spec(fd.Vector(w), w, lambda p, x: jnp.asarray(x, jnp.float32),
                    lambda: np.round(rng.normal(size=w), 3).tolist(), f"Vector({w})")

    def scalar(self) -> Spec:
        rng = self.rng
        block = fd.Scalar() >> fd.Function(lambda x: jnp.stack([x, 0.5 * x * x], axis=-1))
        return Spec(block, 2, lambda p, x: jnp.asarray([x, 0.5 * x * x], jnp.float32),
                    lambda: round(float(rng.normal()), 3), "Scalar>>[x,x²/2]")

    def one_hot(self) -> Spec:
        k, rng = int(self.rng.integers(2, 5)), self.rng
        return Spec(fd.OneHot(0, k), k, lambda p, x: jax.nn.one_hot(x, k, dtype=jnp.float32),
                    lambda: int(rng.integers(k)), f"OneHot({k})")

    def embedding(self) -> Spec:
        layer, rng = fd.Embedding(7, 3), self.rng
        return Spec(fd.Scalar("int32") >> fd.Function(layer), 3, lambda p, x: p[layer.name]["table"][x % 7],
                    lambda: int(rng.integers(-3, 12)), "Embedding(7,3)")

    # ----------------------------------------------------------------- inner
    def adapt(self, spec: Spec, width: int) -> Spec:
        layer = self.fc(spec.width, width)
        return Spec(spec.block >> fd.Function(layer), width,
                    lambda p, x: fc_reference(layer, spec.reference(p, x), p), spec.sample, f"{spec.text}>>FC({width})")

    def dense(self, depth: int) -> Spec:
        return self.adapt(self.expr(depth), self.pick((2, 3, 5)))

    def function(self, depth: int) -> Spec:
        sub = self.expr(depth)
        name, fn = self.pick((("sin", jnp.sin), ("square", lambda x: x * x), ("half", lambda x: 0.5 * x)))
        return Spec(sub.block >> fd.Function(fn), sub.width, lambda p, x: fn(sub.reference(p, x)), sub.sample,
                    f"{sub.text}>>{name}")

    def record(self, depth: int) -> Spec:
        a, b = self.expr(depth), self.expr(depth)
        return Spec(fd.Record((a.block, b.block)) >> fd.Concat(), a.width + b.width,
                    lambda p, x: jnp.concatenate([a.reference(p, x[0]), b.reference(p, x[1])]),
                    lambda: (a.sample(), b.sample()), f"Record({a.text}, {b.text})>>Concat")

    def pool(self, depth: int) -> Spec:
        sub = self.expr(depth)
        name, block, fn, low = self.pick((("Sum", fd.Sum, jnp.sum, 0), ("Mean", fd.Mean, jnp.mean, 0),
                                          ("Max", fd.Max, jnp.max, 1)))

        def reference(p: dict, xs: list) -> jax.Array:
            if not xs:
                return jnp.zeros(sub.width, jnp.float32)
            return fn(jnp.stack([sub.reference(p, x) for x in xs]), axis=0)

        return Spec(fd.Map(sub.block) >> block(), sub.width, reference,
                    lambda: [sub.sample() for _ in range(self.length(low))], f"Map({sub.text})>>{name}")

    def fold(self, depth: int) -> Spec:
        sub, s = self.expr(depth), self.pick(self.state_widths)
        layer = self.fc(s + sub.width, s)
        block = fd.Map(sub.block) >> fd.Fold(fd.Concat() >> fd.Function(layer), fd.Zeros(fd.TensorType((s,))))

        def reference(p: dict, xs: list) -> jax.Array:
            acc = jnp.zeros(s, jnp.float32)
            for x in xs:
                acc = fc_reference(layer, jnp.concatenate([acc, sub.reference(p, x)]), p)
            return acc

        return Spec(block, s, reference, lambda: [sub.sample() for _ in range(self.length(0, 5))],
                    f"Map({sub.text})>>Fold(FC({s}))")

    def reduce(self, depth: int) -> Spec:
        s = self.pick(self.state_widths)
        sub = self.expr(depth, s)
        layer = self.fc(2 * s, s)

        def reference(p: dict, xs: list) -> jax.Array:
            return halve(layer, [sub.reference(p, x) for x in xs], p) if xs else jnp.zeros(s, jnp.float32)

        return Spec(fd.Map(sub.block) >> fd.Reduce(fd.Concat() >> fd.Function(layer)), s, reference,
                    lambda: [sub.sample() for _ in range(self.length(0, 5))], f"Map({sub.text})>>Reduce(FC({s}))")

    def rnn(self, depth: int) -> Spec:
        sub, s = self.expr(depth), self.pick(self.state_widths)
        lstm = bool(self.rng.random() < 0.5)
        cell = fd.LSTMCell(s) if lstm else fd.GRUCell(s)
        block = fd.Map(sub.block) >> fd.RNN(cell) >> fd.GetItem(1)
        if lstm:
            block = block >> fd.GetItem(1)

        def reference(p: dict, xs: list) -> jax.Array:
            zero = jnp.zeros((1, s), jnp.float32)
            state = (zero, zero) if lstm else zero
            for x in xs:
                _, state = cell.apply(p[cell.name], sub.reference(p, x)[None], state)
            return (state[1] if lstm else state)[0]

        return Spec(block, s, reference, lambda: [sub.sample() for _ in range(self.length(0, 5))],
                    f"Map({sub.text})>>RNN({type(cell).__name__}({s}))")

    def one_of(self, depth: int) -> Spec:
        w = self.pick((2, 3, 4))
        cases = [self.expr(depth, w) for _ in range(int(self.rng.integers(2, 4)))]
        block = fd.OneOf(lambda x: x[0], {k: fd.GetItem(1) >> c.block for k, c in enumerate(cases)})

        def sample() -> tuple:
            k = int(self.rng.integers(len(cases)))
            return (k, cases[k].sample())

        return Spec(block, w, lambda p, x: cases[x[0]].reference(p, x[1]), sample,
                    f"OneOf({', '.join(c.text for c in cases)})")

    def tree(self, depth: int) -> Spec:
        """Binary (``Record`` of two subtrees) and n-ary (``Map`` then ``Sum`` or ``Reduce``) nodes over
        random leaves, both ending in an FC."""
        s = self.pick(self.state_widths)
        leaf = self.expr(depth, s)
        decl = fd.ForwardDeclaration(fd.PyObjectType(), fd.TensorType((s,)))
        pair, many = self.fc(2 * s, s), self.fc(s, s)
        reduce = bool(self.rng.random() < 0.5)
        combine = fd.Reduce(fd.Concat() >> fd.Function(pair)) if reduce else fd.Sum()
        decl.resolve_to(fd.OneOf(lambda t: t[0], {
            "leaf": fd.GetItem(1) >> leaf.block,
            "pair": fd.GetItem(1) >> fd.Record((decl(), decl())) >> fd.Concat() >> fd.Function(pair),
            "list": fd.GetItem(1) >> fd.Map(decl()) >> combine >> fd.Function(many),
        }))

        def go(p: dict, t: tuple) -> jax.Array:
            if t[0] == "leaf":
                return leaf.reference(p, t[1])
            if t[0] == "pair":
                return fc_reference(pair, jnp.concatenate([go(p, t[1][0]), go(p, t[1][1])]), p)
            kids = [go(p, k) for k in t[1]]
            pooled = halve(pair, kids, p) if reduce else jnp.sum(jnp.stack(kids), axis=0)
            return fc_reference(many, pooled, p)

        def grow(leaves: int) -> tuple:
            if leaves <= 1:
                return ("leaf", leaf.sample())
            if self.rng.random() < 0.6:
                r = int(self.rng.integers(1, leaves))
                return ("pair", (grow(r), grow(leaves - r)))
            k = int(self.rng.integers(1, min(leaves, 3) + 1))
            cuts = np.sort(self.rng.choice(np.arange(1, leaves), size=k - 1, replace=False)) if k > 1 else []
            sizes = np.diff(np.concatenate([[0], cuts, [leaves]])).tolist()
            return ("list", [grow(int(m)) for m in sizes])

        return Spec(decl(), s, go, lambda: grow(int(self.rng.integers(1, 7))),
                    f"Tree({s}, leaf={leaf.text}, {'Reduce' if reduce else 'Sum'})")


