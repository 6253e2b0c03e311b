"""``LayerParams``: a program's parameters, made by ``init`` and checked before every ``apply``.

Parameters are a dict ``{layer name: that layer's pytree}``. Each layer's key is derived from the
key given and the layer's seed name (``Program.layer_seeds``: its name if it was given one, else
its class's numbered within the model), so initial values depend on the model alone, not on how
many layers the process made before it.
Checking them at trace time (shapes are static) costs once per layout and catches the mistakes
that would otherwise broadcast or cast silently (a bias of shape (1,) for (4,), int32 weights).

Examples:
    >>> import fold as fd, jax
    >>> layers = LayerParams({"fc": (fd.FC(2), fd.TensorType((3,)))}, {"fc": "fc"})
    >>> params = layers.init(jax.random.key(0))
    >>> params["fc"]["w"].shape
    (3, 2)
    >>> try:
    ...     layers.prepare({"fc": {**params["fc"], "b": params["fc"]["b"][:1]}})
    ... except TypeError as e:
    ...     print(str(e).split(", but")[0])
    params['fc']['b'] has shape (1,) and dtype float32
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping

import jax
import numpy as np

from fold.blocks.layers import Layer
from fold.blocks.types import Type
from fold.compiler.saving import abstract_params
from fold.typing import Params

__all__ = ["LayerParams", "Params", "is_key"]


def is_key(key: object) -> bool:
    """A typed PRNG key (``jax.random.key``) or a raw one (``jax.random.PRNGKey``: two uint32s)."""
    if not isinstance(key, (jax.Array, np.ndarray)):
        return False
    return bool(jax.numpy.issubdtype(key.dtype, jax.dtypes.prng_key) or (key.shape == (2,) and key.dtype == np.uint32))


class LayerParams:
    """The parameters of ``layers`` (per name, the layer and its input type), each drawn under its
    name in ``seeds``."""

    def __init__(self, layers: Mapping[str, tuple[Layer, Type]], seeds: Mapping[str, str]):
        self.layers = layers
        self.seeds = seeds
        self._structs_by_x64: dict[bool, Params] = {}

    def init(self, key: jax.Array) -> Params:
        """Parameters for every layer (see ``Compiler.init``)."""
        if not is_key(key):
            raise TypeError(f"init needs a PRNG key such as jax.random.key(0), got {key!r}")
        # Op by op: a first init in a process compiles each initializer's operations (about 1.5 s for
        # a toy model), later ones reuse them. One jitted init per compiler would compile again for
        # every compiler a process makes (a test suite: minutes), and some layers' inits only run
        # on concrete keys.
        return {name: layer.init(jax.random.fold_in(key, zlib.crc32(self.seeds[name].encode())), t)
                for name, (layer, t) in sorted(self.layers.items())}

    @property
    def structs(self) -> Params:
        """What ``init`` gives: per layer, its parameters' shapes and dtypes (which depend on
        whether 64-bit types are on)."""
        x64 = bool(jax.config.read("jax_enable_x64"))
        if x64 not in self._structs_by_x64:
            self._structs_by_x64[x64] = abstract_params(self.init)
        return self._structs_by_x64[x64]

    def prepare(self, params: object) -> Params:
        """``params`` checked, with the gradients of non-trainable layers stopped (see
        ``Compiler.prepare_params``)."""
        if not isinstance(params, dict):
            raise TypeError(f"params must be the dict from compiler.init, got {type(params).__name__}")
        missing = [n for n in self.layers if n not in params]
        if missing:
            raise KeyError(f"params has no entry for layer(s) {missing}; make them with compiler.init")
        self._check_shapes(params)
        out = dict(params)
        for name, (layer, _) in self.layers.items():
            if not layer.trainable:
                out[name] = jax.lax.stop_gradient(params[name])
        return out

    def _check_shapes(self, params: Params) -> None:
        """Every layer's parameters have the structure, shapes and dtypes ``init`` gives them."""
        for name in sorted(self.layers):
            want, got = self.structs[name], params[name]
            want_leaves, want_tree = jax.tree_util.tree_flatten_with_path(want)
            got_leaves, got_tree = jax.tree_util.tree_flatten_with_path(got)
            if want_tree != got_tree:  # type: ignore[operator]  # jaxlib's stubs omit PyTreeDef.__ne__
                raise TypeError(f"params[{name!r}] has structure {got_tree}, but layer {name!r} has "
                                f"{want_tree}; make params with compiler.init")
            for (path, w), (_, g) in zip(want_leaves, got_leaves):
                shape, dtype = np.shape(g), (g.dtype if hasattr(g, "dtype") else np.asarray(g).dtype)
                if shape != w.shape or np.dtype(dtype) != np.dtype(w.dtype):
                    raise TypeError(f"params[{name!r}]{jax.tree_util.keystr(path)} has shape {shape} and dtype "
                                    f"{np.dtype(dtype)}, but layer {name!r} needs shape {w.shape} and dtype "
                                    f"{np.dtype(w.dtype)}; make params with compiler.init")
