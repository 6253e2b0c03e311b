"""The ``Block`` base class: typing, wiring, and the host-walk protocol.

A block is a typed function from an input to an output. Blocks hold no
arrays: the compiler turns a block tree into operations, and the scheduler
walks each example through the tree on the host, recording tensor
operations (see ``fold/scheduler/builder.py``).

Host-walk protocol. A block either

* is a *leaf* (``_leaf = True``) and computes its output directly in
  ``_host_leaf(x, ctx)``, or
* implements ``_host(x, ctx)`` as a generator that ``yield``s
  ``(child, child_input, label)`` requests and receives each child's
  output back; its return value is its output.

``ctx`` is the batch builder, seen through the ``HostContext`` protocol
(``fold/blocks/host.py``): the members listed there are all a block may
use of it.

The driver in the scheduler runs these generators on an explicit stack,
so walking a 10,000-deep input never recurses in Python. ``label`` is this
block's element of the error path (``"Record['left']"``, or
``("Map[{}]", 3)``, formatted only if an error needs it) or ``None`` for
transparent plumbing such as ``Pipe``. A generator may run a *leaf* child
itself with ``run_leaf`` instead of yielding it: that skips a round trip
through the driver, and a failure still names the child. A ``Pipe`` whose
blocks are all leaves is itself a leaf (it runs them in turn), so chains
such as ``GetItem(0) >> Scalar() >> Function(f)`` cost no generator at all.

The compiler also turns the tree into a *host plan* of generated Python
(``fold/scheduler/plan.py``): ``_emit`` writes a block's host work as
statements. A block that does not override it runs its ``_host_leaf`` or
``_host`` from the plan, so ``_host``/``_host_leaf`` stay the reference
semantics and ``_emit`` is only a faster way to do exactly the same.

Host values: a tensor is an ``int`` id issued by the batch builder, a tuple
is a tuple, a sequence is a list, a broadcast sequence is a ``Repeat``, a
PyObject is itself and void is ``None``.
"""

from __future__ import annotations

import threading
from collections.abc import Hashable
from typing import TYPE_CHECKING

from fold.blocks.host import BlockLike, EmitContext, HostContext, HostValue, HostWalk, Step
from fold.blocks.types import Type, TypeLike, convert_to_type
from fold.errors import LeafError, set_type, type_error
from fold.typing import Params, PyObject

if TYPE_CHECKING:
    from fold.blocks.composition import Composition
    from fold.compiler.compiler import Compiler

__all__ = ["Block", "convert_to_block", "Repeat", "run_leaf", "scope_stack", "set_child", "unify"]

_scopes = threading.local()
# Type propagation's depth on this thread, and the blocks it left to infer from (``Block._changed``).
_propagation = threading.local()
_PROPAGATION_DEPTH = 32


def run_leaf(block: Step, x: HostValue, ctx: HostContext, label: PyObject = None) -> HostValue:
    """Runs leaf ``block`` on ``x`` from inside a parent's ``_host`` generator (or a leaf ``Pipe``)."""
    try:
        return block._host_leaf(x, ctx)
    except LeafError as e:
        # A leaf Pipe failed inside: name the child that failed. Pipes add no label of their own.
        raise LeafError(e.block, label, e.error) from None
    except Exception as e:
        raise LeafError(block, label, e) from None


def scope_stack() -> list[Composition]:
    """The compositions whose ``scope()`` is active in this thread, innermost last."""
    if not hasattr(_scopes, "stack"):
        _scopes.stack = []
    stack: list[Composition] = _scopes.stack
    return stack


def outline(block: Block, depth: int = 3, width: int = 100) -> str:
    """``block`` with its children, ``depth`` levels down, on one line of at most ``width``
    characters: ``Pipe(Vector >> Function(FC))``, so that errors can tell two blocks of one
    class apart."""

    def text(b: Block, depth: int) -> str:
        kids = b.children()
        if not kids or depth == 0 or b._refers_to_children:
            return repr(b)
        sep = " >> " if type(b).__name__ == "Pipe" else ", "
        return f"{b!r}({sep.join(text(k, depth - 1) for k in kids)})"

    out = text(block, depth)
    return out if len(out) <= width else out[: width - 3] + "..."


def current_composition() -> Composition | None:
    """The innermost ``Composition`` whose ``scope()`` is active, or None."""
    stack = scope_stack()
    return stack[-1] if stack else None


class Repeat:
    """Host value of a broadcast sequence: ``value`` repeated forever."""

    __slots__ = ("value",)

    def __init__(self, value: HostValue):
        self.value = value

    def __repr__(self) -> str:
        return f"Repeat({self.value!r})"


class _BlockMeta(type):
    """Runs a block's inference once its constructor has set every field: ``_infer`` never sees a
    half-built block (types set while it is built, by ``Block.__init__`` or by its children, wait
    until then)."""

    def __call__(cls, *args: object, **kwargs: object) -> Block:
        block: Block = super().__call__(*args, **kwargs)
        block._ready = True
        block._infer()
        return block


class Block(metaclass=_BlockMeta):
    """Base class of all blocks.

    Subclasses set ``_leaf`` and implement ``_host_leaf`` or ``_host``;
    they refine types through ``_check_input``/``_check_output`` (raise
    ``TypeError`` for types they can never accept) and ``_infer`` (push
    known types to and from children).
    """

    _leaf = False
    # NumPy defers to ``__rrshift__``: ``np.array(...) >> block`` is ``FromTensor(array) >> block``.
    __array_ufunc__ = None
    _ready = False  # set once the constructor returns (``_BlockMeta``): inference waits for it
    _scoped = True  # registers itself with the enclosing Composition scope
    # A ForwardDeclaration only refers to its target: the target may also be used in one place.
    _refers_to_children = False

    def __init__(self, name: str | None = None, input_type: TypeLike = None, output_type: TypeLike = None):
        self._name = name
        self._input_type: Type | None = None
        self._output_type: Type | None = None
        self._parent: Block | None = None
        self._listeners: list[Block] = []
        self._composition: Composition | None = None
        self._eval_compiler: Compiler | None = None
        comp = current_composition() if self._scoped else None
        if comp is not None:
            comp._add_member(self)
        if input_type is not None:
            self.set_input_type(input_type)
        if output_type is not None:
            self.set_output_type(output_type)

    # ----------------------------------------------------------------- naming
    @property
    def name(self) -> str | None:
        return self._name

    def __repr__(self) -> str:
        cls = type(self).__name__
        return f"{cls}({self._name!r})" if self._name else cls

    def __str__(self) -> str:
        """The block tree, one block a line with its types (``print(model)``).

        Examples:
            >>> import fold as fd
            >>> print(fd.Map(fd.Scalar()) >> fd.Length())
            Pipe: PyObjectType() -> TensorType((), 'float32')
              Map: PyObjectType() -> SequenceType(TensorType((), 'float32'))
                Scalar: PyObjectType() -> TensorType((), 'float32')
              Length: SequenceType(TensorType((), 'float32')) -> TensorType((), 'float32')
        """
        lines: list[str] = []
        seen: set[int] = set()

        def show(block: Block, depth: int) -> None:
            again = id(block) in seen
            seen.add(id(block))
            types = f"{block.input_type or '?'} -> {block.output_type or '?'}"
            lines.append(f"{'  ' * depth}{block!r}: {types}{' (shown above)' if again and block.children() else ''}")
            if not again:
                for child in block.children():
                    show(child, depth + 1)

        show(self, 0)
        return "\n".join(lines)

    def _path_name(self) -> str:
        return repr(self)

    # ------------------------------------------------------------------ types
    @property
    def input_type(self) -> Type | None:
        return self._input_type

    @property
    def output_type(self) -> Type | None:
        return self._output_type

    def set_input_type(self, input_type: TypeLike) -> Block:
        """Pins the input type; a conflict with a known type is a TypeError."""
        t = convert_to_type(input_type)
        if self._input_type is None:
            self._check_input(t)
            self._input_type = t
            self._changed()
        elif self._input_type != t:
            raise TypeError(f"{self!r} has input type {self._input_type} and cannot take input type {t}")
        return self

    def set_output_type(self, output_type: TypeLike) -> Block:
        """Pins the output type; a conflict with a known type is a TypeError."""
        t = convert_to_type(output_type)
        if self._output_type is None:
            self._check_output(t)
            self._output_type = t
            self._changed()
        elif self._output_type != t:
            raise TypeError(f"{self!r} has output type {self._output_type} and cannot produce output type {t}")
        return self

    def _check_input(self, t: Type) -> None:
        """Raises TypeError when this block can never take input type ``t``."""

    def _check_output(self, t: Type) -> None:
        """Raises TypeError when this block can never produce output type ``t``."""

    def _infer(self) -> None:
        """Propagates known types between this block and its children."""

    def untyped_hint(self) -> str | None:
        """Why this block's types cannot be inferred and what to declare, when it knows (the
        compiler's error for a model with unknown types then says it); None otherwise."""
        return None

    def mismatch_hint(self, side: str) -> str | None:
        """What to write instead when a type mismatch involves this block's ``side`` (``"input"``
        or ``"output"``) type, when it knows (the mismatch's message then says it); None otherwise."""
        return None

    def _changed(self) -> None:
        # Recursive up to ``_PROPAGATION_DEPTH`` levels, a worklist below: in a chain of a thousand
        # ``>>`` (or a hundred nested ``GetItem``s) a type set at one end reaches the other
        # through every block between, each level several Python frames (RecursionError). Above
        # that depth, a mismatch is explained by the blocks where it arises, as always.
        depth: int = getattr(_propagation, "depth", 0)
        if depth >= _PROPAGATION_DEPTH:
            _propagation.pending.extend([self, *self._listeners])
            return
        drains = depth == _PROPAGATION_DEPTH - 1
        _propagation.depth = depth + 1
        if drains:
            _propagation.pending = []
        try:
            for block in [self, *self._listeners]:
                if block._ready:
                    block._infer()
            while drains and _propagation.pending:
                block = _propagation.pending.pop(0)
                if block._ready:
                    block._infer()
        finally:
            _propagation.depth = depth
            if drains:
                _propagation.pending = []

    def _listen(self, child: Block) -> None:
        if self not in child._listeners:
            child._listeners.append(self)

    # ----------------------------------------------------------------- wiring
    def _adopt(self, like: BlockLike) -> Block:
        """Makes ``like`` (a block-like) a child of this block."""
        child = convert_to_block(like)
        if child._parent is not None and not child._parent._refers_to_children:
            raise ValueError(
                f"{outline(child)} is already used inside {outline(child._parent)} and cannot also go "
                f"into this {type(self).__name__}: a block may appear in one place only. Build one block per place (a "
                "function that returns a new block, called once per place); a layer may be shared "
                "(its uses share its parameters)"
            )
        if child._composition is not None:
            if child._composition._is_wired(child):
                raise ValueError(
                    f"{child!r} is wired inside a Composition and cannot also be a child of "
                    f"{self!r}: wire the whole chain, `(a >> b).reads(x)`, or let the next block "
                    "read it, `b.reads(a.reads(x))`"
                )
            child._composition._remove_member(child)
        child._parent = self
        self._listen(child)
        return child

    def children(self) -> list[Block]:
        """The direct child blocks."""
        return []

    def __rshift__(self, other: BlockLike) -> Block:
        from fold.blocks.plumbing import Pipe

        return Pipe(self, other)

    def __rrshift__(self, other: BlockLike) -> Block:
        from fold.blocks.plumbing import Pipe

        return Pipe(other, self)

    def __getitem__(self, key: Hashable) -> Block:
        from fold.blocks.plumbing import GetItem, Pipe

        comp = current_composition() or self._composition
        if comp is not None:
            return GetItem(key).reads(self)
        return Pipe(self, GetItem(key))

    def reads(self, *others: BlockLike) -> Block:
        """Wires the outputs of ``others`` to this block's input inside a Composition."""
        comp = current_composition()
        if comp is None:
            for o in (self, *others):
                if isinstance(o, Block) and o._composition is not None:
                    comp = o._composition
                    break
        if comp is None:
            raise ValueError(f"{self!r}.reads() must be called inside `with composition.scope():`")
        comp._connect(self, others)
        return self

    # ------------------------------------------------------------ host walk
    def _host_leaf(self, x: HostValue, ctx: HostContext) -> HostValue:
        """Leaf blocks compute their host output here."""
        raise TypeError(f"{self!r} is not a leaf block")

    def _host(self, x: HostValue, ctx: HostContext) -> HostWalk:
        """Composite blocks yield ``(child, input, label)`` and return their output."""
        raise TypeError(f"{self!r} defines no host walk")
        yield  # pragma: no cover

    def _emit(self, em: EmitContext, x: str) -> str:
        """Emits this block's host work on variable ``x`` into a host plan; returns the result's variable.

        ``em`` is the plan's emitter (``fold/blocks/host.py``). The default runs
        ``_host_leaf`` (leaves) or the generic walk (composites); blocks on
        hot paths emit straight-line code doing the same work in the same
        order as their ``_host``.
        """
        return em.leaf(self, x) if self._leaf else em.walk(self, x)

    # -------------------------------------------------------------- notebook
    def eval(self, example: PyObject, params: Params | None = None) -> PyObject:
        """Evaluates the block on one example (for notebooks and tests).

        Tensors come back as NumPy arrays, tuples as tuples, sequences as
        lists, broadcast sequences as ``itertools.repeat`` and void as None.
        A block containing ``Metric``s returns ``(output, {name: [values]})``.
        With ``params=None`` the parameters are initialised from
        ``jax.random.key(0)``.

        Args:
          example: one input of this block's input type.
          params: parameters from ``Compiler.for_eval(block).init``, or None.

        Returns:
          The output as host values (see above).

        Raises:
          KeyError, TypeError, ValueError, OverflowError: a malformed example,
            as ``Compiler.build_batch`` raises it.
          TypeError: the block's types do not check, as ``Compiler.create``
            raises it.

        Examples:
            >>> import fold as fd
            >>> float(fd.Scalar().eval(3))
            3.0
        """
        return self._compiler_for_eval().eval_one(example, params)

    def max_depth(self, example: PyObject) -> int:
        """The depth of ``example``'s schedule: constants 0, each operation 1 + its inputs."""
        return self._compiler_for_eval().max_depth(example)

    def _compiler_for_eval(self) -> Compiler:
        # The one import from the blocks to the compiler (docs/design.md): ``eval`` runs a block
        # the way Fold's ``block.eval`` does, through a whole compiler. It happens at call time,
        # so loading the blocks never loads the compiler.
        from fold.compiler.compiler import Compiler

        if self._eval_compiler is None:
            self._eval_compiler = Compiler.for_eval(self)
        return self._eval_compiler


def _side_type(block: Block, side: str) -> Type | None:
    return block.input_type if side == "input" else block.output_type


def unify(a: Block, a_side: str, b: Block, b_side: str) -> None:
    """Makes ``a``'s ``a_side`` type equal to ``b``'s ``b_side`` type.

    Raises a TypeError naming both blocks and both types on a mismatch.
    """
    ta, tb = _side_type(a, a_side), _side_type(b, b_side)
    if ta is None and tb is None:
        return
    if ta is not None and tb is not None:
        if ta != tb:
            raise type_error(a, ta, b, tb, f"has {a_side} type", f"{b_side} type of {b!r}", side=b_side)
        return
    # One side is known: set the other, and name both if that fails further on.
    target, side, t = (b, b_side, ta) if ta is not None else (a, a_side, tb)
    shown_a, shown_b = ("(unknown)" if x is None else x for x in (ta, tb))
    set_type(target, side, t, lambda e: type_error(a, shown_a, b, shown_b, f"has {a_side} type", str(e)))


def set_child(owner: Block, t: Type, child: Block, side: str, what: str) -> None:
    """Sets ``child``'s ``side`` type to ``t``, explaining a conflict with both blocks."""
    # Stored types are canonical (a tuple of PyObjects is a PyObject): compare like with like.
    t = convert_to_type(t)
    cur = child.input_type if side == "input" else child.output_type
    if cur is not None:
        if cur != t:
            raise type_error(owner, t, child, cur, f"needs {what} of type", f"{side} type of {child!r}", side=side)
        return
    set_type(child, side, t, lambda e: type_error(owner, t, child, "(unknown)", f"gives {what} of type", str(e)))


def convert_to_block(x: BlockLike) -> Block:
    """Converts a block-like to a block.

    A block is returned as is; a dict is a ``Record`` (sorted keys; an
    ``OrderedDict`` keeps its order); a tuple or list is a positional
    ``Record``; a NumPy or JAX array (or NumPy scalar) is a ``FromTensor`` constant; a layer
    is wrapped in a ``Function``.
    """
    import numpy as np

    from fold.blocks.layers import Layer

    if isinstance(x, Block):
        return x
    if isinstance(x, Layer):
        from fold.blocks.tensors import Function

        return Function(x)
    if isinstance(x, (dict, tuple, list)):
        from fold.blocks.plumbing import Record

        return Record(x)
    if isinstance(x, (np.ndarray, np.generic)) or _is_jax_array(x):
        from fold.blocks.inputs import FromTensor

        return FromTensor(x)
    raise TypeError(f"cannot convert {x!r} (of type {type(x).__name__}) to a block")


def _is_jax_array(x: object) -> bool:
    import jax

    return isinstance(x, jax.Array)


def is_block_like(x: object) -> bool:
    """True for anything ``convert_to_block`` accepts."""
    import numpy as np

    from fold.blocks.layers import Layer

    return isinstance(x, (Block, Layer, dict, tuple, list, np.ndarray, np.generic)) or _is_jax_array(x)

