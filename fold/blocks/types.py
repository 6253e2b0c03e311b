"""The static types of fold blocks.

Every block has an input type and an output type, drawn from:

* ``TensorType(shape, dtype)``: a tensor; ``shape`` excludes the batch dim.
* ``TupleType(*items)``: a fixed-size tuple of types.
* ``SequenceType(elem)``: a sequence of any length.
* ``BroadcastSequenceType(elem)``: one element repeated forever.
* ``PyObjectType()``: any host Python object (the input of a model).
* ``VoidType()``: the unit type.

Types are immutable, hashable and compare structurally.

Examples:
    >>> TensorType((3,)) == convert_to_type((3,))
    True
    >>> TupleType(TensorType(()), PyObjectType())
    TupleType(TensorType((), 'float32'), PyObjectType())
"""

from __future__ import annotations

import abc
import os
import sys
import types
import warnings
from collections.abc import Callable, Hashable, Iterable, Iterator
from typing import Any, TypeAlias, TypeVar, overload

import jax
import numpy as np
from numpy.typing import DTypeLike

R = TypeVar("R")

__all__ = [
    "Type",
    "TensorType",
    "TupleType",
    "SequenceType",
    "BroadcastSequenceType",
    "PyObjectType",
    "VoidType",
    "convert_to_type",
    "tensor_types",
    "fold_type",
    "is_tensor_tree",
    "canonical_dtype",
]

TypeLike: TypeAlias = Any
"""Anything ``convert_to_type`` takes: a ``Type``, a shape, a dtype, or a tuple or list of
type-likes (their shapes are checked when converted)."""


def dtype_kind(dtype: DTypeLike) -> str:
    """NumPy's kind letter of ``dtype`` (``"f"``, ``"i"``, ``"u"``, ``"b"``, ``"c"``, ...), with
    ``"f"`` also for the float types JAX adds to NumPy's (``bfloat16``, the ``float8`` types),
    whose NumPy kind is ``"V"``.

    Examples:
        >>> dtype_kind("bfloat16"), dtype_kind("float32"), dtype_kind("int8")
        ('f', 'f', 'i')
    """
    np_dtype = np.dtype(dtype)
    return "f" if jax.numpy.issubdtype(np_dtype, np.floating) else np_dtype.kind


def canonical_dtype(dtype: DTypeLike) -> str:
    """Returns the dtype name JAX will really use (64-bit -> 32-bit when x64 is off)."""
    try:
        np_dtype = np.dtype(dtype)
    except TypeError as e:
        raise TypeError(f"not a dtype: {dtype!r}") from e
    # Numbers and bools that JAX holds in arrays (not strings, objects or NumPy's long double).
    numeric = np_dtype == np.bool_ or jax.numpy.issubdtype(np_dtype, np.number)
    too_wide = np_dtype.itemsize > {"f": 8, "c": 16}.get(np_dtype.kind, 8)
    if not numeric or too_wide:
        raise TypeError(f"{dtype!r} is not a dtype JAX arrays hold: use a bool, int, uint, float or complex dtype "
                        "such as 'float32' or 'int32'")
    return str(jax.dtypes.canonicalize_dtype(np_dtype))


def requested_dtype(dtype: DTypeLike, who: str) -> str:
    """``canonical_dtype(dtype)`` for a dtype a user gave ``who`` (a block or layer name). Warns,
    as ``jnp.asarray(x, dtype)`` does, when JAX narrows it (64 bits while x64 is off): the values
    would lose precision or range without a word."""
    got = canonical_dtype(dtype)
    asked = np.dtype(dtype).name
    if got != asked:
        warnings.warn(f"{who}(dtype={asked!r}) holds {got}: JAX truncates 64-bit dtypes unless "
                      "jax.config.update('jax_enable_x64', True) runs before the model is built",
                      UserWarning, stacklevel=_callers_level())
    return got


def _callers_level() -> int:
    """The ``stacklevel`` of the first frame outside this package, for a warning about a
    caller's argument to point at the caller's line, however deep in fold it is checked."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    frame: types.FrameType | None = sys._getframe(1)
    level = 1
    while frame is not None and frame.f_code.co_filename.startswith(package):
        frame, level = frame.f_back, level + 1
    return level


class Type(abc.ABC):
    """Base class of fold types."""

    __slots__ = ()

    @abc.abstractmethod
    def _key(self) -> tuple[Hashable, ...]:
        """The structural identity used for equality and hashing."""

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash((type(self).__name__, self._key()))

    def tensor_leaves(self) -> list[TensorType]:
        """The tensor types inside a type made only of tensors, tuples and voids."""
        raise TypeError(f"{self} is not made of tensors and tuples")


class TensorType(Type):
    """A tensor of a fixed ``shape`` (without batch dimension) and ``dtype``."""

    __slots__ = ("_shape", "_dtype", "_hash")

    def __init__(self, shape: Iterable[int] = (), dtype: DTypeLike = "float32"):
        if isinstance(shape, (int, np.integer)):
            raise TypeError(f"TensorType shape must be a tuple or list of ints, got {shape!r}")
        try:
            dims = tuple(shape)
        except TypeError as e:
            raise TypeError(f"TensorType shape must be a tuple or list of ints, got {shape!r}") from e
        for d in dims:
            if not isinstance(d, (int, np.integer)) or isinstance(d, bool) or d < 0:
                raise TypeError(f"TensorType shape must hold non-negative ints, got {shape!r}")
        self._shape = tuple(int(d) for d in dims)
        self._dtype = canonical_dtype(dtype)
        # The host walk looks tensor types up in dicts for every constant.
        self._hash = hash((type(self).__name__, self._key()))

    def __hash__(self) -> int:
        return self._hash

    @property
    def shape(self) -> tuple[int, ...]:
        return self._shape

    @property
    def dtype(self) -> str:
        return self._dtype

    @property
    def ndim(self) -> int:
        return len(self._shape)

    def _key(self) -> tuple[Hashable, ...]:
        return (self._shape, self._dtype)

    def tensor_leaves(self) -> list[TensorType]:
        return [self]

    def __array__(self, dtype: DTypeLike | None = None, copy: bool | None = None) -> np.ndarray:
        return np.zeros(self._shape, dtype=dtype or self._dtype)

    def __repr__(self) -> str:
        return f"TensorType({self._shape!r}, {self._dtype!r})"


class TupleType(Type):
    """A fixed-size tuple; supports ``len``, indexing, slicing and iteration."""

    __slots__ = ("_items",)

    def __init__(self, *item_types: TypeLike):
        if len(item_types) == 1 and not isinstance(item_types[0], Type) and isinstance(
            item_types[0], (list, tuple)
        ) and all(isinstance(t, Type) for t in item_types[0]):
            item_types = tuple(item_types[0])
        self._items = tuple(convert_to_type(t) for t in item_types)

    @property
    def item_types(self) -> tuple[Type, ...]:
        return self._items

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[Type]:
        return iter(self._items)

    @overload
    def __getitem__(self, key: int) -> Type: ...

    @overload
    def __getitem__(self, key: slice) -> TupleType: ...

    def __getitem__(self, key: int | slice) -> Type:
        if isinstance(key, slice):
            return TupleType(*self._items[key])
        return self._items[key]

    def _key(self) -> tuple[Hashable, ...]:
        return self._items

    def tensor_leaves(self) -> list[TensorType]:
        return [leaf for t in self._items for leaf in t.tensor_leaves()]

    def __repr__(self) -> str:
        return "TupleType(" + ", ".join(repr(t) for t in self._items) + ")"


class SequenceType(Type):
    """A sequence of any length whose elements all have ``element_type``."""

    __slots__ = ("_elem",)

    def __init__(self, element_type: TypeLike):
        self._elem = convert_to_type(element_type)

    @property
    def element_type(self) -> Type:
        return self._elem

    def _key(self) -> tuple[Hashable, ...]:
        return (self._elem,)

    def __repr__(self) -> str:
        return f"SequenceType({self._elem!r})"


class BroadcastSequenceType(SequenceType):
    """An endless repetition of one element (the output of ``Broadcast``)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"BroadcastSequenceType({self._elem!r})"


class PyObjectType(Type):
    """Any host Python object."""

    __slots__ = ()

    def _key(self) -> tuple[Hashable, ...]:
        return ()

    def __repr__(self) -> str:
        return "PyObjectType()"


class VoidType(Type):
    """The unit type: carries no value."""

    __slots__ = ()

    def _key(self) -> tuple[Hashable, ...]:
        return ()

    def tensor_leaves(self) -> list[TensorType]:
        return []

    def __repr__(self) -> str:
        return "VoidType()"


def fold_type(t: Type, tensor: Callable[[TensorType], R], tuple_: Callable[[TupleType, list[R]], R],
              sequence: Callable[[SequenceType, R], R], other: Callable[[Type], R]) -> R:
    """Folds the type tree ``t`` bottom-up: each tensor type gives ``tensor(t)``, each tuple
    ``tuple_(t, [results of its items])``, each sequence (broadcast or not) ``sequence(t, result of
    its element type)``, and PyObject and void ``other(t)``. The library's walks over types are
    this one walk.

    Examples:
        >>> count = lambda t: fold_type(t, lambda _: 1, lambda _, items: sum(items), lambda _, e: e, lambda _: 0)
        >>> count(TupleType(TensorType((2,)), SequenceType(TupleType(TensorType(()), VoidType()))))
        2
    """
    if isinstance(t, TensorType):
        return tensor(t)
    if isinstance(t, TupleType):
        return tuple_(t, [fold_type(i, tensor, tuple_, sequence, other) for i in t])
    if isinstance(t, SequenceType):
        return sequence(t, fold_type(t.element_type, tensor, tuple_, sequence, other))
    return other(t)


def tensor_types(t: Type | None) -> list[TensorType]:
    """Every tensor type inside ``t``, in order, including those of sequence elements.

    Examples:
        >>> tensor_types(TupleType(TensorType((2,)), SequenceType(TensorType(()))))
        [TensorType((2,), 'float32'), TensorType((), 'float32')]
    """
    if t is None:
        return []
    return fold_type(t, lambda leaf: [leaf], lambda _, items: [x for item in items for x in item],
                     lambda _, element: element, lambda _: [])


def is_tensor_tree(t: Type, empty_tuples: bool = True) -> bool:
    """Whether ``t`` is made only of tensors, tuples and voids (no sequences or PyObjects);
    ``empty_tuples=False`` also refuses empty tuples.

    Examples:
        >>> is_tensor_tree(TupleType(TensorType(()), VoidType())), is_tensor_tree(SequenceType(TensorType(())))
        (True, False)
    """
    return fold_type(t, lambda _: True, lambda tt, items: all(items) and (empty_tuples or len(items) > 0),
                     lambda *_: False, lambda leaf: isinstance(leaf, VoidType))


def holds_only_voids(t: Type) -> bool:
    """Whether every leaf of ``t`` is void: a ``Map`` of metrics outputs a sequence of voids, which
    ``>> Void()`` ends.

    Examples:
        >>> holds_only_voids(SequenceType(VoidType())), holds_only_voids(SequenceType(TensorType(())))
        (True, False)
    """
    return fold_type(t, lambda _: False, lambda _, items: all(items), lambda _, element: element,
                     lambda leaf: isinstance(leaf, VoidType))


def _canonicalize(t: Type) -> Type:
    """Sequences and non-empty tuples of PyObjects are PyObjects (as in Fold)."""
    if isinstance(t, SequenceType) and isinstance(t.element_type, PyObjectType):
        return PyObjectType()
    if isinstance(t, TupleType) and len(t) > 0 and all(isinstance(i, PyObjectType) for i in t):
        return PyObjectType()
    return t


def _is_shape(x: object) -> bool:
    return isinstance(x, (tuple, list)) and all(
        isinstance(d, (int, np.integer)) and not isinstance(d, bool) for d in x
    )


def convert_to_type(x: TypeLike) -> Type:
    """Converts shorthand to a type.

    * a ``Type`` is returned unchanged (canonicalised);
    * a tuple or list of ints (including ``()`` and ``[]``) is a float32
      ``TensorType`` of that shape;
    * a list of ints ending in a dtype (``[3, 4, 'int32']``) is a
      ``TensorType`` of that shape and dtype (as in Fold);
    * an int ``n`` is a float32 vector ``TensorType((n,))`` (as in Fold);
    * a dtype (string or NumPy dtype) is a scalar ``TensorType`` of it;
    * any other tuple or list is a ``TupleType`` of its converted items.

    Fold reads a tuple of ints as a tuple of vectors; here it is a shape,
    like a list.

    Examples:
        >>> convert_to_type([])
        TensorType((), 'float32')
        >>> convert_to_type(((3,), 'int32'))
        TupleType(TensorType((3,), 'float32'), TensorType((), 'int32'))
        >>> convert_to_type(8), convert_to_type([2, 3, 'int32'])
        (TensorType((8,), 'float32'), TensorType((2, 3), 'int32'))
    """
    if isinstance(x, Type):
        return _canonicalize(x)
    if _is_shape(x):
        return TensorType(x)
    if isinstance(x, (int, np.integer)) and not isinstance(x, bool):
        if x < 0:
            raise TypeError(f"cannot convert {x} to a fold type: a vector length is >= 0")
        return TensorType((int(x),))
    if isinstance(x, list) and x and isinstance(x[-1], str) and _is_shape(x[:-1]):
        return TensorType(tuple(x[:-1]), x[-1])
    if isinstance(x, (tuple, list)):
        return _canonicalize(TupleType(*[convert_to_type(i) for i in x]))
    if isinstance(x, (str, np.dtype)) or (isinstance(x, type) and issubclass(x, np.generic)):
        return TensorType((), x)
    raise TypeError(f"cannot convert {x!r} to a fold type")
