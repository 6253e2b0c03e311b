"""Layers from elsewhere: a pure ``(init, apply)`` pair, an Equinox module, a Flax module.

Each becomes a ``Layer`` whose parameters live in the compiler's params pytree under the layer's
name, so they train, checkpoint and are checked like any layer's. ``Layer.from_pure``,
``Layer.from_equinox`` and ``Layer.from_flax`` make them; Equinox and Flax are optional
(``pip install equinox`` or ``flax``) and imported only when used.

A module's parameters are the ones it was built with (Equinox, Flax NNX: build it with the key
you want), or made by its own ``init`` from the compiler's key (Flax Linen). Only its
parameters train: NNX state that is not an ``nnx.Param`` (batch statistics, RNG counters) and
Equinox fields that are not floating-point arrays stay as they were built.

Examples:
    >>> import fold as fd, jax, jax.numpy as jnp
    >>> def init(key, input_type):
    ...     return {"w": jax.random.normal(key, (input_type.shape[0], 2))}
    >>> layer = fd.Layer.from_pure(init, lambda p, x: jnp.tanh(x @ p["w"]), name="proj")
    >>> compiler = fd.Compiler.create(fd.Vector(3) >> layer)
    >>> compiler.init(jax.random.key(0))["proj"]["w"].shape
    (3, 2)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from fold.blocks.layers import Layer, takes_key
from fold.blocks.types import TensorType, TupleType, Type
from fold.typing import PyTree, UserModule

__all__ = ["PureLayer", "EquinoxLayer", "FlaxLinenLayer", "FlaxNNXLayer", "flax_layer", "holds_arrays"]


def _probe_inputs(input_type: Type) -> list[jax.Array]:
    """One row of zeros per argument ``apply`` gets for ``input_type`` (a top-level tuple unpacked)."""
    items = list(input_type) if isinstance(input_type, TupleType) else [input_type]
    if not all(isinstance(t, TensorType) for t in items):
        raise TypeError(f"a module layer takes tensors or a tuple of tensors, not {input_type}")
    return [jnp.zeros((1, *t.shape), t.dtype) for t in items if isinstance(t, TensorType)]


class PureLayer(Layer):
    """A layer from two pure functions: ``init(key, input_type) -> params`` and
    ``apply(params, *inputs) -> outputs`` on batched inputs (Fold's ``ScopedLayer``, without scopes)."""

    def __init__(self, init: Callable[[jax.Array, Type], PyTree], apply: Callable[..., PyTree], name: str | None = None,
                 trainable: bool = True):
        if not callable(init) or not callable(apply):
            raise TypeError(f"Layer.from_pure needs two callables (init, apply), got {init!r} and {apply!r}")
        super().__init__(name, trainable)
        self._init, self._apply = init, apply
        self.stochastic = takes_key(apply)  # as a Layer subclass's own apply would say

    def init(self, key: jax.Array, input_type: Type) -> PyTree:
        return self._init(key, input_type)

    def apply(self, params: PyTree, *inputs: PyTree, key: jax.Array | None = None) -> PyTree:
        return self._apply(params, *inputs, key=key) if self.stochastic else self._apply(params, *inputs)


class EquinoxLayer(Layer):
    """An Equinox module as a layer: its floating-point arrays are the parameters, and it runs on
    each row (``jax.vmap``), as Equinox modules take one example.

    A module whose ``__call__`` takes ``key=`` (one with ``eqx.nn.Dropout``, say) is stochastic:
    with a key each row gets its own (split from the call's), and without one it runs in
    ``eqx.nn.inference_mode``."""

    def __init__(self, module: UserModule, name: str | None = None, trainable: bool = True):
        import equinox as eqx

        super().__init__(name, trainable)
        self._params, self._static = eqx.partition(module, eqx.is_inexact_array)
        if not jax.tree_util.tree_leaves(self._params):
            raise ValueError(f"{type(module).__name__} has no floating-point arrays to train; use fd.Function")
        self.stochastic = takes_key(type(module).__call__)

    def init(self, key: jax.Array, input_type: Type) -> PyTree:
        _probe_inputs(input_type)
        return self._params

    def apply(self, params: PyTree, *inputs: PyTree, key: jax.Array | None = None) -> PyTree:
        import equinox as eqx

        module = eqx.combine(params, self._static)
        if not self.stochastic:
            return jax.vmap(module)(*inputs)
        if key is None:
            return jax.vmap(eqx.nn.inference_mode(module))(*inputs)
        keys = jax.random.split(key, inputs[0].shape[0])
        return jax.vmap(lambda k, *xs: module(*xs, key=k))(keys, *inputs)


class FlaxLinenLayer(Layer):
    """A Flax Linen module as a layer: ``module.init`` makes its variables from the compiler's key
    and ``module.apply`` runs it on the batch.

    ``rngs`` names the RNG collections its stochastic parts draw from (``("dropout",)``); they make
    the layer stochastic: with a key each collection gets its own (folded from the call's) and
    ``train_kwargs`` go to ``apply``, without one ``eval_kwargs`` do (``{"train": True}`` and
    ``{"train": False}``, say, for a module called as ``module(x, train)``)."""

    def __init__(self, module: UserModule, name: str | None = None, trainable: bool = True, rngs: Sequence[str] = (),
                 train_kwargs: Mapping[str, object] | None = None, eval_kwargs: Mapping[str, object] | None = None):
        super().__init__(name, trainable)
        if isinstance(rngs, str) or not all(isinstance(r, str) and r for r in rngs):
            raise TypeError(f"rngs names RNG collections, as a tuple of strings (('dropout',)), got {rngs!r}")
        if "params" in rngs:
            raise ValueError("rngs=('params', ...): the 'params' collection is init's own; name the ones "
                             "apply draws from, such as 'dropout'")
        if not rngs and (train_kwargs or eval_kwargs):
            raise ValueError("train_kwargs and eval_kwargs need rngs=: the RNG collections that training draws "
                             "from (('dropout',), say)")
        self.module = module
        self.rngs = tuple(rngs)
        self.train_kwargs, self.eval_kwargs = dict(train_kwargs or {}), dict(eval_kwargs or {})
        self.stochastic = bool(self.rngs)

    def init(self, key: jax.Array, input_type: Type) -> PyTree:
        return self.module.init(key, *_probe_inputs(input_type), **self.eval_kwargs)

    def apply(self, params: PyTree, *inputs: PyTree, key: jax.Array | None = None) -> PyTree:
        if key is None:
            return self.module.apply(params, *inputs, **self.eval_kwargs)
        rngs = {name: jax.random.fold_in(key, i) for i, name in enumerate(self.rngs)}
        return self.module.apply(params, *inputs, rngs=rngs, **self.train_kwargs)


class FlaxNNXLayer(Layer):
    """A Flax NNX module as a layer: its ``nnx.Param`` variables are the parameters (the rest of
    its state is kept as built), and it runs on the batch.

    A module that holds RNG streams (an ``nnx.Dropout`` built with ``rngs``) is stochastic: with a
    key its streams are reseeded from it and its ``deterministic`` attributes set False, without
    one they are set True. A module that updates other state as it runs (``nnx.BatchNorm``
    without ``use_running_average=True``) is refused: fold could not keep the update, and
    statistics over a batched call's rows (padding included, one depth at a time) would be
    wrong."""

    def __init__(self, module: UserModule, name: str | None = None, trainable: bool = True):
        from flax import nnx

        super().__init__(name, trainable)
        graph, params, rngs, rest = nnx.split(module, nnx.Param, nnx.RngState, ...)
        self._graph: PyTree = graph
        self._params: PyTree = params
        self._rngs: PyTree = rngs
        self._rest: PyTree = rest
        self._name_of_module = type(module).__name__
        self.stochastic = bool(_rng_streams(module))

    def init(self, key: jax.Array, input_type: Type) -> PyTree:
        _probe_inputs(input_type)
        return self._params

    def apply(self, params: PyTree, *inputs: PyTree, key: jax.Array | None = None) -> PyTree:
        from flax import nnx

        # Copies of the state, made under the caller's trace: NNX refuses to mutate variables
        # (the streams' keys and counts, set here or as they draw) made outside it.
        module = nnx.merge(self._graph, params, *(jax.tree.map(lambda x: x, s) for s in (self._rngs, self._rest)))
        if self.stochastic:
            module.set_attributes(deterministic=key is None, raise_if_not_found=False)
        if self.stochastic and key is not None:
            for i, stream in enumerate(_rng_streams(module)):
                stream.key.set_value(jax.random.fold_in(key, i))
                stream.count.set_value(jnp.zeros_like(stream.count.get_value()))
        out = module(*inputs)
        after = jax.tree_util.tree_flatten_with_path(nnx.split(module, nnx.Param, nnx.RngState, ...)[3])[0]
        updated = [jax.tree_util.keystr(path) for (path, new), old in zip(after, jax.tree_util.tree_leaves(self._rest))
                   if new is not old]
        if updated:
            raise ValueError(f"{self._name_of_module} updates its state {', '.join(updated)} as it runs (batch "
                             "statistics?): fold keeps a module's state other than its nnx.Params as built, and "
                             "statistics over a batched call's rows (padding included, one depth at a time) would "
                             "be wrong; build it with use_running_average=True (frozen statistics) or use "
                             "nnx.LayerNorm")
        return out


def _rng_streams(module: UserModule) -> list[UserModule]:
    """The ``nnx.RngStream``s ``module`` holds, in graph order (parts of the user's module)."""
    from flax import nnx

    return [node for _, node in nnx.iter_graph(module) if isinstance(node, nnx.RngStream)]


def flax_layer(module: UserModule, name: str | None = None, trainable: bool = True, rngs: Sequence[str] = (),
               train_kwargs: Mapping[str, object] | None = None,
               eval_kwargs: Mapping[str, object] | None = None) -> Layer:
    """The layer of a Flax module, NNX or Linen (``rngs`` and the kwargs are Linen's: NNX modules
    hold their RNG streams and deterministic flags)."""
    from flax import linen, nnx

    if isinstance(module, nnx.Module):
        if rngs or train_kwargs or eval_kwargs:
            raise TypeError("rngs, train_kwargs and eval_kwargs are for Linen modules; an NNX module's dropout "
                            "draws from the nnx.Rngs it was built with, and fold sets its deterministic flag")
        return FlaxNNXLayer(module, name, trainable)
    if isinstance(module, linen.Module):
        return FlaxLinenLayer(module, name, trainable, rngs, train_kwargs, eval_kwargs)
    raise TypeError(f"Layer.from_flax needs a flax.nnx.Module or a flax.linen.Module, got {type(module).__name__}")


def holds_arrays(fn: object) -> str | None:
    """What a ``Function``'s ``fn`` holds that would train if it were a layer: the name of a Flax
    module's class, or of an object (an Equinox module) whose pytree leaves include arrays, looking
    through wrappers such as ``jax.vmap`` and ``functools.wraps``; None for a plain function."""
    seen = 0
    while fn is not None and seen < 16:
        module = type(fn).__module__ or ""
        if module.split(".")[0] == "flax":
            return type(fn).__name__
        if not callable(fn) or not hasattr(fn, "__code__"):
            leaves = jax.tree_util.tree_leaves(fn)
            if any(isinstance(leaf, (jax.Array, np.ndarray)) for leaf in leaves):
                return type(fn).__name__
        fn, seen = getattr(fn, "__wrapped__", None), seen + 1
    return None
