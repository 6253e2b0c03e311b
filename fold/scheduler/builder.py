"""Records the tensor work of a batch of examples on the host.

``BatchBuilder`` is the ``ctx`` that blocks see during the host walk. It
issues an integer id for every tensor value: a constant (depth 0) or an
output of an operation call (a *node*, depth 1 + the deepest input).
``fold.scheduler.schedule`` then turns these lists into index arrays.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fold.blocks.types import TensorType

__all__ = ["BatchBuilder"]


class BatchBuilder:
    """Host-side recorder of constants, operation calls and metrics for one batch."""

    def __init__(self, model: Any):
        self.model = model
        self.example_index: int | None = None
        # Per tensor value id: arena (type) index, depth, producing node (-1 for
        # a constant) and position (constant index within its type, or output j).
        self.v_type: list[int] = []
        self.v_depth: list[int] = []
        self.v_node: list[int] = []
        self.v_pos: list[int] = []
        self.consts: list[list[np.ndarray | None]] = [[] for _ in model.types]
        # Per node: operation index, depth and input value ids.
        self.n_op: list[int] = []
        self.n_depth: list[int] = []
        self.n_inputs: list[list[int]] = []
        self.metrics: dict[str, list[tuple[int, int]]] = {name: [] for name in model.metric_types}
        self.max_depth = 0
        self._shared: dict[Any, int] = {}
        # Per-batch memo for blocks whose host value is the same every call (Zeros).
        self.block_cache: dict[Any, Any] = {}

    def _new_value(self, t: int, depth: int, node: int, pos: int) -> int:
        vid = len(self.v_type)
        self.v_type.append(t)
        self.v_depth.append(depth)
        self.v_node.append(node)
        self.v_pos.append(pos)
        return vid

    def const(self, ttype: TensorType, value: np.ndarray | None) -> int:
        """A depth-0 constant (``None`` means zeros)."""
        t = self.model.type_index[ttype]
        table = self.consts[t]
        table.append(value)
        return self._new_value(t, 0, -1, len(table) - 1)

    def const_shared(self, key: Any, ttype: TensorType, value: np.ndarray | None) -> int:
        """A constant stored once per batch, whichever example asks for it."""
        vid = self._shared.get(key)
        if vid is None:
            vid = self._shared[key] = self.const(ttype, value)
        return vid

    def zeros(self, ttype: TensorType) -> int:
        return self.const_shared(("zeros", ttype), ttype, None)

    def const_value(self, vid: int) -> np.ndarray | None:
        """The host value of a constant id, or None if it is computed."""
        if self.v_node[vid] >= 0:
            return None
        value = self.consts[self.v_type[vid]][self.v_pos[vid]]
        if value is None:
            t = self.model.types[self.v_type[vid]]
            value = np.zeros(t.shape, t.dtype)
        return value

    def call(self, block: Any, x: Any) -> Any:
        """Records one call of ``block``'s operation on host value ``x``."""
        o = self.model.block_ops[block]
        op = self.model.ops[o]
        inputs = op.flatten_inputs(x)
        if op.check_inputs is not None:
            values = [self.const_value(v) for v in inputs]
            if all(v is not None for v in values):
                op.check_inputs(*values)
        depth = 1 + max(map(self.v_depth.__getitem__, inputs), default=0)
        if depth > self.max_depth:
            self.max_depth = depth
        node = len(self.n_op)
        self.n_op.append(o)
        self.n_depth.append(depth)
        self.n_inputs.append(inputs)
        first = len(self.v_type)
        n_out = len(op.out_tidx)
        self.v_type.extend(op.out_tidx)
        self.v_depth.extend([depth] * n_out)
        self.v_node.extend([node] * n_out)
        self.v_pos.extend(range(n_out))
        return op.outputs_from(first)

    def metric(self, name: str, vid: int) -> None:
        depth = self.v_depth[vid] + 1
        if depth > self.max_depth:
            self.max_depth = depth
        self.metrics[name].append((self.example_index or 0, vid))
