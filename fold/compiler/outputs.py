"""Outputs an operation returns more than once get one arena slot.

An LSTM cell returns ``(h, (c, h))``: its output and its new state hold the
same ``h``. Run as it is written, every call writes ``h`` twice, into two
arena rows, and a loop item writes one more chunk and reads one more
cotangent. ``output_leaves`` finds such repeats by tracing the operation's
function: two outputs that are the same traced value (the same jaxpr
variable, for the deterministic and the stochastic call alike) are one. The
compiled operation (``CompiledOp.fn``) returns each value once, and readers
of either output read the one row (``CompiledOp.out_leaves``); the readers'
cotangents add up in that row, as autodiff adds them for a value used twice.

Examples:
    >>> import jax.numpy as jnp
    >>> from fold.blocks.tensors import OpSpec
    >>> from fold.blocks.types import TensorType, TupleType
    >>> t = TensorType((3,))
    >>> def cell(p, rng, x):
    ...     h = jnp.tanh(x)
    ...     return [h, x, h]
    >>> output_leaves(OpSpec("cell", "cell", t, TupleType(t, TupleType(t, t)), cell))
    (0, 1, 0)
"""

from __future__ import annotations

import jax
import numpy as np
from jax.extend.core import Var

from fold.blocks.tensors import OpFn, OpSpec

__all__ = ["output_leaves", "first_outputs", "distinct_fn"]


def output_leaves(spec: OpSpec) -> tuple[int, ...]:
    """Per output of ``spec`` (its ``out_types``), the index of its value among the distinct
    ones, numbered in order of first appearance: ``(0, 1, 0)`` for an LSTM cell's
    ``(h, (c, h))``. Every output counts as distinct where the function cannot be traced on
    abstract values (its layer's ``init`` needs concrete ones); the executor then reports any
    error in the function itself."""
    n = len(spec.out_types)
    if n < 2:
        return tuple(range(n))
    try:
        params = None
        if spec.layer is not None:
            layer, in_type = spec.layer, spec.layer_in_type
            params = jax.eval_shape(lambda k: layer.init(k, in_type), jax.random.key(0))
        # Two rows: a size no model special-cases (one row may be squeezed).
        xs = [jax.ShapeDtypeStruct((2, *t.shape), t.dtype) for t in spec.in_types]

        def outputs(rng: jax.Array | None) -> list[object]:
            return list(jax.make_jaxpr(lambda p, rng, *xs: spec.fn(p, rng, *xs))(params, rng, *xs).jaxpr.outvars)

        outs = [outputs(None)]
        if len(set(_numbered(outs))) < n:  # only then can a draw tell two apart
            outs.append(outputs(jax.random.key(0)))
    except Exception:  # any failure keeps the outputs apart; running the operation reports it
        return tuple(range(n))
    return _numbered(outs)


def _numbered(outs: list[list[object]]) -> tuple[int, ...]:
    """Per output, the number of its value: outputs that are one traced value in every trace of
    ``outs`` share one, numbered in order of first appearance."""
    ids: list[int] = []
    firsts: list[int] = []
    for j in range(len(outs[0])):
        same = next((i for i in firsts if all(_same(o[i], o[j]) for o in outs)), None)
        if same is None:
            firsts.append(j)
            ids.append(len(firsts) - 1)
        else:
            ids.append(ids[same])
    return tuple(ids)


def first_outputs(leaves: tuple[int, ...]) -> list[int]:
    """Per distinct value (``leaves`` from ``output_leaves``), the first output that holds it."""
    return [leaves.index(d) for d in range(max(leaves, default=-1) + 1)]


def distinct_fn(fn: OpFn, leaves: tuple[int, ...]) -> OpFn:
    """``fn`` returning each distinct output once (``leaves`` from ``output_leaves``)."""
    keep = first_outputs(leaves)
    if len(keep) == len(leaves):
        return fn

    def distinct(p: object, rng: jax.Array | None, *xs: jax.Array | np.ndarray) -> list[jax.Array]:
        ys = fn(p, rng, *xs)
        return [ys[k] for k in keep]

    return distinct


def _same(a: object, b: object) -> bool:
    """Whether two jaxpr outputs are one traced value (literals never are)."""
    return a is b and isinstance(a, Var)
