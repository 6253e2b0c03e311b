"""``Composition``: blocks wired into an arbitrary DAG with ``reads``.

Examples:
    >>> import fold as fd
    >>> c = fd.Composition()
    >>> with c.scope():
    ...     x = fd.Scalar().reads(c.input)
    ...     y = fd.Function(lambda a, b: a * b).reads(x, x)
    ...     _ = c.output.reads(y)
    >>> float(c.eval(3))
    9.0
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from fold.blocks.base import Block, convert_to_block, run_leaf, scope_stack, unify
from fold.blocks.host import BlockLike, EmitContext, HostContext, HostValue, HostWalk
from fold.blocks.types import TupleType, VoidType, convert_to_type, holds_only_voids
from fold.errors import set_type, type_error

__all__ = ["Composition"]


class _Port(Block):
    """The input or output placeholder of a Composition (an identity)."""

    _leaf = True
    _scoped = False

    def __init__(self, owner: Composition, role: str):
        self._owner = owner
        self._role = role
        super().__init__()
        self._composition = owner

    def __repr__(self) -> str:
        return f"{self._owner!r}.{self._role}"

    def _infer(self) -> None:
        unify(self, "input", self, "output")
        if self._owner._ready:
            self._owner._infer()

    def _host_leaf(self, x: HostValue, ctx: HostContext) -> HostValue:
        return x


class Composition(Block):
    """A DAG of blocks: ``with c.scope():`` then ``block.reads(*sources)``.

    ``c.input`` is the composition's input, ``c.output.reads(...)`` sets its
    output; ``block[i]`` picks item ``i`` of a tuple-valued block. Reading
    several sources gives the reader a tuple. A block that is created in
    the scope but never read (unless its output is void, like ``Metric``),
    a cycle, or wiring a block's input twice is an error.
    """

    def __init__(self, children: BlockLike = None, name: str | None = None):
        super().__init__(name)
        self._members: list[Block] = []
        self._sources: dict[Block, tuple[Block, ...]] = {}
        self._order: list[tuple[Block, tuple[Block, ...]]] | None = None
        self.input = _Port(self, "input")
        self.output = _Port(self, "output")
        self._listen(self.input)
        self._listen(self.output)
        for c in children or ():
            self._add_member(convert_to_block(c))

    @contextlib.contextmanager
    def scope(self) -> Iterator[Composition]:
        """Blocks created or wired inside this context belong to this composition."""
        stack = scope_stack()
        stack.append(self)
        try:
            yield self
        finally:
            stack.pop()

    def children(self) -> list[Block]:
        return list(self._members)

    # --------------------------------------------------------------- members
    def _add_member(self, b: Block) -> None:
        if b._composition is self:
            return
        if b._composition is not None:
            raise ValueError(f"{b!r} already belongs to {b._composition!r}")
        if b._parent is not None:
            raise ValueError(f"{b!r} is already used inside {b._parent!r}")
        b._composition = self
        self._members.append(b)
        self._listen(b)
        self._order = None

    def _remove_member(self, b: Block) -> None:
        self._members.remove(b)
        b._composition = None
        if self in b._listeners:
            b._listeners.remove(self)
        self._order = None

    def _is_wired(self, b: Block) -> bool:
        return b in self._sources or any(b in srcs for srcs in self._sources.values())

    def connect(self, a: BlockLike, b: BlockLike) -> None:
        """Feeds ``a`` to the input of ``b`` (Fold's ``Composition.connect``; ``b.reads(a)`` inside
        ``scope()`` is the same).

        Args:
          a: a block, an output of one (``block[k]``), ``self.input``, or a tuple or list of
            them (``b`` then reads their tuple).
          b: the block whose input is wired; blocks not yet members join the composition.

        Raises:
          ValueError: ``a`` includes ``self.output``, ``b`` is ``self.input``, ``b``'s input is
            already wired, or a block belongs to another composition.
        """
        others = tuple(a) if isinstance(a, (tuple, list)) else (a,)
        self._connect(convert_to_block(b), others)

    def _connect(self, dst: Block, others: tuple[BlockLike, ...]) -> None:
        if dst is self.input:
            raise ValueError(f"cannot wire the input of {self!r}: it is written by the caller")
        if not others:
            raise ValueError(f"{dst!r}.reads() needs at least one source")
        if dst._parent is not None:
            raise ValueError(f"{dst!r} is already used inside {dst._parent!r}")
        if dst in self._sources:
            raise ValueError(
                f"{dst!r} already reads from {self._sources[dst]!r}; a block's input can be wired once"
            )
        srcs = []
        for o in others:
            if isinstance(o, (tuple, list)) and not isinstance(o, Block):
                raise TypeError(f"{dst!r}.reads() takes blocks, not {type(o).__name__}; pass them as arguments")
            o = convert_to_block(o)
            if o is self.output:
                raise ValueError(f"cannot read from the output of {self!r}")
            if o is not self.input:
                self._add_member(o)
            srcs.append(o)
        if dst is not self.output:
            self._add_member(dst)
        self._sources[dst] = tuple(srcs)
        self._order = None
        self._infer()

    # ----------------------------------------------------------------- types
    def _infer(self) -> None:
        unify(self, "input", self.input, "output")
        unify(self, "output", self.output, "input")
        for dst, srcs in list(self._sources.items()):
            if len(srcs) == 1:
                unify(srcs[0], "output", dst, "input")
                continue
            outs = [s.output_type for s in srcs]
            t = dst.input_type
            if all(o is not None for o in outs):
                tup = convert_to_type(TupleType(*outs))  # stored types are canonical
                if t is None:
                    set_type(dst, "input", tup, lambda e, src=srcs[0], tup=tup, dst=dst: type_error(  # type: ignore[misc]
                        src, tup, dst, "(unknown)", "and the other sources give", str(e)))
                elif t != tup:
                    raise type_error(srcs[0], tup, dst, t, "and the other sources give", "input type", side="input")
            elif isinstance(t, TupleType) and len(t) == len(srcs):
                for s, item in zip(srcs, t):
                    if s.output_type is None:
                        s.set_output_type(item)

    # ------------------------------------------------------------ validation
    def _validate(self) -> None:
        """Checks wiring and computes the evaluation order (at Compiler.create)."""
        if self.output not in self._sources:
            raise TypeError(f"the output of {self!r} is not wired: call {self!r}.output.reads(...)")  # as Fold
        for m in self._members:
            if m not in self._sources:  # reads nothing: gets no input, as in Fold
                if m.input_type is None:
                    m.set_input_type(VoidType())
                elif not isinstance(m.input_type, VoidType):
                    raise TypeError(f"{m!r} in {self!r} reads nothing, but it takes {m.input_type}: wire its input "
                                    "with .reads() (only blocks that take no input, such as FromTensor, may read "
                                    "nothing)")
        read = {s for srcs in self._sources.values() for s in srcs}
        for m in self._members:
            if m not in read and not isinstance(m.output_type, VoidType):
                # A Map of metrics outputs a sequence of voids: Fold refuses it unread too, and users meet it.
                t = m.output_type
                fix = ("it holds only voids (metrics, say): end it with >> fd.Void()"
                       if t is not None and holds_only_voids(t)
                       else "wire it with .reads() or remove it")
                raise TypeError(f"{m!r} in {self!r} is never read: its output ({m.output_type}) is unused; {fix}")
        self._order = self._topological_order()

    def _topological_order(self) -> list[tuple[Block, tuple[Block, ...]]]:
        nodes = list(self._members) + [self.output]
        pending = {n: {s for s in self._sources.get(n, ()) if s is not self.input} for n in nodes}
        order: list[tuple[Block, tuple[Block, ...]]] = []
        done: set[Block] = set()
        while pending:
            ready = [n for n, deps in pending.items() if deps <= done]
            if not ready:
                cycle = ", ".join(repr(n) for n in pending)
                raise ValueError(f"{self!r} has a cycle among: {cycle}")
            for n in ready:
                del pending[n]
                done.add(n)
                order.append((n, self._sources.get(n, ())))
        return order

    def _host(self, x: HostValue, ctx: HostContext) -> HostWalk:
        if self._order is None:
            self._validate()
        vals: dict[Block, HostValue] = {self.input: x}
        for b, srcs in self._order:  # type: ignore[union-attr]
            if not srcs:
                inp = None
            elif len(srcs) == 1:
                inp = vals[srcs[0]]
            else:
                inp = tuple(vals[s] for s in srcs)
            if b is self.output:
                vals[b] = inp
            else:
                vals[b] = run_leaf(b, inp, ctx) if b._leaf else (yield b, inp, None)
        return vals[self.output]

    def _emit(self, em: EmitContext, x: str) -> str:
        if self._order is None:
            self._validate()
        vals: dict[Block, str] = {self.input: x}
        for b, srcs in self._order:  # type: ignore[union-attr]
            if not srcs:
                inp = "None"
            elif len(srcs) == 1:
                inp = vals[srcs[0]]
            else:
                inp = em.tuple([vals[s] for s in srcs])
            vals[b] = inp if b is self.output else em.emit(b, inp)
        return vals[self.output]
