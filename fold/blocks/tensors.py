"""Blocks that run on the device: ``Function`` (and layers) and ``Concat``.

Each distinct function (or layer) and input type is one *operation*; all
its calls at the same depth of a batch's schedule run as one batched call.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import TypeAlias, TypeVar

import jax
import jax.numpy as jnp
import numpy as np

from fold.blocks.adapters import holds_arrays
from fold.blocks.base import Block
from fold.blocks.host import EmitContext, HostContext, HostValue
from fold.blocks.layers import Layer
from fold.blocks.types import TensorType, TupleType, Type, VoidType
from fold.errors import ExplainedTypeError, whole
from fold.typing import PyTree

__all__ = ["Function", "Concat", "OpSpec", "flatten_value", "unflatten_value"]

T = TypeVar("T")

Nested: TypeAlias = T | tuple["Nested[T]", ...] | None
"""Leaves of one kind in the nesting of a type made of tensors, tuples and voids."""

OpFn: TypeAlias = Callable[..., list[jax.Array]]
"""An operation's batched function: ``fn(layer params or None, key or None, *flat inputs) -> flat outputs``."""

# An odd batch size for shape inference, so that a function reducing over
# the batch is caught instead of matching by accident.
_PROBE_BATCH = 7


class OpSpec:
    """What the compiler needs to run one operation on batched arrays.

    ``key`` identifies the operation (calls with equal keys are batched
    together); ``fn(params, rng, *flat_inputs)`` returns the flat list of
    outputs. ``rng`` is a PRNG key unique to the call, or None when the
    model runs deterministically; only stochastic layers use it.
    ``layer_in_type`` is the input type ``layer`` sees (its parameters
    depend on it): ``in_type`` unless ``layer_first`` is False, when the
    operation runs others before the layer (fused operations) and the
    layer does not check constant inputs.
    """

    def __init__(self, key: Hashable, label: str, in_type: Type, out_type: Type,
                 fn: OpFn, layer: Layer | None = None, layer_in_type: Type | None = None,
                 layer_first: bool = True):
        self.key = key
        self.label = label
        self.in_type = in_type
        self.out_type = out_type
        self.in_types = in_type.tensor_leaves()
        self.out_types = out_type.tensor_leaves()
        self.fn = fn
        self.layer = layer
        self.layer_in_type = in_type if layer_in_type is None else layer_in_type
        self.layer_first = layer_first


def flatten_value(v: HostValue) -> list[int]:
    """The tensor ids of a host value made of tensors, tuples and voids, in order."""
    if isinstance(v, tuple):
        return [i for item in v for i in flatten_value(item)]
    if v is None:
        return []
    return [v]


def unflatten_value(t: Type, flat: Sequence[T], pos: int = 0) -> tuple[Nested[T], int]:
    """Rebuilds a value of type ``t`` from ``flat[pos:]``; returns it and the next position."""
    if isinstance(t, TensorType):
        return flat[pos], pos + 1
    if isinstance(t, TupleType):
        items: list[Nested[T]] = []
        for item in t:
            v: Nested[T]
            v, pos = unflatten_value(item, flat, pos)
            items.append(v)
        return tuple(items), pos
    if isinstance(t, VoidType):
        return None, pos
    raise TypeError(f"{t} is not made of tensors and tuples")


def call_args(in_type: Type, flat: Sequence[T]) -> tuple[Nested[T], ...]:
    """Positional arguments for a function: a top-level tuple is unpacked."""
    if isinstance(in_type, TupleType):
        args = unflatten_value(in_type, flat)[0]
        assert isinstance(args, tuple)  # a tuple type's value
        return args
    return (unflatten_value(in_type, flat)[0],)


def _check_tensor_input(block: Block, t: Type) -> None:
    try:
        leaves = t.tensor_leaves()
    except TypeError:
        raise TypeError(f"{block!r} takes tensors and tuples of tensors, not {t}") from None
    if not leaves:
        raise TypeError(f"{block!r} needs at least one tensor input, got {t}")


def result_type(block: Block, result: PyTree) -> Type:
    """The fold type of a batched ``jax.eval_shape`` result."""
    if isinstance(result, jax.ShapeDtypeStruct):
        if result.ndim == 0 or result.shape[0] != _PROBE_BATCH:
            raise TypeError(
                f"{block!r} returned shape {result.shape} for a batch of {_PROBE_BATCH}: the leading "
                "dimension must be the batch (functions get and return batched arrays)"
            )
        return TensorType(result.shape[1:], result.dtype)
    if isinstance(result, (tuple, list)):
        return TupleType(*[result_type(block, r) for r in result])
    raise TypeError(f"{block!r} must return arrays or tuples of arrays, got {type(result).__name__}")


def _probe_args(in_type: Type) -> tuple[Nested[jax.ShapeDtypeStruct], ...]:
    structs = [jax.ShapeDtypeStruct((_PROBE_BATCH, *t.shape), t.dtype) for t in in_type.tensor_leaves()]
    return call_args(in_type, structs)


class Function(Block):
    """A JAX function (or a ``fd.Layer``) on batched arrays, as a block.

    ``fn`` receives arrays with a leading batch dimension and returns an
    array or a tuple of arrays with the same leading dimension; a tuple
    input is passed as positional arguments. The output type is inferred
    with ``jax.eval_shape``.

    Examples:
        >>> import fold as fd, jax.numpy as jnp
        >>> (fd.Vector(2) >> fd.Function(jnp.tanh)).output_type
        TensorType((2,), 'float32')
    """

    _leaf = True

    def __init__(self, fn: Callable[..., PyTree] | Layer, name: str | None = None):
        if not callable(fn) and not isinstance(fn, Layer):
            raise TypeError(f"Function needs a callable or a fd.Layer, got {fn!r}")
        held = None if isinstance(fn, Layer) else holds_arrays(fn)
        if held is not None:
            # Its arrays are no parameters of the model: they would silently never train.
            raise TypeError(f"Function got a {held}, which holds arrays that would never train; make it a layer: "
                            "fd.Layer.from_equinox(module), fd.Layer.from_flax(module) or fd.Layer.from_pure(init, "
                            "apply) (trainable=False keeps them fixed)")
        self.fn = fn
        self.layer = fn if isinstance(fn, Layer) else None
        self._returns: dict[Type, Type] = {}  # input type -> what fn returns for it
        super().__init__(name)

    def __repr__(self) -> str:
        if self._name:
            return f"Function({self._name!r})"
        if self.layer is not None:
            return f"Function({type(self.layer).__name__})"
        return f"Function({getattr(self.fn, '__name__', type(self.fn).__name__)})"

    def _check_input(self, t: Type) -> None:
        _check_tensor_input(self, t)

    def _infer(self) -> None:
        if self.input_type is None:
            return
        if self.output_type is None:
            self.set_output_type(self._returns_for(self.input_type))
            return
        try:
            returns = self._returns_for(self.input_type)
        except _InitNotTraceable:  # nothing to infer from shapes: the type its place gives stands
            return
        if returns != self.output_type:
            # The output type was set from outside (a Fold's state, a OneOf's other cases) before
            # the input was known: what the function returns must match it.
            raise ExplainedTypeError(f"type mismatch: {self!r} returns {returns} for input {self.input_type}, but "
                                     f"its place in the model needs {self.output_type} (a Fold's state, another "
                                     "case of a OneOf, ...)")

    def _returns_for(self, t: Type) -> Type:
        if t not in self._returns:
            self._returns[t] = self._output_for(t)
        return self._returns[t]

    def _output_for(self, t: Type) -> Type:
        args = _probe_args(t)
        try:
            if self.layer is not None:
                layer = self.layer
                try:
                    pshape = jax.eval_shape(lambda k: _checked_init(layer, k, t), jax.random.key(0))
                except _HOST_VALUE_ERRORS as e:
                    raise _InitNotTraceable(f"{self!r} cannot be applied to input type {t}: its layer's init "
                                            f"reads a traced value on the host ({type(e).__name__}), so what it "
                                            "returns cannot be inferred from shapes; draw with jax.random from "
                                            "init's key instead of NumPy") from None
                res = jax.eval_shape(lambda p, *a: layer._apply_keyed(p, *a, key=None), pshape, *args)
            else:
                fn = self._function()
                # Through a lambda: jit keys its cache on a weak reference, which NumPy's ufuncs refuse.
                res = jax.eval_shape(lambda *a: fn(*a), *args)
        except _InitNotTraceable:
            raise
        except jax.errors.TracerArrayConversionError:
            raise TypeError(f"{self!r} cannot be applied to input type {t}: it calls NumPy on its (traced) input; "
                            "functions run under jax.jit, so use jax.numpy (jnp.tanh, not np.tanh)") from None
        except TypeError as e:
            raise TypeError(f"{self!r} cannot be applied to input type {t}: {e}") from None
        except Exception as e:  # shape errors surface as ValueError etc. from user code
            raise TypeError(f"{self!r} cannot be applied to input type {t}: {type(e).__name__}: {e}") from None
        return result_type(self, res)

    def _function(self) -> Callable[..., PyTree]:
        """The plain function this block runs (it has no layer)."""
        assert not isinstance(self.fn, Layer)
        return self.fn

    def op_spec(self) -> OpSpec:
        """The operation this block runs (its types must be known)."""
        in_type, out_type = self.input_type, self.output_type
        assert in_type is not None and out_type is not None
        layer = self.layer

        if layer is not None:
            def run(params: PyTree, rng: jax.Array | None, *flat: jax.Array) -> list[jax.Array]:
                return jax.tree_util.tree_leaves(layer._apply_keyed(params, *call_args(in_type, list(flat)), key=rng))
            return OpSpec((layer, in_type), repr(self), in_type, out_type, run, layer)

        fn = self._function()

        def run_fn(params: PyTree, rng: jax.Array | None, *flat: jax.Array) -> list[jax.Array]:
            return jax.tree_util.tree_leaves(fn(*call_args(in_type, list(flat))))
        return OpSpec((fn, in_type), repr(self), in_type, out_type, run_fn)

    def _host_leaf(self, x: HostValue, ctx: HostContext) -> HostValue:
        return ctx.call(self, x)

    def _emit(self, em: EmitContext, x: str) -> str:
        return em.call(self, x)


# What running host code on a traced value raises: a layer's init that draws on the host does.
_HOST_VALUE_ERRORS = (jax.errors.ConcretizationTypeError, jax.errors.TracerArrayConversionError,
                      jax.errors.TracerIntegerConversionError, jax.errors.TracerBoolConversionError)


class _InitNotTraceable(TypeError):
    """A layer's init cannot run on abstract values, so what the layer returns is not known from shapes."""


def _checked_init(layer: Layer, key: jax.Array, t: Type) -> PyTree:
    """``layer.init(key, t)``, refused when a leaf is not an array or a number: JAX's own error
    names only the lambda that traced it."""
    params = layer.init(key, t)
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        if not isinstance(leaf, (jax.Array, np.ndarray, np.generic, int, float, complex)):
            raise TypeError(f"{type(layer).__name__}.init(key, {t}) returned {type(leaf).__name__} {leaf!r} at "
                            f"params{jax.tree_util.keystr(path)}: a layer's parameters are arrays")
    return params


class Concat(Block):
    """Concatenates a tuple of tensors along ``concat_dim`` (not counting the batch; a negative
    ``concat_dim`` counts from the last dimension, as in NumPy).

    Scalars count as vectors of length 1, as in Fold. With ``flatten=True``
    nested tuples are flattened first; otherwise a nested tuple is a
    TypeError.

    Examples:
        >>> import fold as fd
        >>> (fd.Record((fd.Vector(2), fd.Scalar())) >> fd.Concat()).eval(([1, 2], 3)).tolist()
        [1.0, 2.0, 3.0]
    """

    _leaf = True

    def __init__(self, concat_dim: int = 0, flatten: bool = False, name: str | None = None):
        self.concat_dim = whole("Concat", "concat_dim", concat_dim)
        self.flatten = bool(flatten)
        super().__init__(name)

    def _check_input(self, t: Type) -> None:
        self._output_for(t)

    def _output_for(self, t: Type) -> TensorType:
        if not isinstance(t, TupleType) or len(t) == 0:
            raise TypeError(f"{self!r} takes a non-empty tuple of tensors, not {t}")
        if not self.flatten and not all(isinstance(i, TensorType) for i in t):
            raise TypeError(f"{self!r} got nested tuples in {t}; use Concat(flatten=True)")
        try:
            leaves = t.tensor_leaves()
        except TypeError:
            raise TypeError(f"{self!r} takes tensors, not {t}") from None
        if not leaves:
            raise TypeError(f"{self!r} got no tensors in {t}")
        leaves = [TensorType((1,), leaf.dtype) if leaf.ndim == 0 else leaf for leaf in leaves]  # scalars as (1,)
        first = leaves[0]
        d = self._axis(first.ndim)
        for leaf in leaves:
            if leaf.dtype != first.dtype:
                raise TypeError(f"{self!r} cannot concatenate dtypes {first.dtype} and {leaf.dtype} in {t}")
            if leaf.ndim != first.ndim or not 0 <= d < leaf.ndim:
                raise TypeError(f"{self!r} cannot concatenate {t} along dimension {self.concat_dim}: ranks "
                                "differ or are too small")
            if leaf.shape[:d] != first.shape[:d] or leaf.shape[d + 1:] != first.shape[d + 1:]:
                raise TypeError(f"{self!r} cannot concatenate shapes {[x.shape for x in leaves]} along dimension "
                                f"{self.concat_dim}")
        shape = list(first.shape)
        shape[d] = sum(leaf.shape[d] for leaf in leaves)
        return TensorType(shape, first.dtype)

    def _axis(self, ndim: int) -> int:
        """``concat_dim`` counted from the front (a negative one counts from the back, as in NumPy)."""
        return self.concat_dim + ndim if self.concat_dim < 0 else self.concat_dim

    def _infer(self) -> None:
        if self.input_type is not None and self.output_type is None:
            self.set_output_type(self._output_for(self.input_type))

    def op_spec(self) -> OpSpec:
        in_type, out_type = self.input_type, self.output_type
        assert in_type is not None and isinstance(out_type, TensorType)
        axis = self._axis(out_type.ndim) + 1
        scalars = [leaf.ndim == 0 for leaf in in_type.tensor_leaves()]

        def run(params: PyTree, rng: jax.Array | None, *flat: jax.Array) -> list[jax.Array]:
            return [jnp.concatenate([x[:, None] if s else x for x, s in zip(flat, scalars)], axis=axis)]
        return OpSpec(("concat", axis, in_type), repr(self), in_type, out_type, run)

    def _host_leaf(self, x: HostValue, ctx: HostContext) -> HostValue:
        return ctx.call(self, x)

    def _emit(self, em: EmitContext, x: str) -> str:
        return em.call(self, x)

