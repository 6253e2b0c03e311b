"""Blocks over sequences: ``Map``, ``Fold``, ``RNN``, ``Reduce`` and friends.

A sequence input may be a ``SequenceType`` value (a list on the host) or a
PyObject that is iterable (each element a PyObject).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from numpy.typing import DTypeLike

from fold.blocks.base import Block, Repeat, run_leaf, set_child, unify
from fold.blocks.host import BlockLike, EmitContext, HostContext, HostValue, HostWalk
from fold.blocks.inputs import Identity, Zeros, to_array
from fold.blocks.layers import Layer
from fold.blocks.plumbing import AllOf, Pipe
from fold.blocks.tensors import Function
from fold.blocks.types import (
    BroadcastSequenceType,
    PyObjectType,
    SequenceType,
    TensorType,
    TupleType,
    Type,
    VoidType,
    convert_to_type,
    requested_dtype,
    tensor_types,
)
from fold.errors import type_error, whole

__all__ = ["Map", "Fold", "RNN", "Reduce", "Sum", "Min", "Max", "Mean", "Softmax", "Broadcast", "Zip",
           "ZipWith", "NGrams", "Nth", "Length"]


def _element_type(block: Block, t: Type) -> Type:
    """The element type of a sequence, or of a tuple whose items all have one type (as in Fold)."""
    if isinstance(t, PyObjectType):
        return t
    if isinstance(t, SequenceType):
        return t.element_type
    if isinstance(t, TupleType) and len(t) > 0:
        if len(set(t)) != 1:
            raise TypeError(f"{block!r} takes a sequence or a tuple of items of one type, not {t}")
        return t[0]
    raise TypeError(f"{block!r} takes a sequence or a non-empty tuple, not {t}")


def _as_list(block: Block, x: HostValue, ctx: HostContext) -> list[HostValue]:
    if isinstance(x, list):
        return x
    if isinstance(x, Repeat):
        raise TypeError(f"{block!r} cannot iterate over an endless broadcast sequence")
    if x is None or isinstance(x, (int, float)):
        raise TypeError(f"{block!r} expected a sequence, got {x!r}")
    # Iterating would silently give a dict's keys, or a set's elements in an order that varies
    # between runs (string hashing is randomised).
    if isinstance(x, (dict, set, frozenset)):
        hint = " (for its values or items, put GetItem or InputTransform(lambda d: list(d.items())) before it)" \
            if isinstance(x, dict) else " (its order varies between runs: give a list, e.g. sorted(...))"
        raise TypeError(f"{block!r} expected a sequence, got a {type(x).__name__}{hint}")
    limit = ctx.limits.max_nodes
    if isinstance(x, jax.Array):
        # One transfer, not a device slice per item. A traced value raises here, for the walk to
        # say to build batches outside jit.
        x = np.asarray(x)
    try:
        if hasattr(x, "__len__"):
            return list(x)
        # An iterator may never end: read at most as many items as an example may have operation calls.
        items = list(itertools.islice(x, limit + 1))
    except TypeError:
        raise TypeError(f"{block!r} expected a sequence, got {type(x).__name__}") from None
    if len(items) > limit:
        raise ValueError(f"{block!r} read more than {limit:,} items from a {type(x).__name__} (an endless iterator?): "
                         "raise the limit with Compiler.create(max_example_nodes=...) if it is meant to be this long")
    return items


def _finite(block: Block, t: Type) -> None:
    if isinstance(t, BroadcastSequenceType):
        raise TypeError(f"{block!r} needs a finite sequence, not {t}")
    _element_type(block, t)


class Map(Block):
    """Applies ``elem_block`` to every element: ``[f(x) for x in xs]``.

    Examples:
        >>> import fold as fd
        >>> [float(v) for v in fd.Map(fd.Scalar()).eval([1, 2])]
        [1.0, 2.0]
    """

    def __init__(self, elem_block: BlockLike, name: str | None = None):
        super().__init__(name)
        self.element_block = self._adopt(elem_block)

    def children(self) -> list[Block]:
        return [self.element_block]

    def _check_input(self, t: Type) -> None:
        _element_type(self, t)

    def _check_output(self, t: Type) -> None:
        if not isinstance(t, (SequenceType, PyObjectType)):
            raise TypeError(f"{self!r} outputs a sequence, not {t}")

    def _infer(self) -> None:
        elem = getattr(self, "element_block", None)
        if elem is None:
            return
        t = self.input_type
        if t is not None:
            set_child(self, _element_type(self, t), elem, "input", "elements")
        elif elem.input_type is not None:
            # A sequence of PyObjects is itself just a PyObject.
            self.set_input_type(SequenceType(elem.input_type))
        if elem.output_type is not None and self.input_type is not None:
            kind = BroadcastSequenceType if isinstance(self.input_type, BroadcastSequenceType) else SequenceType
            # A sequence of PyObjects is a PyObject (``Map(InputTransform(f))``), as in Fold.
            set_child(self, convert_to_type(kind(elem.output_type)), self, "output", "output")
        elif isinstance(self.output_type, SequenceType):
            set_child(self, self.output_type.element_type, elem, "output", "elements")

    def _host(self, x: HostValue, ctx: HostContext) -> HostWalk:
        if isinstance(x, Repeat):
            return Repeat((yield self.element_block, x.value, "Map[*]"))
        out = []
        elem = self.element_block
        if elem._leaf:
            for i, v in enumerate(_as_list(self, x, ctx)):
                out.append(run_leaf(elem, v, ctx, ("Map[{}]", i)))
            return out
        for i, v in enumerate(_as_list(self, x, ctx)):
            out.append((yield elem, v, ("Map[{}]", i)))
        return out

    def _emit(self, em: EmitContext, x: str) -> str:
        out = em.var("seq")
        em.over_list(self, x, out, lambda: "[]", lambda e: f"{out}.append({em.emit(self.element_block, e)})")
        return out


def _void_input(owner: Block, child: Block) -> None:
    set_child(owner, VoidType(), child, "input", "a void input")


class Fold(Block):
    """Left fold: ``combine_block((... combine_block((start, x0), x1) ...), xn)``.

    ``start_block`` gets a void input; ``combine_block`` takes
    ``(accumulator, element)``. Over n elements the depth is n.
    """

    def __init__(self, combine_block: BlockLike, start_block: BlockLike, name: str | None = None):
        super().__init__(name)
        self.combine_block = self._adopt(combine_block)
        self.start_block = self._adopt(start_block)
        _void_input(self, self.start_block)

    def children(self) -> list[Block]:
        return [self.combine_block, self.start_block]

    def _check_input(self, t: Type) -> None:
        _finite(self, t)

    def _infer(self) -> None:
        unify(self.start_block, "output", self, "output")
        unify(self.combine_block, "output", self, "output")
        acc = self.output_type
        if acc is not None and self.input_type is not None:
            set_child(self, TupleType(acc, _element_type(self, self.input_type)), self.combine_block,
                       "input", "(accumulator, element)")

    def _host(self, x: HostValue, ctx: HostContext) -> HostWalk:
        xs = _as_list(self, x, ctx)
        acc = yield self.start_block, None, "Fold[start]"
        for i, v in enumerate(xs):
            acc = yield self.combine_block, (acc, v), f"Fold[{i}]"
        return acc

    def _emit(self, em: EmitContext, x: str) -> str:
        acc = em.var("acc")
        em.over_list(self, x, acc, lambda: em.emit(self.start_block, "None"),
                     lambda e: f"{acc} = {em.emit(self.combine_block, f'({acc}, {e})')}")
        return acc


def _with_dtype(t: Type, dtype: str) -> Type:
    if isinstance(t, TensorType):
        return TensorType(t.shape, dtype)
    if isinstance(t, TupleType):
        return TupleType(*[_with_dtype(i, dtype) for i in t])
    return t


class RNN(Block):
    """Runs ``cell`` over a sequence: ``(outputs, final_state)``.

    The cell takes ``(element, state)`` and returns ``(output, state)``. The
    input is the sequence, or ``(sequence, initial_state)`` when
    ``initial_state_from_input``; otherwise the state starts from
    ``initial_state`` (a block or array) or zeros of the cell's state type.
    """

    def __init__(self, cell: BlockLike, initial_state: BlockLike = None, initial_state_from_input: bool = False,
                 name: str | None = None):
        if initial_state_from_input and initial_state is not None:
            raise ValueError("RNN: pass initial_state or initial_state_from_input=True, not both")
        super().__init__(name)
        self._cell_layer = cell if isinstance(cell, Layer) else None
        self.cell = self._adopt(cell)
        self.from_input = initial_state_from_input
        self.initial_state = None if initial_state is None else self._adopt(initial_state)
        if self.initial_state is not None:
            _void_input(self, self.initial_state)

    def children(self) -> list[Block]:
        return [b for b in (self.cell, self.initial_state) if b is not None]

    def _check_input(self, t: Type) -> None:
        if self.from_input:
            if not isinstance(t, TupleType) or len(t) != 2:
                raise TypeError(f"{self!r} with initial_state_from_input takes (sequence, state), not {t}")
            _finite(self, t[0])
        else:
            _finite(self, t)

    def _state_type(self) -> Type | None:
        if self.from_input:
            return self.input_type[1] if isinstance(self.input_type, TupleType) else None
        if self.initial_state is not None:
            return self.initial_state.output_type
        out = self.cell.output_type
        if isinstance(out, TupleType) and len(out) == 2:
            return out[1]
        return None

    def untyped_hint(self) -> str | None:
        if self.output_type is not None or self.from_input or self._state_type() is not None:
            return None
        return (f"{self!r} cannot infer its state type: its cell {self.cell!r} declares none (a layer with a "
                "state_type, such as LSTMCell, does). Pass initial_state=fd.Zeros(state type), e.g. "
                "fd.Zeros(((8,), (8,))) for an LSTM state (c, h) of 8 units, or initial_state_from_input=True")

    def _infer(self) -> None:
        t = self.input_type
        seq = (t[0] if isinstance(t, TupleType) else None) if self.from_input else t
        elem = _element_type(self, seq) if seq is not None else None
        leaves = tensor_types(elem)
        if (not self.from_input and self.initial_state is None and leaves
                and hasattr(self._cell_layer, "state_type")):
            zero = _with_dtype(self._cell_layer.state_type, leaves[0].dtype)  # type: ignore[union-attr]
            self.initial_state = self._adopt(Zeros(zero))
            _void_input(self, self.initial_state)
        state = self._state_type()
        if elem is not None and state is not None:
            set_child(self, TupleType(elem, state), self.cell, "input", "(element, state)")
        out = self.cell.output_type
        if isinstance(out, TupleType) and len(out) == 2:
            if state is not None and out[1] != state:
                raise type_error(self.cell, out[1], self, state, "returns state of type", "state type")
            set_child(self, TupleType(SequenceType(out[0]), out[1]), self, "output", "output")

    def _host(self, x: HostValue, ctx: HostContext) -> HostWalk:
        if self.from_input:
            if not isinstance(x, tuple) or len(x) != 2:
                raise TypeError(f"{self!r} expected (sequence, state), got {x!r}")
            seq, state = x
        else:
            seq = x
            assert self.initial_state is not None  # without one, the state comes from the input
            state = yield self.initial_state, None, "RNN[initial_state]"
        outs = []
        for i, v in enumerate(_as_list(self, seq, ctx)):
            out, state = yield self.cell, (v, state), f"RNN[{i}]"
            outs.append(out)
        return outs, state

    def _emit(self, em: EmitContext, x: str) -> str:
        if self.from_input:
            return em.walk(self, x)
        initial = self.initial_state
        assert initial is not None  # set by _infer, which a compiled model has run
        out, state, outs = em.var("rnn"), em.var("state"), em.var("outs")

        def loop() -> None:
            em.line(f"{state} = {em.emit(initial, 'None')}")
            em.line(f"{outs} = []")
            e = em.var("e")
            em.line(f"for {e} in {x}:")
            with em.nested():
                y = em.emit(self.cell, em.tuple([e, state]))
                em.line(f"{outs}.append({em.item(y, 0)})")
                em.line(f"{state} = {em.item(y, 1)}")
            em.line(f"{out} = ({outs}, {state})")

        # The walk takes anything but a list (and raises on what is not a sequence).
        em.branches([(f"type({x}) is not list", lambda: em.line(f"{out} = {em.walk(self, x)}")), (None, loop)])
        return out


class Reduce(Block):
    """Combines a sequence as a balanced tree (depth ceil(log2 n)).

    ``Reduce(g)([x1..xn]) = g(Reduce([x1..x_{n//2}]), Reduce([x_{n//2+1}..xn]))``;
    an empty sequence gives ``default_block`` (zeros if None).
    """

    def __init__(self, combine_block: BlockLike, default_block: BlockLike = None, name: str | None = None):
        super().__init__(name)
        self.combine_block = self._adopt(combine_block)
        self.default_block = None if default_block is None else self._adopt(default_block)
        if self.default_block is not None:
            _void_input(self, self.default_block)

    def children(self) -> list[Block]:
        return [b for b in (self.combine_block, self.default_block) if b is not None]

    def _check_input(self, t: Type) -> None:
        _finite(self, t)

    def _infer(self) -> None:
        if self.input_type is not None:
            elem = _element_type(self, self.input_type)
            if not isinstance(elem, PyObjectType):
                set_child(self, elem, self, "output", "output")
                set_child(self, TupleType(elem, elem), self.combine_block, "input", "pairs of elements")
        unify(self.combine_block, "output", self, "output")
        if self.output_type is not None:
            if self.default_block is None:
                self.default_block = self._adopt(Zeros(self.output_type))
                _void_input(self, self.default_block)
            unify(self.default_block, "output", self, "output")

    def _reduce(self, xs: list[HostValue]) -> HostWalk:
        if len(xs) == 1:
            return xs[0]
        half = len(xs) // 2
        left = yield from self._reduce(xs[:half])
        right = yield from self._reduce(xs[half:])
        return (yield self.combine_block, (left, right), "Reduce")

    def _host(self, x: HostValue, ctx: HostContext) -> HostWalk:
        xs = _as_list(self, x, ctx)
        if not xs:
            assert self.default_block is not None  # made by _infer, which every compiled model ran
            return (yield self.default_block, None, "Reduce[default]")
        return (yield from self._reduce(xs))

    def _emit(self, em: EmitContext, x: str) -> str:
        # A list reduces through ``_balanced`` calling the combine block's generated function, in
        # ``_reduce``'s order; anything else (a tuple, a malformed input) takes the generic walk.
        out = em.var("red")
        assert self.default_block is not None  # made by _infer, which every compiled model ran
        default = self.default_block

        def reduce_list() -> None:
            combine = em.function(self.combine_block)
            em.branches([(f"not {x}", lambda: em.line(f"{out} = {em.emit(default, 'None')}")),
                         (None, lambda: em.line(f"{out} = {em.bind(_balanced, 'balanced')}({x}, {combine}, depth)"))])

        em.branches([(f"type({x}) is not list", lambda: em.line(f"{out} = {em.walk(self, x)}")), (None, reduce_list)])
        return out


def _balanced(xs: list[HostValue], combine: Callable[[HostValue, int], HostValue], depth: int) -> HostValue:
    """``Reduce``'s balanced tree over ``xs`` in the host plan: the left half, the right half, then
    their combination, as ``Reduce._reduce`` walks it."""
    if len(xs) == 1:
        return xs[0]
    half = len(xs) // 2
    left = _balanced(xs[:half], combine, depth)
    return combine((left, _balanced(xs[half:], combine, depth)), depth)


class Sum(Reduce):
    """Sums a sequence of tensors (zeros if empty): ``Reduce`` with ``add``."""

    def __init__(self, name: str | None = None):
        super().__init__(Function(jnp.add), name=name)


class Min(Reduce):
    """Element-wise minimum of a sequence of tensors (zeros if empty).

    Where items tie exactly, the gradient is shared as ``jnp.minimum`` shares it, half to each
    side of every pairwise tie in the balanced reduction tree (``[a, b, c]`` reduces as ``a``
    against ``(b, c)``: 1/2, 1/4, 1/4), not equally as ``jnp.min`` does; both are valid
    subgradients."""

    def __init__(self, name: str | None = None):
        super().__init__(Function(jnp.minimum), name=name)


class Max(Reduce):
    """Element-wise maximum of a sequence of tensors (zeros if empty).

    Where items tie exactly, the gradient is shared as ``jnp.maximum`` shares it, half to each
    side of every pairwise tie in the balanced reduction tree (``[a, b, c]`` reduces as ``a``
    against ``(b, c)``: 1/2, 1/4, 1/4), not equally as ``jnp.max`` does; both are valid
    subgradients."""

    def __init__(self, name: str | None = None):
        super().__init__(Function(jnp.maximum), name=name)


def _mean(total: jax.Array, count: jax.Array) -> jax.Array:
    count = jnp.maximum(count, 1).astype(total.dtype)
    return total / count.reshape(count.shape + (1,) * (total.ndim - 1))


class Mean(Pipe):
    """Mean of a sequence of tensors (zeros if empty): ``Sum`` plus one level."""

    def __init__(self, name: str | None = None):
        super().__init__(AllOf(Sum(), Length()), Function(_mean), name=name)


def _exp_minus(x: jax.Array, m: jax.Array) -> jax.Array:
    return jnp.exp(x - m)


class Softmax(Pipe):
    """Softmax across a sequence of tensors: element ``i`` becomes ``exp(x_i) / sum_j exp(x_j)``,
    entry by entry of the tensors (attention weights from a sequence of scores, say). The maximum
    is subtracted first, so large scores do not overflow; an empty sequence stays empty.

    Examples:
        >>> import fold as fd
        >>> [round(float(w[0]), 4) for w in (fd.Map(fd.Vector(1)) >> fd.Softmax()).eval([[0.0], [1.0]])]
        [0.2689, 0.7311]
    """

    def __init__(self, name: str | None = None):
        shifted = AllOf(Identity(), Max() >> Broadcast()) >> ZipWith(Function(_exp_minus))
        normalised = AllOf(Identity(), Sum() >> Broadcast()) >> ZipWith(Function(jnp.divide))
        super().__init__(shifted, normalised, name=name)


class Broadcast(Block):
    """Turns a value into an endless sequence of it (for ``Zip``)."""

    _leaf = True

    def _infer(self) -> None:
        if self.input_type is not None:
            set_child(self, BroadcastSequenceType(self.input_type), self, "output", "output")
        elif isinstance(self.output_type, BroadcastSequenceType):
            self.set_input_type(self.output_type.element_type)

    def _host_leaf(self, x: HostValue, ctx: HostContext) -> Repeat:
        return Repeat(x)


class Zip(Block):
    """A tuple of sequences to a sequence of tuples, as long as the shortest.

    Broadcast sequences repeat; when every input is one, so is the result (as in Fold).
    """

    _leaf = True

    def _check_input(self, t: Type) -> None:
        if isinstance(t, PyObjectType):
            return
        if not isinstance(t, TupleType) or len(t) == 0 or not all(isinstance(i, SequenceType) for i in t):
            raise TypeError(f"{self!r} takes a tuple of sequences, not {t}")

    def _infer(self) -> None:
        t = self.input_type
        if isinstance(t, TupleType):
            elements = [i.element_type for i in t if isinstance(i, SequenceType)]  # all are (checked)
            kind = BroadcastSequenceType if all(isinstance(i, BroadcastSequenceType) for i in t) else SequenceType
            set_child(self, kind(TupleType(*elements)), self, "output", "output")
        elif isinstance(t, PyObjectType):
            set_child(self, t, self, "output", "output")

    def _host_leaf(self, x: HostValue, ctx: HostContext) -> list[HostValue] | Repeat:
        if not isinstance(x, (tuple, list)):
            raise TypeError(f"{self!r} expected a tuple of sequences, got {type(x).__name__}")
        seqs = [s if isinstance(s, Repeat) else _as_list(self, s, ctx) for s in x]
        lengths = [len(s) for s in seqs if not isinstance(s, Repeat)]
        if not lengths:  # every input repeats: so does the result
            return Repeat(tuple(s.value for s in seqs if isinstance(s, Repeat)))
        return [tuple(s.value if isinstance(s, Repeat) else s[i] for s in seqs) for i in range(min(lengths))]


def ZipWith(elem_block: BlockLike, name: str | None = None) -> Pipe:
    """``Zip() >> Map(elem_block)``."""
    return Pipe(Zip(), Map(elem_block), name=name)


class NGrams(Block):
    """The sequence of n-tuples of consecutive elements (of a broadcast sequence: a broadcast of the
    value n times, as in Fold)."""

    _leaf = True

    def __init__(self, n: int, name: str | None = None):
        self.n = whole("NGrams", "n", n)
        if self.n <= 0:
            raise ValueError(f"NGrams needs n >= 1, got {n}")
        super().__init__(name)

    def _check_input(self, t: Type) -> None:
        _element_type(self, t)

    def _infer(self) -> None:
        if self.input_type is not None:
            elem = _element_type(self, self.input_type)
            kind = BroadcastSequenceType if isinstance(self.input_type, BroadcastSequenceType) else SequenceType
            set_child(self, kind(TupleType(*[elem] * self.n)), self, "output", "output")

    def _host_leaf(self, x: HostValue, ctx: HostContext) -> HostValue:
        if isinstance(x, Repeat):
            return Repeat(tuple([x.value] * self.n))
        xs = _as_list(self, x, ctx)
        return [tuple(xs[i:i + self.n]) for i in range(len(xs) - self.n + 1)]


class Nth(Block):
    """``(sequence, n) -> sequence[n]`` where ``n`` is a Python int."""

    _leaf = True

    def _check_input(self, t: Type) -> None:
        if not isinstance(t, TupleType) or len(t) != 2:
            raise TypeError(f"{self!r} takes a (sequence, index) pair, not {t}")
        _finite(self, t[0])
        if not isinstance(t[1], PyObjectType):
            raise TypeError(f"{self!r} takes a Python int index, not {t[1]}")

    def _infer(self) -> None:
        if isinstance(self.input_type, TupleType):
            set_child(self, _element_type(self, self.input_type[0]), self, "output", "output")

    def _host_leaf(self, x: HostValue, ctx: HostContext) -> HostValue:
        seq, n = x
        xs = _as_list(self, seq, ctx)
        if isinstance(n, bool) or not isinstance(n, int):
            raise TypeError(f"{self!r} needs an int index, got {n!r}")
        if not -len(xs) <= n < len(xs):
            raise KeyError(f"{self!r}: index {n} is out of range for a sequence of {len(xs)}")
        return xs[n]


class Length(Block):
    """The length of a sequence (or tuple) as a scalar constant of ``dtype``."""

    _leaf = True

    def __init__(self, dtype: DTypeLike = "float32", name: str | None = None):
        self._ttype = TensorType((), requested_dtype(dtype, "Length"))
        super().__init__(name, None, self._ttype)

    def _check_input(self, t: Type) -> None:
        if isinstance(t, TupleType):
            return
        _finite(self, t)

    def _host_leaf(self, x: HostValue, ctx: HostContext) -> int:
        n = len(x) if isinstance(x, (list, tuple)) else len(_as_list(self, x, ctx))
        return ctx.const(self._ttype, to_array(n, self._ttype))

