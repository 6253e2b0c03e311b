"""Random well-typed models, each with an independent per-example reference.

``random_model(seed)`` draws a model from a small grammar over ``Map``, ``Fold``, ``RNN``,
``Reduce``, ``Sum``, ``Mean``, ``Max``, ``OneOf``, ``Record``, ``Concat``, ``Function``, ``FC``
(a layer drawn again for the same widths is shared), ``Embedding``, ``OneHot`` and recursion
(``ForwardDeclaration`` over binary and n-ary trees), together with a ``reference(params,
example)`` that evaluates one example at a time in plain ``jax.numpy``: it shares nothing with
fold's scheduler and executor (the recurrent cells' own ``apply`` runs on one row), so any
difference in outputs or gradients is a batching bug. ``wide`` models have 128-wide states, so
``backward="auto"`` saves their loop operations' matmuls as ``"save"`` does. ``users`` models add
the blocks users wire models with: ``Composition`` (a value read twice, a constant from
``FromTensor``), ``Metric`` (their references record the metrics' values too) and a layer
written as users write their own (``Gate``). ``every`` models add four blocks no other production
draws: ``Softmax`` (as attention weights), ``OneHotFromList``, ``Tensor`` of rank 2 and ``Void``
(a branch whose value is dropped, but which still runs). ``shared`` models (with all of these) make
their recursions ``Shared`` and their trees DAGs: a node may reuse a subtree grown before it in the
same example; the reference expands the DAG into a tree, computing a reused subtree again, and
records a metric once per distinct node, as fold does. ``decoders`` models add the generation
blocks in a static model (teacher forcing): a ``SequenceDecoder`` scoring a token list, or a
``TreeDecoder`` scoring a tree, from a start state drawn from the grammar, their parts layers
drawn as the grammar's are (shared between places); the reference scores each decision one
example at a time, and ``RandomModel.checks`` runs ``fd.Generator`` on each decoder with the
model's parameters against the per-example generator of ``benchmarks/random_decoders.py``.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

import fold as fd
from benchmarks.random_decoders import RandomDecoder, check_generation, score


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
    #: The model's metrics, by name: the width of their values.
    metrics: Mapping[str, int] = MappingProxyType({})
    #: ``evaluate(params, example) -> (output, {metric name: [values]})``; None: no metrics.
    evaluate: Callable[[dict, Any], tuple[jax.Array, dict[str, list]]] | None = None
    #: More checks of the model's parameters: ``fd.Generator`` on each decoder against its
    #: per-example reference (raise on a mismatch).
    checks: tuple[Callable[[dict], None], ...] = ()

    def reference_and_metrics(self, params: dict, example: Any) -> tuple[jax.Array, dict[str, list]]:
        """The reference's output on one example and its metrics' values (in no particular order)."""
        return (self.reference(params, example), {}) if self.evaluate is None else self.evaluate(params, example)


def random_model(seed: int, n: int = 6, depth: int = 3, wide: bool = False, rich: bool = False,
                 users: bool = False, every: bool = False, shared: bool = False,
                 decoders: bool = False) -> RandomModel:
    """A random model of at most ``depth`` nested productions and ``n`` examples for it.

    ``rich`` adds the productions over the rest of the blocks (``Zip``, ``ZipWith``,
    ``Broadcast``, ``NGrams``, ``Nth``, ``Slice``, ``Length``, ``Optional``, ``AllOf``,
    ``InputTransform``, ``Dropout``, ``Identity``, ``Min``), which the fuzzer uses; ``users`` adds
    ``Composition``, ``FromTensor``, ``Metric`` and a custom layer, and ``every`` (with both)
    ``Softmax``, ``OneHotFromList``, ``Tensor`` and ``Void``, ``shared`` (with all) DAG inputs to
    ``Shared`` recursions, and ``decoders`` (with all) generation blocks scoring known structures.
    Without them a seed draws the model it always drew (the benchmarks' seeds
    keep their models, a results file's seeds theirs)."""
    grammar = _Grammar(np.random.default_rng(seed), wide, rich, users, every, shared, decoders)
    # Every shared model is a recursion over DAGs, every decoders model a decoder (whatever their
    # leaves and start states hold).
    if shared:
        spec = grammar.tree(depth - 1)
    elif decoders:
        spec = grammar.pick((grammar.decoded_sequence, grammar.decoded_tree))(depth - 1)
    else:
        spec = grammar.expr(depth)

    def evaluate(params: dict, example: Any) -> tuple[jax.Array, dict[str, list]]:
        grammar.tape = {name: [] for name in grammar.metrics}
        try:
            return spec.reference(params, example), grammar.tape
        finally:
            grammar.tape = None

    return RandomModel(spec.block, spec.reference, [spec.sample() for _ in range(n)], spec.text,
                       dict(grammar.metrics), evaluate, tuple(grammar.checks))


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


class Gate(fd.Layer):
    """A layer written the way users write their own: two inputs, nested parameters, a gate
    between two projections, ``g * tanh(a·Wa) + (1 - g) * b·Wb`` with ``g = sigmoid([a, b]·Wg + c)``."""

    def __init__(self, units: int):
        super().__init__()
        self.units = units

    def init(self, key: jax.Array, input_type: fd.TupleType) -> dict:
        a, b = (t.shape[-1] for t in input_type)
        ka, kb, kg, kc = jax.random.split(key, 4)
        u = self.units

        def weights(k: jax.Array, n: int) -> jax.Array:
            return jax.random.normal(k, (n, u)) / np.sqrt(n)

        return {"proj": {"a": weights(ka, a), "b": weights(kb, b)},
                "gate": {"w": weights(kg, a + b), "c": 0.1 * jax.random.normal(kc, (u,))}}

    def apply(self, params: dict, a: jax.Array, b: jax.Array) -> jax.Array:
        g = jax.nn.sigmoid(jnp.concatenate([a, b], -1) @ params["gate"]["w"] + params["gate"]["c"])
        return g * jnp.tanh(a @ params["proj"]["a"]) + (1 - g) * (b @ params["proj"]["b"])


def _column() -> fd.Block:
    """A scalar as a width-1 vector."""
    return fd.Function(lambda x: x[:, None])


class _Grammar:
    def __init__(self, rng: np.random.Generator, wide: bool, rich: bool = False, users: bool = False,
                 every: bool = False, shared: bool = False, decoders: bool = False):
        self.rng = rng
        self.share = shared
        self.decoders = decoders
        self.checks: list[Callable[[dict], None]] = []  # RandomModel.checks
        self.rich = rich
        self.users = users
        self.every = every
        self.state_widths = (128,) if wide else (3, 4, 6)
        self.fcs: dict = {}
        self.gates: dict = {}
        self.metrics: dict[str, int] = {}
        # Where ``evaluate`` collects the metrics' values while a reference runs (None otherwise).
        self.tape: dict[str, list] | None = None

    def pick(self, options: Any) -> Any:
        return options[int(self.rng.integers(len(options)))]

    def length(self, low: int = 0, high: int = 4) -> int:
        return int(self.rng.integers(low, high + 1))

    def shared(self, layers: dict, key: Any, make: Callable[[], Any]) -> Any:
        """The layer ``layers`` holds for ``key`` half the time (so layers are shared between
        places), else a new one from ``make``, held from then on."""
        if key in layers and self.rng.random() < 0.5:
            return layers[key]
        layers[key] = make()
        return layers[key]

    def fc(self, w_in: int, w_out: int) -> fd.FC:
        """An FC from ``w_in`` to ``w_out`` units, shared with other places of these widths half the time."""
        return self.shared(self.fcs, (w_in, w_out), lambda: fd.FC(w_out, activation=jnp.tanh))

    def expr(self, depth: int, width: int | None = None) -> Spec:
        """A random production of at most ``depth`` levels; ``width`` forces its output width."""
        leaves = [self.vector, self.scalar, self.one_hot, self.embedding]
        inner = [self.dense, self.function, self.record, self.pool, self.fold, self.reduce, self.rnn, self.one_of,
                 self.tree]
        if self.rich:
            inner += [self.zip, self.broadcast, self.ngrams, self.nth, self.slice, self.sized, self.optional,
                      self.all_of, self.reversed_fold, self.passthrough]
        if self.users:
            inner += [self.composition, self.gated]
        if self.every:
            leaves += [self.listed, self.matrix]
            inner += [self.attention, self.voided]
        if self.decoders:
            inner += [self.decoded_sequence, self.decoded_tree]
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
        pools = (("Sum", fd.Sum, jnp.sum, 0), ("Mean", fd.Mean, jnp.mean, 0), ("Max", fd.Max, jnp.max, 1))
        if self.rich:
            pools += (("Min", fd.Min, jnp.min, 1),)
        name, block, fn, low = self.pick(pools)

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
        node = fd.OneOf(lambda t: t[0], {
            "leaf": fd.GetItem(1) >> leaf.block,
            "pair": fd.GetItem(1) >> fd.Record((decl(), decl())) >> fd.Concat() >> fd.Function(pair),
            "list": fd.GetItem(1) >> fd.Map(decl()) >> combine >> fd.Function(many),
        })
        decl.resolve_to(fd.Shared(node) if self.share else node)

        def go(p: dict, t: tuple, seen: dict[int, tuple]) -> jax.Array:
            # A metric inside records once per distinct node: a node met again repeats its work
            # with the metrics' tape detached.
            tape = self.tape
            if self.share and id(t) in seen:
                self.tape = None
            try:
                return node_value(p, t, seen)
            finally:
                self.tape = tape
                seen[id(t)] = t

        def node_value(p: dict, t: tuple, seen: dict[int, tuple]) -> jax.Array:
            if t[0] == "leaf":
                return leaf.reference(p, t[1])
            if t[0] == "pair":
                return fc_reference(pair, jnp.concatenate([go(p, t[1][0], seen), go(p, t[1][1], seen)]), p)
            kids = [go(p, k, seen) for k in t[1]]
            pooled = halve(pair, kids, p) if reduce else jnp.sum(jnp.stack(kids), axis=0)
            return fc_reference(many, pooled, p)

        def grow(leaves: int, grown: list[tuple]) -> tuple:
            if self.share and grown and self.rng.random() < 0.3:
                return grown[int(self.rng.integers(len(grown)))]  # a subtree of this example, reached again
            if leaves <= 1:
                t: tuple = ("leaf", leaf.sample())
            elif self.rng.random() < 0.6:
                r = int(self.rng.integers(1, leaves))
                t = ("pair", (grow(r, grown), grow(leaves - r, grown)))
            else:
                k = int(self.rng.integers(1, min(leaves, 3) + 1))
                cuts = np.sort(self.rng.choice(np.arange(1, leaves), size=k - 1, replace=False)) if k > 1 else []
                sizes = np.diff(np.concatenate([[0], cuts, [leaves]])).tolist()
                t = ("list", [grow(int(m), grown) for m in sizes])
            grown.append(t)
            return t

        return Spec(decl(), s, lambda p, t: go(p, t, {}), lambda: grow(int(self.rng.integers(1, 7)), []),
                    f"{'Shared' if self.share else ''}Tree({s}, leaf={leaf.text}, {'Reduce' if reduce else 'Sum'})")

    # --------------------------------------------------- rich productions
    def _seq(self, sub: Spec, low: int = 0, high: int = 4) -> Callable[[], list]:
        return lambda: [sub.sample() for _ in range(self.length(low, high))]

    def zip(self, depth: int) -> Spec:
        """Two sequences zipped (shortest wins), each pair concatenated (``ZipWith`` half the time)
        and summed."""
        a, b = self.expr(depth), self.expr(depth)
        w = a.width + b.width
        with_fn = bool(self.rng.random() < 0.5)
        zipped = fd.ZipWith(fd.Concat()) if with_fn else fd.Zip() >> fd.Map(fd.Concat())
        block = fd.Record((fd.Map(a.block), fd.Map(b.block))) >> zipped >> fd.Sum()

        def reference(p: dict, x: tuple) -> jax.Array:
            # Both maps run on every item (their metrics record all of them); zip drops the longer's tail.
            ys, zs = [a.reference(p, i) for i in x[0]], [b.reference(p, j) for j in x[1]]
            pairs = [jnp.concatenate([y, z]) for y, z in zip(ys, zs)]
            return jnp.sum(jnp.stack(pairs), axis=0) if pairs else jnp.zeros(w, jnp.float32)

        return Spec(block, w, reference, lambda: (self._seq(a)(), self._seq(b)()),
                    f"{'ZipWith' if with_fn else 'Zip'}(Map({a.text}), Map({b.text}))>>Sum")

    def broadcast(self, depth: int) -> Spec:
        """Every item of a sequence paired with one broadcast value, through an FC, summed."""
        a, b = self.expr(depth), self.expr(depth)
        w = self.pick((2, 3))
        layer = self.fc(a.width + b.width, w)
        block = (fd.Record((fd.Map(a.block), b.block >> fd.Broadcast())) >> fd.Zip()
                 >> fd.Map(fd.Concat() >> fd.Function(layer)) >> fd.Sum())

        def reference(p: dict, x: tuple) -> jax.Array:
            other = b.reference(p, x[1])
            ys = [fc_reference(layer, jnp.concatenate([a.reference(p, i), other]), p) for i in x[0]]
            return jnp.sum(jnp.stack(ys), axis=0) if ys else jnp.zeros(w, jnp.float32)

        return Spec(block, w, reference, lambda: (self._seq(a)(), b.sample()),
                    f"Zip(Map({a.text}), Broadcast({b.text}))>>Map(FC({w}))>>Sum")

    def ngrams(self, depth: int) -> Spec:
        sub = self.expr(depth)
        n = self.pick((2, 3))
        w = n * sub.width
        block = fd.Map(sub.block) >> fd.NGrams(n) >> fd.Map(fd.Concat()) >> fd.Sum()

        def reference(p: dict, xs: list) -> jax.Array:
            ys = [sub.reference(p, x) for x in xs]
            grams = [jnp.concatenate(ys[i:i + n]) for i in range(len(ys) - n + 1)]
            return jnp.sum(jnp.stack(grams), axis=0) if grams else jnp.zeros(w, jnp.float32)

        return Spec(block, w, reference, self._seq(sub, 0, 5), f"Map({sub.text})>>NGrams({n})>>Sum")

    def nth(self, depth: int) -> Spec:
        sub = self.expr(depth)
        block = fd.Record((fd.Map(sub.block), fd.Identity())) >> fd.Nth()

        def sample() -> tuple:
            xs = self._seq(sub, 1, 4)()
            return (xs, int(self.rng.integers(len(xs))))

        def reference(p: dict, x: tuple) -> jax.Array:
            return [sub.reference(p, item) for item in x[0]][x[1]]  # the map runs on every item

        return Spec(block, sub.width, reference, sample, f"Nth(Map({sub.text}))")

    def slice(self, depth: int) -> Spec:
        sub = self.expr(depth)
        start, stop = self.pick((None, 1)), self.pick((None, 2, -1))
        block = fd.Slice(start=start, stop=stop) >> fd.Map(sub.block) >> fd.Sum()

        def reference(p: dict, xs: list) -> jax.Array:
            ys = [sub.reference(p, x) for x in xs[start:stop]]
            return jnp.sum(jnp.stack(ys), axis=0) if ys else jnp.zeros(sub.width, jnp.float32)

        return Spec(block, sub.width, reference, self._seq(sub), f"Slice({start}:{stop})>>Map({sub.text})>>Sum")

    def sized(self, depth: int) -> Spec:
        """The length of a sequence beside its sum (a length carries no gradient)."""
        sub = self.expr(depth)
        block = (fd.Map(sub.block) >> fd.AllOf(fd.Length() >> fd.Function(lambda n: n[:, None]), fd.Sum())
                 >> fd.Concat())

        def reference(p: dict, xs: list) -> jax.Array:
            total = jnp.sum(jnp.stack([sub.reference(p, x) for x in xs]), axis=0) if xs else jnp.zeros(sub.width)
            return jnp.concatenate([jnp.asarray([len(xs)], jnp.float32), total])

        return Spec(block, sub.width + 1, reference, self._seq(sub), f"Map({sub.text})>>[Length, Sum]")

    def optional(self, depth: int) -> Spec:
        sub = self.expr(depth)
        return Spec(fd.Optional(sub.block), sub.width,
                    lambda p, x: jnp.zeros(sub.width, jnp.float32) if x is None else sub.reference(p, x),
                    lambda: None if self.rng.random() < 0.3 else sub.sample(), f"Optional({sub.text})")

    def all_of(self, depth: int) -> Spec:
        a, b = self.expr(depth), self.expr(depth)
        block = fd.AllOf(fd.GetItem(0) >> a.block, fd.GetItem(1) >> b.block) >> fd.Concat()
        return Spec(block, a.width + b.width,
                    lambda p, x: jnp.concatenate([a.reference(p, x[0]), b.reference(p, x[1])]),
                    lambda: (a.sample(), b.sample()), f"AllOf({a.text}, {b.text})>>Concat")

    def reversed_fold(self, depth: int) -> Spec:
        """A ``Fold`` over the reversed sequence (``InputTransform`` on the host): order matters."""
        sub, s = self.expr(depth), self.pick(self.state_widths)
        layer = self.fc(s + sub.width, s)
        block = (fd.InputTransform(lambda xs: list(reversed(xs))) >> fd.Map(sub.block)
                 >> fd.Fold(fd.Concat() >> fd.Function(layer), fd.Zeros(fd.TensorType((s,)))))

        def reference(p: dict, xs: list) -> jax.Array:
            acc = jnp.zeros(s, jnp.float32)
            for x in reversed(xs):
                acc = fc_reference(layer, jnp.concatenate([acc, sub.reference(p, x)]), p)
            return acc

        return Spec(block, s, reference, self._seq(sub, 0, 5), f"Reversed>>Map({sub.text})>>Fold(FC({s}))")

    def passthrough(self, depth: int) -> Spec:
        """``Identity`` and ``Dropout`` (deterministic without a key) change nothing."""
        sub = self.expr(depth)
        return Spec(sub.block >> fd.Identity() >> fd.Dropout(0.5), sub.width, sub.reference, sub.sample,
                    f"{sub.text}>>Identity>>Dropout")

    # -------------------------------------------------- users' productions
    def metric(self, width: int) -> str:
        """A metric name for values of ``width``: half the time one drawn before for that width,
        so that a metric collects from several places."""
        same = [name for name, w in self.metrics.items() if w == width]
        if same and self.rng.random() < 0.5:
            return self.pick(same)
        name = f"m{len(self.metrics)}"
        self.metrics[name] = width
        return name

    def composition(self, depth: int) -> Spec:
        """A ``Composition`` wired as users wire one: two children read the input's items, an FC
        reads both, a ``Metric`` records its value, and the output concatenates the FC's value,
        the first child's again (read twice) and a ``FromTensor`` constant."""
        a, b = self.expr(depth), self.expr(depth)
        w = self.pick((2, 3))
        layer = self.fc(a.width + b.width, w)
        name = self.metric(w)
        constant = np.round(self.rng.normal(size=2), 3).astype(np.float32)
        c = fd.Composition()
        with c.scope():
            ya = a.block.reads(c.input[0])
            yb = b.block.reads(c.input[1])
            h = (fd.Concat() >> fd.Function(layer)).reads(ya, yb)
            fd.Metric(name).reads(h)
            c.output.reads(fd.Concat().reads(h, ya, fd.FromTensor(constant)))

        def reference(p: dict, x: tuple) -> jax.Array:
            first = a.reference(p, x[0])
            value = fc_reference(layer, jnp.concatenate([first, b.reference(p, x[1])]), p)
            if self.tape is not None:
                self.tape[name].append(value)
            return jnp.concatenate([value, first, jnp.asarray(constant)])

        return Spec(c, w + a.width + 2, reference, lambda: (a.sample(), b.sample()),
                    f"Composition({a.text}, {b.text}, FC({w}), Metric({name}), FromTensor)")

    def gated(self, depth: int) -> Spec:
        """A ``Record`` piped straight into a custom layer (``Gate``; the one drawn before for the
        same widths, half the time)."""
        a, b = self.expr(depth), self.expr(depth)
        w = self.pick((2, 3, 4))
        layer = self.shared(self.gates, (a.width, b.width, w), lambda: Gate(w))

        def reference(p: dict, x: tuple) -> jax.Array:  # the layer's own apply on one row, as ``rnn``'s cells
            return layer.apply(p[layer.name], a.reference(p, x[0])[None], b.reference(p, x[1])[None])[0]

        return Spec(fd.Record((a.block, b.block)) >> layer, w, reference, lambda: (a.sample(), b.sample()),
                    f"Gate({a.text}, {b.text}, {w})")

    # ------------------------------------------------ every's productions
    def listed(self) -> Spec:
        elements, rng = ("a", "b", "c", "d")[: int(self.rng.integers(2, 5))], self.rng
        k = len(elements)
        return Spec(fd.OneHotFromList(elements), k,
                    lambda p, x: jax.nn.one_hot(elements.index(x), k, dtype=jnp.float32),
                    lambda: elements[int(rng.integers(k))], f"OneHotFromList({k})")

    def matrix(self) -> Spec:
        """A rank-2 ``Tensor``, flattened by a ``Function``."""
        c, rng = int(self.rng.integers(1, 3)), self.rng
        return Spec(fd.Tensor((2, c)) >> fd.Function(lambda x: x.reshape(x.shape[0], 2 * c)), 2 * c,
                    lambda p, x: jnp.asarray(x, jnp.float32).reshape(2 * c),
                    lambda: np.round(rng.normal(size=(2, c)), 3).tolist(), f"Tensor(2,{c})>>flatten")

    def attention(self, depth: int) -> Spec:
        """A sequence weighted by its own ``Softmax`` (entry by entry, across the items) and summed."""
        sub = self.expr(depth)
        block = (fd.Map(sub.block) >> fd.AllOf(fd.Identity(), fd.Softmax()) >> fd.Zip()
                 >> fd.Map(fd.Function(lambda x, w: x * w)) >> fd.Sum())

        def reference(p: dict, xs: list) -> jax.Array:
            if not xs:
                return jnp.zeros(sub.width, jnp.float32)
            ys = jnp.stack([sub.reference(p, x) for x in xs])
            return jnp.sum(ys * jax.nn.softmax(ys, axis=0), axis=0)

        return Spec(block, sub.width, reference, self._seq(sub), f"Map({sub.text})>>Softmax-weighted Sum")

    def decoded_sequence(self, depth: int) -> Spec:
        """A ``SequenceDecoder`` scoring a token list from a start state (teacher forcing); its
        output is the summed log-probability."""
        w, vocab, e = self.pick((2, 3, 4)), int(self.rng.integers(2, 6)), int(self.rng.integers(1, 4))
        end = int(self.rng.integers(vocab))
        start, emb = self.expr(depth, w), fd.Embedding(vocab, e)
        cell, out = self.fc(w + e, w), self.fc(w, vocab)
        step = fd.Record((fd.Identity(), emb)) >> fd.Concat() >> fd.Function(cell)
        decoder = fd.SequenceDecoder(step, fd.Function(out), end_token=end, max_length=8)
        block = fd.Record((start.block, fd.Map(fd.Scalar("int32")))) >> decoder >> fd.Sum() >> _column()

        def step_row(p: dict, state: jax.Array, token: int) -> jax.Array:
            return fc_reference(cell, jnp.concatenate([state, p[emb.name]["table"][token]]), p)[None]

        m = self._decoder(decoder, step_row, {"out": lambda p, state: fc_reference(out, state, p)}, w,
                          f"SequenceDecoder({start.text}, vocab={vocab}, end={end})")

        def sample() -> tuple:
            return start.sample(), [int(self.rng.integers(vocab)) for _ in range(self.length(0, 4))]

        return Spec(block, 1, lambda p, x: score(m, p, start.reference(p, x[0]), x[1])[None], sample, m.text)

    def decoded_tree(self, depth: int) -> Spec:
        """A ``TreeDecoder`` scoring a tree (labels at its leaves) from a start state; its output is
        the summed log-probability of every decision."""
        w, labels = self.pick((2, 3, 4)), int(self.rng.integers(2, 5))
        arities = (0, 2) if self.rng.random() < 0.5 else (0, 1, 2)
        start = self.expr(depth, w)
        child, arity, label = self.fc(2 * w, w), self.fc(w, len(arities)), self.fc(w, labels)
        decoder = fd.TreeDecoder(fd.Concat() >> fd.Function(child), fd.Function(arity), fd.Function(label),
                                 arities=arities, max_levels=4, max_nodes=15)
        block = fd.Record((start.block, fd.Identity())) >> decoder >> fd.Sum() >> _column()

        def step_row(p: dict, parent: jax.Array, sibling: jax.Array) -> jax.Array:
            return fc_reference(child, jnp.concatenate([parent, sibling]), p)[None]

        heads = {"arity": lambda p, state: fc_reference(arity, state, p),
                 "label": lambda p, state: fc_reference(label, state, p)}
        m = self._decoder(decoder, step_row, heads, w,
                          f"TreeDecoder({start.text}, arities={arities}, labels={labels})")

        def grow(levels: int) -> Any:
            k = 0 if levels == 0 else arities[int(self.rng.integers(len(arities)))]
            return int(self.rng.integers(labels)) if k == 0 else tuple(grow(levels - 1) for _ in range(k))

        return Spec(block, 1, lambda p, x: score(m, p, start.reference(p, x[0]), x[1])[None],
                    lambda: (start.sample(), grow(int(self.rng.integers(0, 4)))), m.text)

    def _decoder(self, decoder: fd.SequenceDecoder | fd.TreeDecoder, step: Callable[..., jax.Array],
                 heads: dict[str, Callable[[dict, jax.Array], jax.Array]], width: int, text: str) -> RandomDecoder:
        """``decoder`` with its per-example reference (``benchmarks/random_decoders.py``'s), and a check
        added: ``fd.Generator(decoder)`` from random start states, greedy and sampled, against it."""
        seed = zlib.crc32(text.encode())  # not from ``self.rng``: the seed's model stays the one it drew
        m = RandomDecoder(decoder, fd.TensorType((width,)), step, heads, False, width, text, {})

        def check(params: dict) -> None:
            starts = (1.5 * np.random.default_rng(seed).normal(size=(4, width))).astype(np.float32)
            generator = fd.Generator(decoder)
            for key in (None, jax.random.key(seed)):
                check_generation(m, generator, params, starts, key, f"generation of {text}")

        self.checks.append(check)
        return m

    def voided(self, depth: int) -> Spec:
        """``AllOf`` of two branches, the second ending in ``Void``: only the first's value is
        used, but the second runs (its metrics record)."""
        a, b = self.expr(depth), self.expr(depth)
        block = fd.AllOf(fd.GetItem(0) >> a.block, fd.GetItem(1) >> b.block >> fd.Void()) >> fd.GetItem(0)

        def reference(p: dict, x: tuple) -> jax.Array:
            b.reference(p, x[1])
            return a.reference(p, x[0])

        return Spec(block, a.width, reference, lambda: (a.sample(), b.sample()), f"AllOf({a.text}, Void({b.text}))[0]")
