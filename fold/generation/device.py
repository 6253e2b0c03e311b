"""Running a block of tensors straight on the device: a block as a function of batched arrays.

The compiler runs a model in two halves: the host walks each example through the block tree and
records operation calls, then the device runs them, batched. A block whose input and output are
tensors (tuples of tensors, voids) and which holds no ``OneOf`` or recursion decides nothing on
the host: walking it once over a whole batch of rows, each operation called at once on every row,
computes what the compiler would (a constant, such as ``FromTensor``'s, broadcast to every row).
``device_function`` does that walk with a ``HostContext``
whose tensor ids name arrays computed as it goes, so the block becomes a plain function that
runs under ``jit`` and inside ``lax.while_loop``: the generation blocks' steps run so, where the
structure is decided on the device and no host walk can precede them.

Examples:
    >>> import fold as fd, jax, jax.numpy as jnp
    >>> block = fd.Record((fd.Identity(), fd.Function(jnp.tanh))) >> fd.Function(jnp.add)
    >>> f = device_function(block, fd.TupleType(fd.TensorType((2,)), fd.TensorType((2,))))
    >>> f({}, (jnp.ones((3, 2)), jnp.zeros((3, 2)))).shape
    (3, 2)
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import TypeAlias

import jax
import jax.numpy as jnp

from fold.blocks.base import Block, outline
from fold.blocks.control import ForwardDeclaration, Metric, OneOf, _Reference
from fold.blocks.host import DEFAULT_LIMITS, ConstValue, ExampleLimits, HostValue, OpBlock, Step
from fold.blocks.layers import Layer
from fold.blocks.plumbing import Pipe
from fold.blocks.sharing import Shared
from fold.blocks.tensors import Function, flatten_value, unflatten_value
from fold.blocks.types import TensorType, Type, is_tensor_tree
from fold.scheduler.walk import walk
from fold.typing import Params, PyObject, PyTree

__all__ = ["DeviceFunction", "device_function", "device_layers"]

DeviceFunction: TypeAlias = Callable[[Params, PyTree], PyTree]
"""``f(params, x) -> y``: a block on batched arrays (tuples as tuples), ``params`` keyed by layer name."""


class _DeviceContext:
    """The ``HostContext`` of one walk over ``rows`` rows: a tensor id is the index of its array."""

    def __init__(self, params: Params, rows: int):
        self.params = params
        self.rows = rows
        self.values: list[jax.Array] = []
        self.block_cache: dict[Hashable, HostValue] = {}
        self.recursing: set[tuple[int, int]] = set()
        self.example_index: int | None = None  # all rows at once

    @property
    def limits(self) -> ExampleLimits:
        return DEFAULT_LIMITS

    def _add(self, value: jax.Array) -> int:
        self.values.append(value)
        return len(self.values) - 1

    def const(self, ttype: TensorType, value: ConstValue) -> int:
        row = jnp.zeros(ttype.shape, ttype.dtype) if value is None else jnp.asarray(value, ttype.dtype)
        return self._add(jnp.broadcast_to(row, (self.rows, *ttype.shape)))

    def const_shared(self, key: Hashable, ttype: TensorType, value: ConstValue) -> int:
        cache_key = ("const", key)
        vid = self.block_cache.get(cache_key)
        if vid is None:
            vid = self.block_cache[cache_key] = self.const(ttype, value)
        return int(vid)

    def zeros(self, ttype: TensorType) -> int:
        return self.const_shared(("zeros", ttype), ttype, None)

    def call(self, block: OpBlock, x: HostValue) -> HostValue:
        spec = block.op_spec()
        params = None if spec.layer is None else self.params[spec.layer.name]
        ys = spec.fn(params, None, *[self.values[i] for i in flatten_value(x)])
        return unflatten_value(spec.out_type, [self._add(y) for y in ys])[0]

    def metric(self, name: str, vid: int, label: PyObject = None) -> None:
        raise AssertionError("device_function refuses blocks with metrics")

    def steps(self, pipe: Block) -> Sequence[Step]:
        assert isinstance(pipe, Pipe)  # only pipes ask for their steps
        return pipe.stages()

    def check_size(self) -> None:
        pass

    def where(self) -> str:
        return "a block run on the device"


def _all_blocks(root: Block) -> list[Block]:
    seen: dict[int, Block] = {}
    stack = [root]
    while stack:
        b = stack.pop()
        if id(b) not in seen:
            seen[id(b)] = b
            stack.extend(b.children())
    return list(seen.values())


def device_layers(block: Block) -> dict[str, tuple[Layer, Type]]:
    """The layers ``block`` calls (its types known), by name, each with its input type."""
    out: dict[str, tuple[Layer, Type]] = {}
    for b in _all_blocks(block):
        if isinstance(b, Function) and b.layer is not None and b.input_type is not None:
            out[b.layer.name] = (b.layer, b.op_spec().layer_in_type)
    return out


def device_function(block: Block, in_type: Type, owner: str = "a device block") -> DeviceFunction:
    """``block`` as a function of batched arrays, its input type set to ``in_type``.

    Every block inside must read tensors, tuples or voids (a block that reads Python objects,
    such as ``OneOf``'s choice or ``InputTransform``, decides on the host and cannot run here);
    Blocks that choose what runs from a host value (``OneOf``, ``ForwardDeclaration``) cannot run
    here; ``owner`` names what asks, for errors. Stochastic layers run deterministically (no key).

    Raises:
      TypeError: a type does not check, or a block inside chooses on the host.
    """
    block.set_input_type(in_type)
    for b in _all_blocks(block):
        if isinstance(b, (OneOf, ForwardDeclaration, _Reference)):
            raise TypeError(f"{owner}: {outline(b)} decides on the host, but {outline(block)} runs on the device, "
                            "where no choice of block can depend on a value: compute choices as tensors (a "
                            "generation block's decisions do)")
        if isinstance(b, Shared):
            raise TypeError(f"{owner}: {b!r} shares nodes by their input objects on the host, but {outline(block)} "
                            "runs on the device, where there are none: share in the static model")
        if isinstance(b, Metric):
            raise TypeError(f"{owner}: {b!r} cannot record inside {outline(block)}, which runs on the device: "
                            "record metrics in the static model")
    untyped = [b for b in _all_blocks(block) if b.output_type is None]
    if untyped:
        raise TypeError(f"{owner}: cannot infer the output type of {outline(untyped[0])} in {outline(block)}")
    out_type = block.output_type
    assert out_type is not None
    if not is_tensor_tree(out_type):
        raise TypeError(f"{owner}: {outline(block)} returns {out_type}, but it must return tensors (and tuples of "
                        "them)")

    def run(params: Params, x: PyTree) -> PyTree:
        leaves = jax.tree_util.tree_leaves(x)
        ctx = _DeviceContext(params, leaves[0].shape[0] if leaves else 1)
        ids = unflatten_value(in_type, [ctx._add(v) for v in leaves])[0]
        out = walk(block, ids, ctx)
        return unflatten_value(out_type, [ctx.values[i] for i in flatten_value(out)])[0]

    return run
