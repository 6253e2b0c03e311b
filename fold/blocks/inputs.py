"""Blocks that turn host (Python) values into tensors, and other leaves.

All of these are constants in the schedule (depth 0) or free host-side
plumbing: they never run on the device.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Hashable, Iterable, Iterator

import jax
import jax.numpy as jnp
import numpy as np
from numpy.typing import DTypeLike

from fold.blocks.base import Block, Repeat, run_leaf, unify
from fold.blocks.host import BlockLike, ConstValue, EmitContext, HostContext, HostValue, HostWalk
from fold.blocks.types import (
    BroadcastSequenceType,
    PyObjectType,
    SequenceType,
    TensorType,
    TupleType,
    Type,
    TypeLike,
    VoidType,
    convert_to_type,
    dtype_kind,
    fold_type,
    is_tensor_tree,
    requested_dtype,
)
from fold.errors import whole
from fold.typing import PyObject

__all__ = [
    "Tensor",
    "Scalar",
    "Vector",
    "FromTensor",
    "InputTransform",
    "OneHot",
    "OneHotFromList",
    "Optional",
    "Identity",
    "Void",
    "Zeros",
]


def to_array(x: PyObject, ttype: TensorType) -> np.ndarray | np.generic:
    """Converts a host value to an array of ``ttype``, with errors of their natural type."""
    if ttype.shape == () and type(x) in (int, float):
        return _scalar(x, ttype)
    if x is None:
        raise TypeError(f"expected a value for {ttype}, got None")
    if isinstance(x, (str, bytes, bytearray, memoryview)):  # NumPy reads a bytearray as its byte values
        raise ValueError(f"expected a number for {ttype}, got the string {x!r}")
    arr = np.asarray(x)
    if arr.dtype == object:
        raise TypeError(f"expected a number or array for {ttype}, got {type(x).__name__} {x!r}")
    source = dtype_kind(arr.dtype)
    if source in "USVMm":  # strings, bytes, void; dates and durations (a datetime64 is no number)
        raise ValueError(f"expected numbers for {ttype}, got {x!r}")
    if arr.shape != ttype.shape:
        raise ValueError(f"expected shape {ttype.shape} for {ttype}, got shape {arr.shape}: {x!r}")
    target, kind = _np_dtype(ttype.dtype), _kind(ttype.dtype)
    if kind in "iu" and source == "f":
        if not np.all(np.isfinite(arr)) or not np.all(arr == np.round(arr)):
            raise ValueError(f"expected integers for {ttype}, got {x!r}")
    # Integral floats must fit too: casting 1e40 to int32 would silently wrap.
    if kind in "iu" and source in "iuf" and arr.size:
        low, high = _int_bounds(target)
        if arr.min() < low or arr.max() > high:
            raise ValueError(f"value {x!r} does not fit in {ttype.dtype}")
    if kind == "b" and source != "b":
        raise ValueError(f"expected booleans for {ttype}, got {x!r}")
    if source == "c" and kind != "c":
        raise ValueError(f"expected real numbers for {ttype}, got the complex value {x!r}")
    with np.errstate(over="ignore", invalid="ignore"):
        out = arr.astype(target)
    # Overflow gives inf, or NaN in float types without inf (float8_e4m3fn).
    if kind in "fc" and np.any(~np.isfinite(out) & np.isfinite(arr)):
        raise ValueError(f"value {x!r} overflows {ttype.dtype} (largest {_largest(ttype.dtype):g})")
    return out


@functools.cache
def _int_bounds(dtype: np.dtype) -> tuple[int, int]:
    info = np.iinfo(dtype)
    return int(info.min), int(info.max)


@functools.cache
def _np_dtype(name: str) -> np.dtype:
    return np.dtype(name)


@functools.cache
def _kind(name: str) -> str:
    return dtype_kind(name)


@functools.cache
def _largest(name: str) -> float:
    """The largest finite value of a float or complex dtype (``jnp.finfo`` knows ``bfloat16``)."""
    return float(jnp.finfo(name).max)


def scalar_converter(ttype: TensorType) -> Callable[[PyObject], ConstValue] | None:
    """For a scalar int or float type, ``to_array`` with a fast path for Python numbers that are
    already valid (kept as they are: constant tables become arrays in one go); else None."""
    if ttype.shape != ():
        return None
    target, kind = _np_dtype(ttype.dtype), _kind(ttype.dtype)
    if kind in "iu":
        low, high = _int_bounds(target)

        def convert_int(x: PyObject) -> ConstValue:
            return x if type(x) is int and low <= x <= high else to_array(x, ttype)

        return convert_int
    if kind == "f":
        largest = _largest(ttype.dtype)

        def convert_float(x: PyObject) -> ConstValue:
            # Kept as they are only if the table's cast cannot overflow (NaN goes the slow way too).
            return x if type(x) is float and -largest <= x <= largest else to_array(x, ttype)

        return convert_float
    return None


def _scalar(x: int | float, ttype: TensorType) -> np.ndarray | np.generic:
    """The common case of ``to_array``, a Python number to a scalar, without building arrays."""
    target, kind = _np_dtype(ttype.dtype), _kind(ttype.dtype)
    if kind == "f":
        with np.errstate(over="ignore", invalid="ignore"):
            try:
                value: np.generic = target.type(x)
            except OverflowError:  # an int past float64's range (10**400)
                value = target.type("inf")
        if not math.isfinite(value) and (isinstance(x, int) or math.isfinite(x)):
            shown = repr(x) if len(repr(x)) <= 40 else f"an int of {len(str(abs(x)))} digits"
            raise ValueError(f"value {shown} overflows {ttype.dtype} (largest {_largest(ttype.dtype):g})")
        return value
    if kind in "iu":
        if type(x) is float and not (math.isfinite(x) and x == int(x)):
            raise ValueError(f"expected integers for {ttype}, got {x!r}")
        low, high = _int_bounds(target)
        if not low <= x <= high:
            raise ValueError(f"value {x!r} does not fit in {ttype.dtype}")
        fitting: np.generic = target.type(int(x))
        return fitting
    if kind == "b":
        raise ValueError(f"expected booleans for {ttype}, got {x!r}")
    return np.asarray(x).astype(target)[()]


class Tensor(Block):
    """Converts its (Python) input to a tensor of ``shape`` and ``dtype``.

    Examples:
        >>> import fold as fd
        >>> fd.Tensor((2,)).eval([1, 2])
        array([1., 2.], dtype=float32)
    """

    _leaf = True

    def __init__(self, shape: Iterable[int], dtype: DTypeLike = "float32", name: str | None = None):
        self._ttype = TensorType(shape, requested_dtype(dtype, "Tensor"))
        self._convert = scalar_converter(self._ttype) or functools.partial(to_array, ttype=self._ttype)
        super().__init__(name, PyObjectType(), self._ttype)

    def __repr__(self) -> str:
        shape, kind = self._ttype.shape, "Tensor"
        if shape == ():
            kind = "Scalar"
        elif len(shape) == 1:
            kind = "Vector"
        return f"{kind}({self._name!r})" if self._name else kind

    def _host_leaf(self, x: HostValue, ctx: HostContext) -> int:
        return ctx.const(self._ttype, self._convert(x))

    def _emit(self, em: EmitContext, x: str) -> str:
        return em.const(self._ttype, f"{em.bind(self._convert, 'convert')}({x})")


def Scalar(dtype: DTypeLike = "float32", name: str | None = None) -> Tensor:
    """Converts its input to a scalar tensor."""
    return Tensor((), dtype, name)


def Vector(size: int, dtype: DTypeLike = "float32", name: str | None = None) -> Tensor:
    """Converts its input to a vector of ``size`` elements."""
    return Tensor((size,), dtype, name)


class FromTensor(Block):
    """A constant: the given NumPy (or JAX) array (a Python number or list is a TypeError, as in
    Fold: it has no dtype of its own).

    As in Fold, it reads no input: its input type is ``VoidType()``. It fits where a void input
    arrives (a ``Fold``'s or ``RNN``'s start, an ``Optional``'s none case, a ``Composition`` block
    that reads nothing, a root run on None); where a block would pass it a value, write
    ``fd.Void() >> fd.FromTensor(x)``.

    Examples:
        >>> import fold as fd, numpy as np
        >>> fd.FromTensor(np.float32(1)).input_type
        VoidType()
        >>> (fd.AllOf(fd.Scalar(), fd.Void() >> fd.FromTensor(np.float32(1))) >> fd.Sum()).eval(2)
        array(3., dtype=float32)
    """

    _leaf = True

    def __init__(self, tensor: object, name: str | None = None):
        if not isinstance(tensor, (np.ndarray, np.generic, jax.Array)):
            # As in Fold: a Python number or list has no dtype of its own to keep.
            raise TypeError(f"FromTensor needs a NumPy or JAX array, got {type(tensor).__name__} {tensor!r}; "
                            "give it one with the dtype you mean, e.g. np.float32(42) or np.asarray(x, 'float32')")
        arr = np.asarray(tensor)
        if arr.dtype == object or dtype_kind(arr.dtype) in "USV":
            raise TypeError(f"FromTensor needs a numeric array, got {tensor!r}")
        self._ttype = TensorType(arr.shape, arr.dtype)
        try:  # a 64-bit array held in 32 bits (x64 off): a value that does not fit would wrap or be inf
            self._value = np.asarray(to_array(arr, self._ttype))
        except ValueError as e:
            raise ValueError(f"FromTensor: {e} (JAX holds {arr.dtype} as {self._ttype.dtype} while "
                             "jax_enable_x64 is off)") from None
        super().__init__(name, VoidType(), self._ttype)

    def mismatch_hint(self, side: str) -> str | None:
        if side != "input":
            return None
        return "a FromTensor reads no input (as in Fold): write fd.Void() >> fd.FromTensor(...) where a value arrives"

    @property
    def tensor(self) -> np.ndarray:
        return self._value

    def _host_leaf(self, x: HostValue, ctx: HostContext) -> int:
        return ctx.const_shared(self, self._ttype, self._value)


class InputTransform(Block):
    """A Python function applied to the host input (free: no device work).

    An iterator that ``py_fn`` returns (a generator, ``map(float, s.split())``)
    is read into a list, once: every block that reads the result sees all of
    its items, where an iterator would be exhausted by the first.
    """

    _leaf = True

    def __init__(self, py_fn: Callable[[PyObject], PyObject], name: str | None = None):
        if not callable(py_fn):
            raise TypeError(f"InputTransform needs a callable, got {py_fn!r}")
        self.py_fn = py_fn
        super().__init__(name, PyObjectType(), PyObjectType())

    def _host_leaf(self, x: HostValue, ctx: HostContext) -> HostValue:
        out = self.py_fn(x)
        return list(out) if isinstance(out, Iterator) else out

    def mismatch_hint(self, side: str) -> str | None:
        if side != "input":
            return None
        return ("an InputTransform runs on the Python input, before anything is computed, so it cannot take "
                "computed tensors: rearrange a sequence of them with blocks (fd.Slice(step=-1) reverses it)")


class OneHot(Block):
    """One-hot encodes an int in ``range(start, stop)`` (``range(start)`` if no stop)."""

    _leaf = True

    def __init__(self, start: int, stop: int | None = None, dtype: DTypeLike = "float32", name: str | None = None):
        if stop is None:
            start, stop = 0, start
        self.start, self.stop = whole("OneHot", "start", start), whole("OneHot", "stop", stop)
        if stop <= start:
            raise ValueError(f"OneHot needs a non-empty range, got [{start}, {stop})")
        self._ttype = TensorType((self.stop - self.start,), requested_dtype(dtype, "OneHot"))
        super().__init__(name, PyObjectType(), self._ttype)

    def _host_leaf(self, x: HostValue, ctx: HostContext) -> int:
        if isinstance(x, bool) or not isinstance(x, (int, np.integer)):
            raise TypeError(f"OneHot expects an int in [{self.start}, {self.stop}), got {x!r}")
        if not self.start <= x < self.stop:
            raise KeyError(f"OneHot: {x!r} is outside [{self.start}, {self.stop})")
        arr = np.zeros(self._ttype.shape, self._ttype.dtype)
        arr[int(x) - self.start] = 1
        return ctx.const(self._ttype, arr)


class OneHotFromList(Block):
    """One-hot encodes an element of ``elements`` by its position.

    With ``strict=False`` an unknown element gives the zero vector; with
    ``strict=True`` (default) it is a KeyError.
    """

    _leaf = True

    def __init__(self, elements: Iterable[Hashable], dtype: DTypeLike = "float32", strict: bool = True,
                 name: str | None = None):
        self.elements = list(elements)
        if not self.elements:
            raise ValueError("OneHotFromList needs at least one element")
        self._index: dict[Hashable, int] = {}
        for i, e in enumerate(self.elements):
            if e in self._index:
                raise ValueError(f"OneHotFromList: duplicate element {e!r}")
            self._index[e] = i
        self.strict = strict
        self._ttype = TensorType((len(self.elements),), requested_dtype(dtype, "OneHotFromList"))
        super().__init__(name, PyObjectType(), self._ttype)

    def _host_leaf(self, x: HostValue, ctx: HostContext) -> int:
        arr = np.zeros(self._ttype.shape, self._ttype.dtype)
        i = self._index.get(x)
        if i is None:
            if self.strict:
                raise KeyError(f"OneHotFromList: {x!r} is not one of {self.elements!r}")
        else:
            arr[i] = 1
        return ctx.const(self._ttype, arr)


class Identity(Block):
    """Returns its input unchanged."""

    _leaf = True

    def _infer(self) -> None:
        unify(self, "input", self, "output")

    def _host_leaf(self, x: HostValue, ctx: HostContext) -> HostValue:
        return x


class Void(Block):
    """Accepts any input and outputs void."""

    _leaf = True

    def __init__(self, name: str | None = None):
        super().__init__(name, None, VoidType())

    def _host_leaf(self, x: HostValue, ctx: HostContext) -> None:
        return None


def zeros_value(t: Type, ctx: HostContext) -> HostValue:
    """The host value of zeros of type ``t`` (empty sequence for sequences)."""
    if isinstance(t, TensorType):
        return ctx.zeros(t)
    if isinstance(t, TupleType):
        return tuple(zeros_value(i, ctx) for i in t)
    if isinstance(t, VoidType):
        return None
    if isinstance(t, BroadcastSequenceType):
        return Repeat(zeros_value(t.element_type, ctx))
    if isinstance(t, SequenceType):
        return []
    raise TypeError(f"no zeros of {t}")


def _check_zeroable(t: Type) -> None:
    if fold_type(t, lambda _: False, lambda _, items: any(items), lambda _, element: element,
                 lambda leaf: isinstance(leaf, PyObjectType)):
        raise TypeError(f"Zeros cannot make a value of {t}")


class Zeros(Block):
    """Zeros of ``output_type`` (voids and empty sequences where those appear)."""

    _leaf = True

    def __init__(self, output_type: TypeLike, name: str | None = None):
        t = convert_to_type(output_type)
        _check_zeroable(t)
        super().__init__(name, None, t)
        self._zeros_type = t
        # Values made of tensor ids and tuples are immutable: share one per batch.
        self._shareable = is_tensor_tree(t)

    def _host_leaf(self, x: HostValue, ctx: HostContext) -> HostValue:
        if not self._shareable:
            return zeros_value(self._zeros_type, ctx)
        cached = ctx.block_cache.get(self)
        if cached is None:
            cached = ctx.block_cache[self] = zeros_value(self._zeros_type, ctx)
        return cached


class Optional(Block):
    """``some_case(x)`` if ``x`` is not None, else ``none_case`` (default: zeros).

    ``none_case`` gets a void input.
    """

    def __init__(self, some_case: BlockLike, none_case: BlockLike = None, name: str | None = None):
        super().__init__(name, PyObjectType())
        self.some_case = self._adopt(some_case)
        self.none_case = None if none_case is None else self._adopt(none_case)
        if self.none_case is not None:
            self.none_case.set_input_type(VoidType())

    def children(self) -> list[Block]:
        return [b for b in (self.some_case, self.none_case) if b is not None]

    def _infer(self) -> None:
        unify(self, "input", self.some_case, "input")
        if self.none_case is None and self.output_type is not None:
            self.none_case = self._adopt(Zeros(self.output_type))
            self.none_case.set_input_type(VoidType())
        if self.none_case is None and self.some_case.output_type is not None:
            self.none_case = self._adopt(Zeros(self.some_case.output_type))
            self.none_case.set_input_type(VoidType())
        for case in self.children():
            unify(self, "output", case, "output")

    def _host(self, x: HostValue, ctx: HostContext) -> HostWalk:
        if x is None:
            assert self.none_case is not None  # made by _infer, which every compiled model ran
            return (yield self.none_case, None, "Optional[None]")
        some = self.some_case
        return run_leaf(some, x, ctx) if some._leaf else (yield some, x, None)

    def _emit(self, em: EmitContext, x: str) -> str:
        none_case = self.none_case
        assert none_case is not None  # made by _infer, which every compiled model ran
        out = em.var()
        em.branches([(f"{x} is None", lambda: em.line(f"{out} = {em.emit(none_case, 'None')}")),
                     (None, lambda: em.line(f"{out} = {em.emit(self.some_case, x)}"))])
        return out

