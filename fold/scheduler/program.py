"""``Program``: a compiled model as plain data, the contract the scheduler and executor read.

The batch builder, the host plan, the scheduler and the executor read a model
only through its ``Program``: the arena types, the operations with their arena
slots, which block calls which operation, the layers and metrics. It is frozen
and holds no derived machinery: ``fold.compiler.build.build_program`` makes one
from a block tree, and the host plan is derived from it on first use
(``fold.scheduler.plan.host_plan``).

Examples:
    >>> import fold as fd
    >>> from fold.compiler.build import build_program
    >>> program = build_program(fd.Map(fd.Vector(2) >> fd.FC(4, name="fc")) >> fd.Sum())
    >>> program.types
    (TensorType((4,), 'float32'), TensorType((2,), 'float32'))
    >>> [op.spec.label for op in program.ops], sorted(program.layers)
    (['Function(FC)', 'Function(add)'], ['fc'])
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

from fold.blocks.base import Block
from fold.blocks.host import DEFAULT_LIMITS, ExampleLimits, OpBlock, Step
from fold.blocks.layers import Layer
from fold.blocks.tensors import OpFn, OpSpec
from fold.blocks.types import TensorType, Type

__all__ = ["Program", "CompiledOp", "ExampleLimits", "DEFAULT_LIMITS", "Slot"]

Slot = tuple[int, int]
"""``(type, k)``: the k-th value of arena type ``type`` among an operation's inputs or outputs."""


@dataclasses.dataclass(frozen=True, eq=False)
class CompiledOp:
    """An operation (``OpSpec``) with its arena slots resolved.

    Attributes:
      spec: what the operation computes and its types.
      in_tidx, out_tidx: arena (type) index of each input and output.
      in_slots, out_slots: ``(type, k)`` of each input and output (``Slot``).
      fn: ``spec.fn`` returning each distinct output once: the outputs above,
        ``out_tidx`` and ``out_slots`` (``fold/compiler/outputs.py``).
      out_leaves: per output of ``spec`` (``spec.out_types``), the index of
        its value among ``fn``'s outputs: where two are one value they share
        an arena slot, so readers of either read one row.
      in_paths: index path of each tensor input in the host value it takes.
      check_inputs: the layer's check of constant inputs, where the layer
        reads the operation's own inputs and overrides the check; else None.
    """

    spec: OpSpec
    in_tidx: tuple[int, ...]
    out_tidx: tuple[int, ...]
    in_slots: tuple[Slot, ...]
    out_slots: tuple[Slot, ...]
    fn: OpFn
    out_leaves: tuple[int, ...]
    in_paths: tuple[tuple[int, ...], ...]
    check_inputs: Callable[..., None] | None

    @property
    def out_types(self) -> tuple[TensorType, ...]:
        """The types of ``fn``'s outputs."""
        return tuple(self.spec.out_types[self.out_leaves.index(d)] for d in range(len(self.out_tidx)))

    @property
    def layer(self) -> Layer | None:
        """The layer whose parameters the operation reads, or None."""
        return self.spec.layer


@dataclasses.dataclass(frozen=True, eq=False)
class Program:
    """A compiled model: everything the builder, scheduler and executor read of it.

    Attributes:
      root: the root block (its input type set).
      output_type: the root's output type.
      types: the arena types: every tensor type any block takes or gives.
      type_index: position of each type in ``types``.
      ops: the operations, merged by ``OpSpec.key`` (equal functions batch).
      block_ops: per operation block (or fused run), its index in ``ops``.
      slot_index: per output slot ``(type, k)`` any operation has, its
        column in the scheduler's out-start tables.
      pipe_steps: per pipe with fused runs, its steps (blocks and fused runs).
      layers: per layer name, the layer and its input type.
      layer_seeds: per layer name, what its initial values are drawn under: its
        own name if it was given one, else its class's numbered among the
        model's layers (``fc``, ``fc_1``, ...), so that they do not depend on
        how many layers the process made before.
      metric_types: per metric name (sorted), the tensor type of its values.
      labeled_metrics: the metric names some ``Metric`` records with labels.
      root_leaves: the tensor types of the root's output leaves, in order
        (empty when the root outputs void or is not tensors, under ``eval``).
      limits: bounds on one example's host work (``ExampleLimits``).
    """

    root: Block
    output_type: Type
    types: tuple[TensorType, ...]
    type_index: Mapping[TensorType, int]
    ops: tuple[CompiledOp, ...]
    block_ops: Mapping[OpBlock, int]
    slot_index: Mapping[Slot, int]
    pipe_steps: Mapping[Block, Sequence[Step]]
    layers: Mapping[str, tuple[Layer, Type]]
    layer_seeds: Mapping[str, str]
    metric_types: Mapping[str, TensorType]
    labeled_metrics: frozenset[str]
    root_leaves: tuple[TensorType, ...]
    limits: ExampleLimits = DEFAULT_LIMITS

    def steps(self, pipe: Block) -> Sequence[Step]:
        """The blocks ``pipe`` runs: its children, or its children with runs of operations fused."""
        return self.pipe_steps.get(pipe) or pipe.children()
