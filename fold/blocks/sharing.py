"""``Shared``: a sub-structure reached several times is computed once (DAG inputs, graph models).

Fold walks every input as a tree: an object reached along two paths is
walked, and computed, twice. ``Shared`` wraps a block and remembers, per
batch, what it returned for each key (the input object's identity, or a
key computed from it): a second arrival reuses the first's host value, so
its tensors are the same rows of the batch and every reader reads them.
The scheduler already gives a value read by several nodes one row and
sums its cotangents over the readers, so gradients are exact; a node's
depth is one more than its deepest input's, its longest path to a leaf.

The memo lives in the builder's ``block_cache`` with the example's entries,
so a failed example's entries are rolled back with the rest of its work.
"""

from __future__ import annotations

import reprlib
from collections.abc import Callable, Hashable
from typing import TypeAlias

from fold.blocks.base import Block, run_leaf, unify
from fold.blocks.host import BlockLike, EmitContext, HostContext, HostValue, HostWalk
from fold.typing import PyObject

__all__ = ["Shared"]


class _InProgress:
    """The memo's entry while its node is being computed: meeting it again is a cycle."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<in progress>"


_IN_PROGRESS = _InProgress()

# A node's ``block_cache`` key: the ``Shared`` block's id, the example (None across examples), its key.
_MemoKey: TypeAlias = "tuple[int, int | None, Hashable]"


class Shared(Block):
    """Computes ``block`` once per distinct input in a batch; later uses read the same rows.

    By default an input is "the same" when it is the same Python object
    (``key=None``, identity); give ``key``, a function of the input returning
    a hashable, to name nodes yourself (a node id, ``(vertex, round)`` in a
    graph network). Sharing is within one example unless
    ``across_examples=True``, which also shares equal keys between the
    examples of a batch (examples recorded apart with ``compiler.record``
    then share only within themselves).

    A shared node is one computation: its tensors are one set of rows, its
    gradient is the sum over its uses, a dropout inside it draws once, and a
    ``Metric`` inside it records one entry. A node whose computation reaches
    itself (a cycle in the input) is a ``ValueError`` naming the example,
    the block path and the key.

    Examples:
        >>> import fold as fd
        >>> decl = fd.ForwardDeclaration(fd.PyObjectType(), fd.TensorType(()))
        >>> leaf = fd.Scalar()
        >>> node = fd.Record((decl(), decl())) >> fd.Function(lambda a, b: a + b)
        >>> expr = fd.Shared(fd.OneOf(lambda x: isinstance(x, tuple), {False: leaf, True: node}))
        >>> decl.resolve_to(expr)
        >>> x = (1.0, 2.0)
        >>> for _ in range(40):  # 2**40 paths, 41 distinct nodes
        ...     x = (x, x)
        >>> float(expr.eval(x))
        3298534883328.0
        >>> compiler = fd.Compiler.create(expr)
        >>> compiler.build_batch([x]).stats.num_nodes  # one addition per distinct node
        41
    """

    def __init__(self, block: BlockLike, key: Callable[[PyObject], Hashable] | None = None,
                 across_examples: bool = False, name: str | None = None):
        if key is not None and not callable(key):
            raise TypeError(f"Shared key must be a function of the input or None (identity), got {key!r}")
        if not isinstance(across_examples, bool):
            raise TypeError(f"Shared across_examples must be a bool, got {across_examples!r}")
        super().__init__(name)
        self.key_fn = key
        self.across_examples = across_examples
        self.block = self._adopt(block)

    def __repr__(self) -> str:
        return f"Shared({self.block!r})" if self._name is None else super().__repr__()

    def children(self) -> list[Block]:
        return [self.block]

    def _infer(self) -> None:
        unify(self, "input", self.block, "input")
        unify(self, "output", self.block, "output")

    def _memo_key(self, x: PyObject, ctx: HostContext) -> _MemoKey:
        """The ``block_cache`` key of input ``x``: this block, the example (unless shared across
        examples) and the input's key."""
        # The memo keeps ``x`` alive, so its id is not reused in the batch.
        node: Hashable = id(x) if self.key_fn is None else self.key_fn(x)
        return id(self), None if self.across_examples else ctx.example_index, node

    def _reuse(self, hit: tuple[PyObject, HostValue] | _InProgress, memo_key: _MemoKey) -> HostValue:
        """The remembered value, or the cycle error when its node is still being computed."""
        if hit is _IN_PROGRESS:
            raise ValueError(f"{self!r}: the input with key {reprlib.repr(memo_key[2])} is reached again while "
                             "it is being computed: the input has a cycle (a node among its own inputs)")
        assert isinstance(hit, tuple)
        return hit[1]

    def _host(self, x: HostValue, ctx: HostContext) -> HostWalk:
        memo_key = self._memo_key(x, ctx)
        try:
            hit = ctx.block_cache.get(memo_key)
        except TypeError:  # the plan's lookup raises it too, and falls back to this walk for the message
            raise TypeError(f"{self!r}: key {reprlib.repr(memo_key[2])} is unhashable") from None
        if hit is not None:
            return self._reuse(hit, memo_key)
        ctx.block_cache[memo_key] = _IN_PROGRESS
        out = run_leaf(self.block, x, ctx, "Shared") if self.block._leaf else (yield self.block, x, "Shared")
        ctx.block_cache[memo_key] = (x, out)
        return out

    def _emit(self, em: EmitContext, x: str) -> str:
        key = em.assign(f"{em.bind(self._memo_key, 'memokey')}({x}, ctx)")
        hit = em.assign(f"ctx.block_cache.get({key})")
        out = em.var()

        def compute() -> None:
            em.line(f"ctx.block_cache[{key}] = {em.bind(_IN_PROGRESS, 'inprogress')}")
            em.line(f"{out} = {em.emit(self.block, x)}")
            em.line(f"ctx.block_cache[{key}] = ({x}, {out})")

        em.branches([(f"{hit} is None", compute),
                     (None, lambda: em.line(f"{out} = {em.bind(self._reuse, 'reuse')}({hit}, {key})"))])
        return out
