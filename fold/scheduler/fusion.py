"""Consecutive operations of a pipe fused into one: ``Concat() >> FC(64)`` runs as one operation.

Every operation call is a node: it gets arena rows for its outputs, a depth, and a place in a
loop work item, and every operation of a model is a branch of the loop that XLA compiles. In
``a >> b`` of two operations, ``b`` reads only ``a``'s output, so the two can run as one
operation ``b(a(x))`` with no node, arena rows or depth for ``a``'s output: a Fold cell written
``Concat() >> FC(n)`` then takes one loop iteration per step instead of two, and a model of many
small functions (``Scalar() >> Function(f) >> FC(n)``) compiles fewer branches.

A *run* is a maximal sequence of ``Function`` and ``Concat`` blocks that follow each other in a
pipe (nested pipes flattened); it is cut so that each fused operation has at most one layer
(its parameters stay ``params[layer name]``). Fusion changes what the device computes, not
what it returns. Depths count a fused operation once, so ``Compiler.for_eval`` (``eval``,
``max_depth``) does not fuse: depths there are Fold's.
"""

from __future__ import annotations

import jax

from fold.blocks.base import Block
from fold.blocks.host import EmitContext, HostContext, HostValue, Step
from fold.blocks.plumbing import Pipe
from fold.blocks.tensors import Concat, Function, OpSpec
from fold.typing import PyTree

__all__ = ["Fused", "fuse_pipes"]


class Fused:
    """Operation blocks that run one after another in a pipe, run as one operation."""

    _leaf = True

    def __init__(self, blocks: list[Block]):
        self.blocks = tuple(blocks)

    def __repr__(self) -> str:
        return " >> ".join(repr(b) for b in self.blocks)

    def _path_name(self) -> str:
        # Errors of a call are about its inputs, which the first member reads.
        return self.blocks[0]._path_name()

    def _host_leaf(self, x: HostValue, ctx: HostContext) -> HostValue:
        return ctx.call(self, x)

    def _emit(self, em: EmitContext, x: str) -> str:
        return em.call(self, x)

    def op_spec(self) -> OpSpec:
        """The members' operations composed (their types must be known)."""
        specs = [b.op_spec() for b in self.blocks]  # type: ignore[attr-defined]
        layered = [s for s in specs if s.layer is not None]

        def run(params: PyTree, rng: jax.Array | None, *flat: jax.Array) -> list[jax.Array]:
            for s in specs:
                flat = s.fn(params if s.layer is not None else None, rng, *flat)
            return list(flat)

        own = layered[0] if layered else None
        return OpSpec(("fused", *(s.key for s in specs)), repr(self), specs[0].in_type, specs[-1].out_type, run,
                      own.layer if own else None, own.in_type if own else None, own is specs[0])


def _is_op(b: Block) -> bool:
    return isinstance(b, (Function, Concat))


def _has_layer(b: Block) -> bool:
    return isinstance(b, Function) and b.layer is not None


def _steps(pipe: Pipe) -> list[Step]:
    """``pipe``'s flattened blocks with each run of operations cut into fused ones."""
    steps: list[Step] = []
    run: list[Block] = []

    def close() -> None:
        steps.extend([Fused(run)] if len(run) > 1 else run)
        run.clear()

    for b in pipe.stages():
        if not _is_op(b):
            close()
            steps.append(b)
            continue
        if _has_layer(b) and any(map(_has_layer, run)):
            close()
        run.append(b)
    close()
    return steps


def fuse_pipes(blocks: list[Block]) -> dict[Block, list[Step]]:
    """For every outermost pipe among ``blocks`` that has a run of operations to fuse, the steps
    it runs (a pipe inside a pipe never runs: its parent runs its blocks)."""
    nested = {id(c) for b in blocks if isinstance(b, Pipe) for c in b.children() if isinstance(c, Pipe)}
    out: dict[Block, list[Step]] = {}
    for b in blocks:
        if isinstance(b, Pipe) and id(b) not in nested:
            steps = _steps(b)
            if any(isinstance(s, Fused) for s in steps):
                out[b] = steps
    return out
