"""Building a ``Program`` from a block tree, in small named steps.

``build_program`` validates and type-checks the tree, lists the arena types,
fuses runs of operations in pipes, merges equal operations and names the
layers; the result is the plain data of ``fold/scheduler/program.py``.

Examples:
    >>> import fold as fd
    >>> program = build_program(fd.Map(fd.Vector(2) >> fd.FC(4, name="fc")) >> fd.Sum())
    >>> [op.spec.label for op in program.ops], sorted(program.layers)
    (['Function(FC)', 'Function(add)'], ['fc'])
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence

from fold.blocks.base import Block, convert_to_block
from fold.blocks.composition import Composition
from fold.blocks.control import ForwardDeclaration, Metric
from fold.blocks.host import DEFAULT_LIMITS, BlockLike, ExampleLimits, OpBlock, Step
from fold.blocks.layers import Layer, numbered_names
from fold.blocks.tensors import Concat, Function, OpSpec
from fold.blocks.types import (
    PyObjectType,
    TensorType,
    Type,
    VoidType,
    holds_only_voids,
    is_tensor_tree,
    tensor_types,
)
from fold.compiler.outputs import distinct_fn, first_outputs, output_leaves
from fold.scheduler.fusion import Fused, fuse_pipes
from fold.scheduler.plan import leaf_paths
from fold.scheduler.program import CompiledOp, Program, Slot

__all__ = ["build_program", "root_is_tensors"]


def build_program(root_block: BlockLike, any_root: bool = False, fuse: bool = True,
                  limits: ExampleLimits = DEFAULT_LIMITS) -> Program:
    """Validates and type-checks ``root_block`` and compiles it to a ``Program``.

    Args:
      root_block: a block, or anything ``convert_to_block`` takes.
      any_root: accept any root output type (``Block.eval``); else the root
        must output tensors, tuples of them, or void with a ``Metric``.
      fuse: run each run of operations in a pipe as one (``fusion.py``).
      limits: bounds on one example's host work.

    Returns:
      The frozen ``Program``.

    Raises:
      TypeError: a type cannot be inferred, does not check, or the root or a
        layer or metric is used with types it cannot have; an unresolved
        ``ForwardDeclaration``, an unwired ``Composition`` output or an
        unread block output (as in Fold).
      ValueError: a cycle in a ``Composition``, or two layers with one name.
    """
    root, blocks = _checked_tree(root_block, any_root)
    types = tuple(dict.fromkeys(t for b in blocks for side in (b.input_type, b.output_type)
                                for t in tensor_types(side)))
    type_index = {t: i for i, t in enumerate(types)}
    pipe_steps = fuse_pipes(blocks) if fuse else {}
    ops, block_ops = _operations(blocks, pipe_steps, type_index)
    slot_index: dict[tuple[int, int], int] = {}
    for op in ops:
        for slot in op.out_slots:
            slot_index.setdefault(slot, len(slot_index))
    out = root.output_type
    assert out is not None  # _checked_tree checked every type
    layers = _named_layers(ops)
    for layer, _ in layers.values():
        layer._freeze()
    return Program(
        root=root, output_type=out, types=types, type_index=type_index, ops=ops, block_ops=block_ops,
        slot_index=slot_index, pipe_steps=pipe_steps, layers=layers, layer_seeds=_layer_seeds(layers),
        metric_types=_metric_types(blocks),
        labeled_metrics=frozenset(b.metric_name for b in blocks if isinstance(b, Metric) and b.labeled),
        root_leaves=tuple(out.tensor_leaves()) if root_is_tensors(out) else (), limits=limits,
    )


def root_is_tensors(t: Type) -> bool:
    """Whether a compiled root may output ``t``: tensors, void, or non-empty tuples of them."""
    return is_tensor_tree(t, empty_tuples=False)


def _all_blocks(root: Block) -> list[Block]:
    """Every block reachable from ``root`` (children, declarations), in DFS order."""
    seen: set[int] = set()
    order: list[Block] = []
    stack = [root]
    while stack:
        b = stack.pop()
        if id(b) in seen:
            continue
        seen.add(id(b))
        order.append(b)
        stack.extend(reversed(b.children()))
    return order


def _checked_tree(root_block: BlockLike, any_root: bool) -> tuple[Block, list[Block]]:
    """The root block and every block of its tree, every type known and the root's allowed."""
    root = convert_to_block(root_block)
    if root.input_type is None:
        root.set_input_type(PyObjectType())
    for b in _all_blocks(root):
        if isinstance(b, ForwardDeclaration) and b.target is None:
            raise TypeError(f"{b!r} was never resolved: call resolve_to(block)")  # a TypeError, as in Fold
        if isinstance(b, ForwardDeclaration) and (b is root or b._parent is not None):
            raise TypeError(f"{b!r} is used as a block, but a declaration only names its target: put a use of it, "
                            "decl(), where the model runs it (or the block it resolves to)")
        if isinstance(b, Composition):
            b._validate()
    blocks = _all_blocks(root)  # validating a composition can set types that reach more blocks
    untyped = [(b, side) for b in blocks for side, t in (("input", b.input_type), ("output", b.output_type))
               if t is None]
    if untyped:
        # A block that knows why its types are missing says so; else the first one is named.
        hint = next((h for b, _ in untyped if (h := b.untyped_hint()) is not None), None)
        b, side = untyped[0]
        raise TypeError(hint or f"cannot infer the {side} type of {b!r} in {root!r}; pin it with set_{side}_type()")
    out = root.output_type
    assert out is not None  # checked just above
    if not any_root:
        if not root_is_tensors(out):
            fix = ("it holds only voids (metrics, say): end it with >> fd.Void()" if holds_only_voids(out)
                   else "use block.eval to look at other values")
            raise TypeError(f"the root {root!r} outputs {out}: a compiled root must output tensors, tuples of "
                            f"tensors or void; {fix}")
        if isinstance(out, VoidType) and not any(isinstance(b, Metric) for b in blocks):
            raise TypeError(f"the root {root!r} outputs void and has no Metric: it computes nothing")
    return root, blocks


def _operations(blocks: Sequence[Block], pipe_steps: Mapping[Block, Sequence[Step]],
                type_index: Mapping[TensorType, int]) -> tuple[tuple[CompiledOp, ...], dict[OpBlock, int]]:
    """The operations, merged by key so equal functions batch together, and each operation
    block's (or fused run's) index among them."""
    fused = {m: step for steps in pipe_steps.values() for step in steps if isinstance(step, Fused)
             for m in step.blocks}
    ops: list[CompiledOp] = []
    block_ops: dict[OpBlock, int] = {}
    by_key: dict[Hashable, int] = {}
    for b in blocks:
        if not isinstance(b, (Function, Concat)):
            continue
        op_block = fused.get(b, b)
        if op_block in block_ops:
            continue
        spec = op_block.op_spec()
        if spec.key not in by_key:
            by_key[spec.key] = len(ops)
            ops.append(_compiled_op(spec, type_index))
        block_ops[op_block] = by_key[spec.key]
    return tuple(ops), block_ops


def _compiled_op(spec: OpSpec, type_index: Mapping[TensorType, int]) -> CompiledOp:
    """``spec`` with its arena slots resolved against the program's types."""
    in_tidx = tuple(type_index[t] for t in spec.in_types)
    leaves = output_leaves(spec)
    out_tidx = tuple(type_index[spec.out_types[k]] for k in first_outputs(leaves))
    layer = spec.layer
    # The check sees the operation's own inputs only where the layer reads them first.
    overridden = layer is not None and type(layer).check_constant_inputs is not Layer.check_constant_inputs
    check = layer.check_constant_inputs if layer is not None and overridden and spec.layer_first else None
    return CompiledOp(spec=spec, in_tidx=in_tidx, out_tidx=out_tidx, in_slots=_slots(in_tidx),
                      out_slots=_slots(out_tidx), fn=distinct_fn(spec.fn, leaves), out_leaves=leaves,
                      in_paths=tuple(leaf_paths(spec.in_type)), check_inputs=check)


def _slots(tidx: tuple[int, ...]) -> tuple[Slot, ...]:
    """Each type index with how many of the same type come before it."""
    seen: dict[int, int] = {}
    out = []
    for t in tidx:
        k = seen.get(t, 0)
        seen[t] = k + 1
        out.append((t, k))
    return tuple(out)


def _named_layers(ops: Sequence[CompiledOp]) -> dict[str, tuple[Layer, Type]]:
    """Every layer by name with its one input type."""
    layer_types: dict[Layer, Type] = {}
    for op in ops:
        if op.layer is None:
            continue
        prev = layer_types.get(op.layer)
        layer_in = op.spec.layer_in_type
        assert layer_in is not None  # an operation with a layer knows the layer's input type
        if prev is not None and prev != layer_in:
            raise TypeError(f"layer {op.layer!r} is used with input types {prev} and {layer_in}; "
                            "a layer has one input type (its parameters depend on it)")
        layer_types[op.layer] = layer_in
    named: dict[str, tuple[Layer, Type]] = {}
    for layer, t in layer_types.items():
        if layer.name in named:
            raise ValueError(f"two different layers are named {layer.name!r} in one model: "
                             f"{named[layer.name][0]!r} and {layer!r}")
        named[layer.name] = (layer, t)
    return named


def _layer_seeds(layers: Mapping[str, tuple[Layer, Type]]) -> dict[str, str]:
    """Per layer name, the name its initial values are drawn under (``Program.layer_seeds``): a
    given name as it is; a default one as its class's, numbered in the model's order past the
    names taken."""
    seeds = {name: name for name, (layer, _) in layers.items() if not layer.has_default_name}
    used = set(seeds)
    for name, (layer, _) in layers.items():
        if layer.has_default_name:
            seed = next(n for n in numbered_names(type(layer)) if n not in used)
            seeds[name] = seed
            used.add(seed)
    return seeds


def _metric_types(blocks: Sequence[Block]) -> dict[str, TensorType]:
    """Per metric name, sorted, the one tensor type its values have."""
    types: dict[str, TensorType] = {}
    for m in blocks:
        if not isinstance(m, Metric):
            continue
        t = m.value_type
        assert t is not None  # Metric checks its input type
        prev = types.get(m.metric_name)
        if prev is not None and prev != t:
            raise TypeError(f"metric {m.metric_name!r} gets both {prev} and {t}")
        types[m.metric_name] = t
    return dict(sorted(types.items()))
