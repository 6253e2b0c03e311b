"""Layers: parameterised operations whose parameters live in the params pytree.

A layer has a ``name`` (its key in ``params``), ``init(key, input_type)``
returning its parameters and ``apply(params, *inputs)`` on batched arrays.
A layer object used in several places shares one set of parameters.

Examples:
    >>> import fold as fd, jax
    >>> class Scale(fd.Layer):
    ...     def init(self, key, input_type):
    ...         return {"s": jax.numpy.ones(input_type.shape, input_type.dtype)}
    ...     def apply(self, params, x):
    ...         return params["s"] * x
    >>> model = fd.Vector(2) >> Scale(name="scale")
    >>> fd.Compiler.create(model).init(jax.random.key(0))["scale"]["s"].shape
    (2,)
"""

from __future__ import annotations

import abc
import inspect
import itertools
import re
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import numpy as np
from numpy.typing import DTypeLike

from fold.blocks.types import TensorType, TupleType, Type, dtype_kind, requested_dtype
from fold.errors import whole
from fold.typing import Params, PyTree, UserModule

if TYPE_CHECKING:
    from fold.blocks.base import Block
    from fold.blocks.host import BlockLike

Initializer = Callable[..., jax.Array]
"""A JAX-style initializer: ``init(key, shape, dtype) -> array`` (``jax.nn.initializers``)."""

Activation = Callable[[jax.Array], jax.Array]
"""An element-wise function of a batch of vectors (``jax.nn.relu``)."""

Weights = dict[str, jax.Array]
"""A built-in layer's parameters: its arrays by name (``w``, ``b``, ``table``, ...)."""

__all__ = ["Layer", "FC", "Embedding", "Dropout", "snake_case", "takes_key", "vector_size"]


def snake_case(name: str) -> str:
    """``BinaryTreeLSTMCell`` -> ``binary_tree_lstm_cell``; ``FC`` -> ``fc``."""
    s = re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", name)
    return s.lower()


def takes_key(apply: Callable[..., object]) -> bool:
    """Whether ``apply`` has a ``key`` parameter that can be passed as ``key=`` beside the inputs:
    keyword-only, or with a default (a positional ``key`` without one is an input, such as an
    attention layer's keys)."""
    try:
        param = inspect.signature(apply).parameters.get("key")
    except (TypeError, ValueError):  # no signature to read (a builtin): nothing says it takes a key
        return False
    return param is not None and (param.kind is inspect.Parameter.KEYWORD_ONLY or
                                  (param.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD and
                                   param.default is not inspect.Parameter.empty))


def numbered_names(cls: type) -> Iterator[str]:
    """A class's layer names in order: ``fc``, ``fc_1``, ``fc_2``, ..."""
    base = snake_case(cls.__name__)
    return itertools.chain([base], (f"{base}_{i}" for i in itertools.count(1)))


_MAX_ID = int(np.iinfo(np.int32).max)  # the largest id an Embedding reads (ids are int32)

class _Names:
    """Default layer names: per class, ``numbered_names`` in the order layers are made in this
    process, skipping names passed explicitly before (a lock: layers may be made on threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._next: dict[type, Iterator[str]] = {}
        self._taken: set[str] = set()

    def take(self, name: str) -> str:
        with self._lock:
            self._taken.add(name)
        return name

    def default(self, cls: type) -> str:
        with self._lock:
            names = self._next.setdefault(cls, numbered_names(cls))
            name = next(n for n in names if n not in self._taken)
            self._taken.add(name)
            return name


_names = _Names()


class Layer(abc.ABC):
    """Base class of layers; subclass it and define ``init`` and ``apply``.

    Pass ``name=`` to fix the layer's key in ``params``; otherwise the layer
    is named when it is made (as in Fold), from its class, numbered in the
    order the process makes them (``fc``, ``fc_1``, ...; a name passed
    before is skipped): a script that builds its model the same way gets
    the same names on every run, and two unnamed layers differ before any
    compile. A layer's initial values do not depend on that number (see
    ``Compiler.init``). Two layers with one name in a model are an error;
    name the layers whose parameters a checkpoint or an optimizer's labels
    must find by name.
    ``trainable=False`` keeps the parameters in ``params`` with a zero
    gradient.

    A *stochastic* layer (such as ``Dropout``) is called as
    ``apply(params, *inputs, key=key)``: ``key`` is a PRNG key unique to
    that call (so each batched call draws fresh, independent values per
    row), derived from the key given to ``compiler.apply``; it is None when
    ``apply`` gets no key, which means "run deterministically" (evaluation).
    A layer is stochastic when it sets ``stochastic = True``, or, when it
    sets nothing, when its ``apply`` has a ``key`` parameter with a default
    or after ``*`` (``def apply(self, params, x, *, key=None)``).
    """

    #: Whether ``apply`` is called with ``key=`` (see the class docstring); None: whether
    #: ``apply``'s signature takes one.
    stochastic: bool | None = None
    # Set when a model using the layer is compiled: its public attributes are then fixed.
    _frozen = False
    # NumPy defers to ``__rrshift__``: ``np.array(...) >> layer`` is ``FromTensor(array) >> layer``.
    __array_ufunc__ = None

    def __init__(self, name: str | None = None, trainable: bool = True):
        if name is not None and (not isinstance(name, str) or not name):
            raise ValueError(f"a layer name must be a non-empty string, got {name!r}")
        self._name = _names.take(name) if name is not None else _names.default(type(self))
        self._named = name is not None
        self.trainable = trainable

    def __setattr__(self, name: str, value: object) -> None:
        if self._frozen and not name.startswith("_"):
            raise AttributeError(
                f"{self!r} is part of a compiled model, so its {name!r} is fixed: layouts compiled before "
                "the change would keep the old value and later ones take the new, two answers for one example. "
                "Make a new layer (and compile a new model) instead")
        super().__setattr__(name, value)

    def _freeze(self) -> None:
        """Fixes the public attributes (``Compiler.create`` calls it for the model's layers)."""
        self._frozen = True

    @property
    def name(self) -> str:
        """The key of this layer's parameters: the ``name`` given, else its class's (see above)."""
        return self._name

    @property
    def has_default_name(self) -> bool:
        """Whether the layer was made without ``name=`` (its name counts the layers made before)."""
        return not self._named

    def __repr__(self) -> str:
        # As constructed (sizes, and the name if one was given): a default name is not part of how
        # the layer was written.
        args = [*self._repr_args(), *([f"name={self._name!r}"] if self._named else [])]
        return f"{type(self).__name__}({', '.join(args)})" if args else type(self).__name__

    def _repr_args(self) -> list[str]:
        """The constructor arguments ``repr`` shows before the name (a layer's sizes)."""
        return []

    @abc.abstractmethod
    def init(self, key: jax.Array, input_type: Type) -> PyTree:
        """Returns the parameters (a pytree) for inputs of ``input_type``."""

    @abc.abstractmethod
    def apply(self, params: PyTree, *inputs: PyTree) -> PyTree:
        """Runs the layer on batched inputs (a top-level tuple input is unpacked)."""

    def _apply_keyed(self, params: PyTree, *inputs: PyTree, key: jax.Array | None) -> PyTree:
        """``apply``, passing ``key`` only to stochastic layers."""
        stochastic = takes_key(type(self).apply) if self.stochastic is None else self.stochastic
        return self.apply(params, *inputs, key=key) if stochastic else self.apply(params, *inputs)  # type: ignore[call-arg]

    def check_constant_inputs(self, *inputs: np.ndarray) -> None:  # noqa: B027 (optional hook)
        """Validates host-known input values at ``build_batch`` (override to check; raise to reject).

        It sees the calls whose inputs are all constants, many at once:
        argument ``j`` stacks input ``j`` of every such call along a new
        leading axis. The error then names the first example that fails.
        """

    @staticmethod
    def from_pure(init: Callable[[jax.Array, Type], PyTree], apply: Callable[..., PyTree], name: str | None = None,
                  trainable: bool = True) -> Layer:
        """A layer from ``init(key, input_type) -> params`` and ``apply(params, *inputs)`` on
        batched inputs (see ``fold/blocks/adapters.py``)."""
        from fold.blocks.adapters import PureLayer

        return PureLayer(init, apply, name, trainable)

    @staticmethod
    def from_equinox(module: UserModule, name: str | None = None, trainable: bool = True) -> Layer:
        """A layer running an Equinox module on each row; its floating-point arrays are the
        parameters (needs ``equinox``; see ``fold/blocks/adapters.py``).

        Example::

            mlp = eqx.nn.MLP(4, 4, 16, 2, key=jax.random.key(0))
            model = fd.Vector(4) >> fd.Layer.from_equinox(mlp, name="mlp")
        """
        from fold.blocks.adapters import EquinoxLayer

        return EquinoxLayer(module, name, trainable)

    @staticmethod
    def from_flax(module: UserModule, name: str | None = None, trainable: bool = True, *, rngs: Sequence[str] = (),
                  train_kwargs: Mapping[str, object] | None = None,
                  eval_kwargs: Mapping[str, object] | None = None) -> Layer:
        """A layer running a Flax module (NNX or Linen) on the batch; an NNX module's
        ``nnx.Param``s, or a Linen module's variables from its ``init``, are the parameters
        (needs ``flax``; see ``fold/blocks/adapters.py``).

        Dropout in the module: an NNX module built with ``nnx.Rngs`` for it is stochastic as
        it is; a Linen module needs ``rngs`` (the RNG collections it draws from) and, when
        its call takes a flag, ``train_kwargs``/``eval_kwargs``.

        Example::

            class MLP(linen.Module):
                @linen.compact
                def __call__(self, x, train: bool = False):
                    return linen.Dropout(0.1, deterministic=not train)(linen.Dense(4)(x))

            layer = fd.Layer.from_flax(MLP(), rngs=("dropout",), train_kwargs={"train": True})
        """
        from fold.blocks.adapters import flax_layer

        return flax_layer(module, name, trainable, rngs, train_kwargs, eval_kwargs)

    def __rshift__(self, other: BlockLike) -> Block:
        from fold.blocks.plumbing import Pipe
        from fold.blocks.tensors import Function

        return Pipe(Function(self), other)

    def __rrshift__(self, other: BlockLike) -> Block:
        from fold.blocks.plumbing import Pipe
        from fold.blocks.tensors import Function

        return Pipe(other, Function(self))

    def reads(self, *sources: BlockLike) -> Block:
        """``Function(self).reads(*sources)``: a layer wires into a ``Composition`` as it pipes with ``>>``
        (every use of one layer object shares its parameters)."""
        from fold.blocks.tensors import Function

        return Function(self).reads(*sources)


def vector_size(layer: Layer, t: Type) -> tuple[int, str]:
    """Total size of a vector input, or of a tuple of vectors (concatenated)."""
    items = list(t) if isinstance(t, TupleType) else [t]
    size, dtype = 0, None
    for item in items:
        if not isinstance(item, TensorType) or item.ndim != 1 or dtype_kind(item.dtype) != "f":
            raise TypeError(f"{layer!r} takes float vectors (or a tuple of them), not {t}")
        if dtype is not None and item.dtype != dtype:
            raise TypeError(f"{layer!r} got mixed dtypes in {t}")
        size, dtype = size + item.shape[0], item.dtype
    return size, dtype or "float32"


class FC(Layer):
    """Fully connected layer: ``activation(normalization_fn(x @ w + b))``.

    Takes a float vector, or a tuple of vectors which are concatenated.
    ``initializer`` (JAX-style ``init(key, shape, dtype)``) makes ``w``
    (default Glorot uniform); ``b`` starts at zero, and ``use_bias=False``
    leaves it out (``x @ w``; the parameters hold ``w`` only). ``activation=None`` is
    linear; a string names a function of ``jax.nn`` (``"relu"``, the
    default, ``"tanh"``, ``"sigmoid"``, ...). As in Fold, ``input_keep_prob`` and ``output_keep_prob`` drop
    the input and the output out (inverted dropout, active only when
    ``compiler.apply`` gets a ``key``), and ``normalization_fn`` runs
    between the affine map and the activation; it must work row by row
    (rows of one batched call come from different examples), as layer
    normalisation does and batch normalisation does not.

    Examples:
        >>> import fold as fd, jax
        >>> fc = fd.FC(3, input_keep_prob=0.8, name="dense")
        >>> compiler = fd.Compiler.create(fd.Vector(2) >> fc)
        >>> params = compiler.init(jax.random.key(0))
        >>> fc.output_size, fc.weights(params).shape, fc.bias(params).shape
        (3, (2, 3), (3,))
    """

    def __init__(self, num_units_out: int, activation: Activation | str | None = "relu",
                 initializer: Initializer | None = None, input_keep_prob: float | None = None,
                 output_keep_prob: float | None = None, normalization_fn: Activation | None = None,
                 name: str | None = None, use_bias: bool = True):
        super().__init__(name)
        if whole("FC", "num_units_out", num_units_out) <= 0:
            raise ValueError(f"FC needs a positive num_units_out, got {num_units_out}")
        if not isinstance(use_bias, bool):
            raise TypeError(f"FC's use_bias must be True or False, got {use_bias!r}")
        self.use_bias = use_bias
        self.num_units_out = int(num_units_out)
        self.activation = _activation(self, activation)
        self.initializer = initializer or jax.nn.initializers.glorot_uniform()
        self.input_drop = _drop_rate(self, "input_keep_prob", input_keep_prob)
        self.output_drop = _drop_rate(self, "output_keep_prob", output_keep_prob)
        if normalization_fn is not None and not callable(normalization_fn):
            raise TypeError(f"FC's normalization_fn must be callable, got {normalization_fn!r}")
        self.normalization_fn = normalization_fn
        self.stochastic = bool(self.input_drop or self.output_drop)

    @property
    def output_size(self) -> int:
        """The number of output units."""
        return self.num_units_out

    def _repr_args(self) -> list[str]:
        return [str(self.num_units_out)] if hasattr(self, "num_units_out") else []

    def weights(self, params: Weights) -> jax.Array:
        """This layer's weight matrix ``w`` in ``params`` (from ``compiler.init``)."""
        return self._own(params)["w"]

    def bias(self, params: Weights) -> jax.Array:
        """This layer's bias ``b`` in ``params`` (from ``compiler.init``)."""
        if not self.use_bias:
            raise ValueError(f"{self!r} was made with use_bias=False: it has no bias")
        return self._own(params)["b"]

    def _own(self, params: Params) -> Weights:
        if self.name not in params:
            raise KeyError(f"params has no entry {self.name!r} for this {type(self).__name__}: make them with the "
                           "compiler of a model that uses it")
        weights: Weights = params[self.name]
        return weights

    def init(self, key: jax.Array, input_type: Type) -> Weights:
        size, dtype = vector_size(self, input_type)
        weights = {"w": self.initializer(key, (size, self.num_units_out), dtype)}
        if self.use_bias:
            weights["b"] = jnp.zeros((self.num_units_out,), dtype)
        return weights

    def apply(self, params: Weights, *inputs: jax.Array, key: jax.Array | None = None) -> jax.Array:
        x = inputs[0] if len(inputs) == 1 else jnp.concatenate(inputs, axis=-1)
        keys = (None, None) if key is None else jax.random.split(key)
        x = dropout(keys[0], self.input_drop, x)
        y = x @ params["w"] + params["b"] if self.use_bias else x @ params["w"]
        if self.normalization_fn is not None:
            y = self.normalization_fn(y)
        y = y if self.activation is None else self.activation(y)
        return dropout(keys[1], self.output_drop, y)


def _activation(layer: Layer, activation: Activation | str | None) -> Activation | None:
    """``activation``, a string naming a function of ``jax.nn`` resolved."""
    if activation is None or (callable(activation) and not isinstance(activation, str)):
        return activation
    if not isinstance(activation, str):
        raise TypeError(f"{type(layer).__name__}'s activation must be a callable, a jax.nn name or None, "
                        f"got {activation!r}")
    fn: Activation | None = getattr(jax.nn, activation, None)
    if not callable(fn) or activation.startswith("_") or activation == "initializers":
        raise ValueError(f"{type(layer).__name__}: jax.nn has no activation {activation!r} "
                         "(e.g. 'relu', 'tanh', 'sigmoid', 'gelu', 'softplus')")
    return fn


def _drop_rate(layer: Layer, what: str, keep_prob: float | None) -> float:
    """The dropout rate of a keep probability in (0, 1] (None keeps everything)."""
    if keep_prob is None:
        return 0.0
    keep = float(keep_prob)
    if not 0.0 < keep <= 1.0:
        raise ValueError(f"{type(layer).__name__} needs {what} in (0, 1], got {keep_prob!r}")
    return 1.0 - keep


class Embedding(Layer):
    """A table of ``num_buckets`` vectors of size ``num_units_out``, indexed by int ids.

    Ids are taken modulo ``num_buckets`` (Python modulo) when ``mod_inputs``;
    otherwise an out-of-range id known at ``build_batch`` is a ValueError.
    ``initializer`` is a JAX initializer or an array of shape
    ``(num_buckets, num_units_out)``; the default is normal with standard
    deviation 1/sqrt(num_units_out). ``dtype`` is the table's dtype.
    """

    def __init__(self, num_buckets: int, num_units_out: int, initializer: Initializer | np.ndarray | None = None,
                 trainable: bool = True, mod_inputs: bool = True, name: str | None = None,
                 dtype: DTypeLike = "float32"):
        super().__init__(name, trainable)
        self.dtype = requested_dtype(dtype, "Embedding")
        self.num_buckets = whole("Embedding", "num_buckets", num_buckets)
        self.num_units_out = whole("Embedding", "num_units_out", num_units_out)
        if self.num_buckets <= 0 or self.num_units_out <= 0:
            raise ValueError(f"Embedding needs positive sizes, got {num_buckets} x {num_units_out}")
        if self.num_buckets > _MAX_ID + 1:
            raise ValueError(f"Embedding has {num_buckets} buckets, more than its int32 ids can index "
                             f"({_MAX_ID + 1}); hash the ids into fewer (mod_inputs=True takes them modulo "
                             "num_buckets)")
        self.mod_inputs = mod_inputs
        self._table = None
        if initializer is not None and not callable(initializer):
            table = np.asarray(initializer)
            if table.shape != (self.num_buckets, self.num_units_out):
                raise ValueError(
                    f"Embedding initializer has shape {table.shape}, expected "
                    f"{(self.num_buckets, self.num_units_out)}"
                )
            self._table = table
            initializer = None
        self.initializer = initializer or jax.nn.initializers.normal(1.0 / np.sqrt(self.num_units_out))

    def _repr_args(self) -> list[str]:
        return [str(self.num_buckets), str(self.num_units_out)] if hasattr(self, "num_units_out") else []

    def init(self, key: jax.Array, input_type: Type) -> Weights:
        if not isinstance(input_type, TensorType) or input_type.shape != () or \
                dtype_kind(input_type.dtype) not in "iu":
            raise TypeError(f"{self!r} takes scalar integer ids, not {input_type}")
        if self._table is not None:
            return {"table": jnp.asarray(self._table, dtype=self.dtype)}
        return {"table": self.initializer(key, (self.num_buckets, self.num_units_out), self.dtype)}

    def apply(self, params: Weights, ids: jax.Array) -> jax.Array:
        ids = ids.astype(jnp.int32)
        if self.mod_inputs:
            ids = jnp.remainder(ids, self.num_buckets)
        return params["table"][ids]

    def check_constant_inputs(self, ids: np.ndarray) -> None:  # type: ignore[override]  # one input
        bad = (ids < 0) | (ids >= self.num_buckets)
        if not self.mod_inputs and bad.any():
            raise ValueError(f"{self!r}: id {int(ids[bad][0])} is outside [0, {self.num_buckets}) "
                             "and mod_inputs=False")


def dropout(key: jax.Array | None, rate: float, x: jax.Array) -> jax.Array:
    """Inverted dropout: zeroes each value with probability ``rate`` and scales the rest
    by ``1 / (1 - rate)``; the identity when ``key`` is None or ``rate`` is 0."""
    if key is None or rate == 0:
        return x
    keep = jax.random.bernoulli(key, 1.0 - rate, x.shape)
    return jnp.where(keep, x / (1.0 - rate), jnp.zeros((), x.dtype))


def check_rate(layer: object, rate: float) -> float:
    """``rate`` as a float in [0, 1), or a ValueError naming ``layer``."""
    rate = float(rate)
    if not 0.0 <= rate < 1.0:
        raise ValueError(f"{type(layer).__name__} needs a dropout rate in [0, 1), got {rate}")
    return rate


class Dropout(Layer):
    """Inverted dropout on a float tensor: active only when ``compiler.apply`` gets a ``key``.

    Each value is zeroed with probability ``rate`` and the others are scaled
    by ``1 / (1 - rate)``, so evaluation (no key) is the identity. It has no
    parameters (its entry in ``params`` is an empty dict).

    Examples:
        >>> import fold as fd, jax
        >>> model = fd.Vector(1000) >> fd.Dropout(0.5)
        >>> compiler = fd.Compiler.create(model)
        >>> params = compiler.init(jax.random.key(0))
        >>> batch = compiler.build_batch([[1.0] * 1000])
        >>> compiler.apply(params, batch).outputs.sum().item()  # no key: identity
        1000.0
        >>> out = compiler.apply(params, batch, key=jax.random.key(1)).outputs
        >>> sorted(set(out.ravel().tolist()))
        [0.0, 2.0]
    """

    stochastic = True

    def __init__(self, rate: float, name: str | None = None):
        super().__init__(name)
        self.rate = check_rate(self, rate)

    def _repr_args(self) -> list[str]:
        return [repr(self.rate)] if hasattr(self, "rate") else []

    def init(self, key: jax.Array, input_type: Type) -> Weights:
        if not isinstance(input_type, TensorType) or dtype_kind(input_type.dtype) != "f":
            raise TypeError(f"{self!r} takes one float tensor, not {input_type}")
        return {}

    def apply(self, params: Weights, x: jax.Array, key: jax.Array | None = None) -> jax.Array:
        return dropout(key, self.rate, x)
