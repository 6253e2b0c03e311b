"""What a block may ask of the scheduler: the contracts of its host work, owned by the blocks.

A block's host work (``Block._host_leaf`` and ``Block._host``, see
``fold/blocks/base.py``) gets the batch builder as ``ctx``: ``HostContext``
is the whole of that contract. A block that emits straight-line code into
the host plan (``Block._emit``) gets an emitter: ``EmitContext``. The
scheduler implements both (``fold.scheduler.builder.BatchBuilder`` and
``fold.scheduler.plan.Emitter``), and a new block may use exactly these
members. Keeping them here, beside the blocks, lets the blocks be
type-checked without importing the scheduler, which imports the blocks.

Host values follow ``base.py``'s convention: a tensor is an ``int`` id
issued by ``const``, ``zeros`` or ``call``; a tuple is a tuple of host
values; a sequence is a list (or ``itertools.repeat``); void is None.

Examples:
    >>> from fold.blocks.host import ExampleLimits
    >>> ExampleLimits(max_nodes=10).max_recursion
    100000
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Hashable, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, TypeAlias

import numpy as np

from fold.blocks.types import TensorType
from fold.typing import PyObject

if TYPE_CHECKING:
    from fold.blocks.base import Block
    from fold.blocks.control import ForwardDeclaration
    from fold.blocks.tensors import OpSpec

__all__ = ["HostContext", "EmitContext", "Step", "OpBlock", "ExampleLimits", "DEFAULT_LIMITS", "HostValue",
           "HostWalk", "BlockLike", "ConstValue"]

HostValue: TypeAlias = Any
"""A block's value during the host walk: an ``int`` tensor id, a tuple of host values, a list or
``itertools.repeat`` of them, None for void, or (for ``PyObject`` types) the user's own object."""

BlockLike: TypeAlias = Any
"""Anything ``convert_to_block`` takes: a block, a layer, a function, an array, or a dict, tuple
or list of block-likes."""

HostWalk: TypeAlias = "Generator[tuple[Step, HostValue, PyObject], HostValue, HostValue]"
"""A composite block's host walk (``Block._host``): it yields ``(child, input, label)``, gets the
child's output back, and returns its own output."""


class ExampleLimits(NamedTuple):
    """Bounds on the host work of one example, so that no input makes a build run forever.

    A recursion that makes a new object at every level (``InputTransform(lambda x: [x])``
    feeding its own declaration) consumes nothing and is not caught by the check for
    cycles, which compares objects; these limits stop it, and any example too large to be
    meant. The defaults are far above SST (about 100 operation calls a tree) and the
    10,000-deep trees of the tests; set them with ``Compiler.create``.
    """

    max_nodes: int = 1_000_000       # operation calls of one example
    max_recursion: int = 100_000     # nested ForwardDeclaration calls


DEFAULT_LIMITS = ExampleLimits()


ConstValue: TypeAlias = "np.ndarray | np.generic | float | int | bool | None"
"""A constant's value on the host: an array, a Python number for a scalar type, or None for zeros."""


class Step(Protocol):
    """What a pipe runs, one after another: a block, or a fused run of operations."""

    _leaf: bool

    def _path_name(self) -> str:
        """How errors name it in a block path."""
        ...

    def _host_leaf(self, x: HostValue, ctx: HostContext) -> HostValue:
        """Its host work, for a leaf."""
        ...

    def _emit(self, em: EmitContext, x: str) -> str:
        """Its host work as generated code (see ``EmitContext``)."""
        ...


class OpBlock(Step, Protocol):
    """What runs as one operation: a ``Function``, a ``Concat``, or a fused run of them."""

    def op_spec(self) -> OpSpec:
        """The operation: its key, types, function and layer."""
        ...


class HostContext(Protocol):
    """The builder as blocks see it (implemented by ``fold.scheduler.builder.BatchBuilder``)."""

    block_cache: dict[Hashable, HostValue]
    """Values a block computes once per batch (``Zeros`` keeps its ids here, ``Shared`` its nodes)."""

    example_index: int | None
    """The current example's position in its batch (None for one example given on its own)."""

    recursing: set[tuple[int, int]]
    """``(declaration, input object)`` ids of the recursive calls the walk is in (cycle check)."""

    @property
    def limits(self) -> ExampleLimits:
        """Bounds on one example's host work."""
        ...

    def const(self, ttype: TensorType, value: ConstValue) -> int:
        """A depth-0 constant of ``ttype`` (an array, a Python number for a scalar, or ``None`` for zeros)."""
        ...

    def const_shared(self, key: Hashable, ttype: TensorType, value: np.ndarray | None) -> int:
        """A constant stored once per batch under ``key``, whichever example asks for it."""
        ...

    def zeros(self, ttype: TensorType) -> int:
        """The batch's one zeros constant of ``ttype``."""
        ...

    def call(self, block: OpBlock, x: HostValue) -> HostValue:
        """Records one call of ``block``'s operation on host value ``x``; returns its output's ids."""
        ...

    def metric(self, name: str, vid: int, label: PyObject = None) -> None:
        """Records tensor ``vid`` as an entry of metric ``name`` (with ``label`` if it has labels)."""
        ...

    def steps(self, pipe: Block) -> Sequence[Step]:
        """The blocks ``pipe`` runs, with runs of operations fused where the program fused them."""
        ...

    def check_size(self) -> None:
        """Raises ``ValueError`` once the current example exceeds the program's node limit."""
        ...

    def where(self) -> str:
        """The current example as errors name it (its dataset index where it has one)."""
        ...


Arm: TypeAlias = "tuple[str | None, Callable[[], None]]"
"""One arm of an emitted ``if`` chain: its condition (None for ``else``) and what emits its body."""


class EmitContext(Protocol):
    """The host plan's emitter as blocks see it (implemented by ``fold.scheduler.plan.Emitter``).

    Generated statements read a host value from a variable name and assign
    their result to a fresh one, which the emitting method returns. Anything
    that is not a literal (blocks, keys, functions) is bound by name in the
    generated module's namespace (``bind``).
    """

    def var(self, prefix: str = "v") -> str:
        """A fresh local variable name."""
        ...

    def bind(self, obj: object, prefix: str = "k") -> str:
        """A namespace name for ``obj`` (one per object)."""
        ...

    def literal(self, obj: object) -> str:
        """``obj`` as an expression: ints and strings inline, anything else bound by name."""
        ...

    def line(self, text: str) -> None:
        """Emits one statement at the current indentation."""
        ...

    def nested(self) -> AbstractContextManager[None]:
        """Indents the lines emitted inside (the body of an ``if`` or ``for``)."""
        ...

    def assign(self, expr: str) -> str:
        """Emits ``v = expr`` and returns ``v``."""
        ...

    def tuple(self, items: list[str]) -> str:
        """Emits a tuple of the given variables; returns its variable."""
        ...

    def item(self, x: str, key: Hashable) -> str:
        """``x[key]`` (for a tuple the plan built itself, the element's variable)."""
        ...

    def branches(self, arms: list[Arm]) -> None:
        """``if``/``elif`` arms (``else`` where the condition is None); each arm emits its body."""
        ...

    def over_list(self, block: Block, x: str, out: str, start: Callable[[], str],
                  step: Callable[[str], str]) -> None:
        """A loop over list ``x``: ``out = start()``, then ``step(e)`` per element; any other ``x``
        goes to the generic walk of ``block``."""
        ...

    def emit(self, block: Step, x: str) -> str:
        """Emits ``block`` run on the value in variable ``x``; returns its result's variable."""
        ...

    def leaf(self, block: Block, x: str) -> str:
        """A leaf run through its ``_host_leaf``."""
        ...

    def walk(self, block: Block, x: str) -> str:
        """A composite block run by the generic walk."""
        ...

    def steps(self, pipe: Block) -> Sequence[Step]:
        """The blocks ``pipe`` runs (see ``HostContext.steps``)."""
        ...

    def call(self, block: OpBlock, x: str) -> str:
        """One call of ``block``'s operation on host value ``x``."""
        ...

    def const(self, ttype: TensorType, value: str) -> str:
        """A new depth-0 constant of ``ttype`` holding the array expression ``value`` makes."""
        ...

    def metric(self, name: str, x: str, label: str = "None") -> None:
        """Records tensor ``x`` as an entry of metric ``name``, labeled ``label`` if it has labels."""
        ...

    def recurse(self, decl: ForwardDeclaration, x: str) -> str:
        """A call of declaration ``decl``'s target, generated once as its own function."""
        ...

    def function(self, block: Block) -> str:
        """The name of a generated function ``f(x, depth)`` running ``block`` (made once per
        block), for host helpers that call a block many times (``Reduce``'s balanced tree)."""
        ...

