"""Recurrent cells: ``LSTMCell``, ``GRUCell`` and ``BinaryTreeLSTMCell``.

A cell is a layer called on ``(input, state)`` that returns
``(output, new_state)``. Each exposes ``state_type`` so that ``RNN`` can
start from zeros.

``recurrent_dropout`` is the recurrent dropout of Semeniuta et al. (2016):
dropout on the candidate update (``tanh(g)`` of an LSTM, the GRU's
candidate state), which regularises without erasing the memory. It is
active only when ``compiler.apply`` gets a ``key``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from fold.blocks.layers import Initializer, Layer, Weights, check_rate, dropout, vector_size
from fold.blocks.types import TensorType, TupleType, Type
from fold.errors import whole

__all__ = ["LSTMCell", "GRUCell", "BinaryTreeLSTMCell"]


def _flat(x: jax.Array | tuple[jax.Array, ...]) -> jax.Array:
    """A cell's input rows: a tuple of vectors is concatenated."""
    return jnp.concatenate(x, axis=-1) if isinstance(x, tuple) else x


class _Cell(Layer):
    def __init__(self, num_units: int, initializer: Initializer | None, name: str | None,
                 recurrent_dropout: float):
        super().__init__(name)
        self.num_units = whole(type(self).__name__, "num_units", num_units)
        if self.num_units <= 0:
            raise ValueError(f"{type(self).__name__} needs a positive num_units, got {num_units}")
        self.initializer = initializer or jax.nn.initializers.glorot_uniform()
        self.recurrent_dropout = check_rate(self, recurrent_dropout)

    def _repr_args(self) -> list[str]:
        return [str(self.num_units)] if hasattr(self, "num_units") else []

    @property
    def stochastic(self) -> bool:  # type: ignore[override]
        return self.recurrent_dropout > 0

    def _split_input(self, input_type: Type) -> tuple[TensorType, Type]:
        """The input as one vector type (a tuple of vectors is concatenated, as ``FC`` does) and
        the state type."""
        if not isinstance(input_type, TupleType) or len(input_type) != 2:
            raise TypeError(f"{self!r} takes (input vector, state), not {input_type}")
        try:
            size, dtype = vector_size(self, input_type[0])
        except TypeError:
            raise TypeError(f"{self!r} takes (input vector or tuple of vectors, state), not {input_type}") from None
        return TensorType((size,), dtype), input_type[1]

    def _check_state(self, state: Type, expected: Type, input_type: Type) -> None:
        if state != expected:
            raise TypeError(f"{self!r} needs state {expected}, got input {input_type}")


class _LSTMFamily(_Cell):
    """Cells whose state is an LSTM state ``(c, h)``, with a forget-gate bias."""

    def __init__(self, num_units: int, forget_bias: float = 1.0, initializer: Initializer | None = None,
                 name: str | None = None, recurrent_dropout: float = 0.0):
        super().__init__(num_units, initializer, name, recurrent_dropout)
        self.forget_bias = forget_bias

    @property
    def state_type(self) -> TupleType:
        h = TensorType((self.num_units,))
        return TupleType(h, h)


class LSTMCell(_LSTMFamily):
    """LSTM cell: ``(x, (c, h)) -> (h', (c', h'))`` with a forget-gate bias (default 1).

    Parameters (``H = num_units``, ``X`` the input size; a tuple of input
    vectors is concatenated first): ``w`` of shape ``(X + H, 4H)``, applied
    to ``[x; h]`` (input rows first), and ``b`` of shape ``(4H,)``, zero at
    first. The four column blocks of ``[x; h] @ w + b`` are, in order, the
    input gate ``i``, the forget gate ``f``, the candidate ``g`` and the
    output gate ``o`` (the order of PyTorch's ``nn.LSTM`` and Keras' ``LSTM``)::

        c' = sigmoid(f + forget_bias) * c + sigmoid(i) * tanh(g)
        h' = sigmoid(o) * tanh(c')

    ``forget_bias`` is added in ``apply``, not stored in ``b``. With
    ``recurrent_dropout``, ``tanh(g)`` is dropped out (Semeniuta et al.
    2016) when ``apply`` gets a key. To load weights kept as PyTorch's
    ``nn.LSTM`` keeps them (``weight_ih`` ``(4H, X)``, ``weight_hh``
    ``(4H, H)``, gates ``i, f, g, o``): ``w = concatenate([weight_ih.T,
    weight_hh.T])``, ``b = bias_ih + bias_hh``, with ``forget_bias=0``.
    """

    def init(self, key: jax.Array, input_type: Type) -> Weights:
        x, state = self._split_input(input_type)
        h = TensorType((self.num_units,), x.dtype)
        self._check_state(state, TupleType(h, h), input_type)
        n = x.shape[0] + self.num_units
        return {"w": self.initializer(key, (n, 4 * self.num_units), x.dtype),
                "b": jnp.zeros((4 * self.num_units,), x.dtype)}

    def apply(self, params: Weights, x: jax.Array, state: tuple[jax.Array, jax.Array],
              key: jax.Array | None = None) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
        c, h = state
        z = jnp.concatenate([_flat(x), h], axis=-1) @ params["w"] + params["b"]
        i, f, g, o = jnp.split(z, 4, axis=-1)
        g = dropout(key, self.recurrent_dropout, jnp.tanh(g))
        c2 = jax.nn.sigmoid(f + self.forget_bias) * c + jax.nn.sigmoid(i) * g
        h2 = jax.nn.sigmoid(o) * jnp.tanh(c2)
        return h2, (c2, h2)


class GRUCell(_Cell):
    """GRU cell: ``(x, h) -> (h', h')`` (Cho et al. 2014, the reset gate before the matmul).

    Parameters (``H = num_units``, ``X`` the input size): ``w_gates``
    ``(X + H, 2H)`` and ``b_gates`` ``(2H,)``, whose column blocks are the
    reset gate ``r`` then the update gate ``z``; ``w_cand`` ``(X + H, H)``
    and ``b_cand`` ``(H,)`` for the candidate. Biases start at zero::

        r, z = split(sigmoid([x; h] @ w_gates + b_gates))
        h' = z * h + (1 - z) * tanh([x; r * h] @ w_cand + b_cand)

    (TensorFlow's ``GRUCell``; PyTorch's ``nn.GRU`` applies ``r`` after
    the hidden matmul and swaps the roles of ``z`` and ``1 - z``, so its
    weights do not load as they are.)
    """

    def __init__(self, num_units: int, initializer: Initializer | None = None, name: str | None = None,
                 recurrent_dropout: float = 0.0):
        super().__init__(num_units, initializer, name, recurrent_dropout)

    @property
    def state_type(self) -> TensorType:
        return TensorType((self.num_units,))

    def init(self, key: jax.Array, input_type: Type) -> Weights:
        x, state = self._split_input(input_type)
        self._check_state(state, TensorType((self.num_units,), x.dtype), input_type)
        n, u = x.shape[0] + self.num_units, self.num_units
        k1, k2 = jax.random.split(key)
        return {"w_gates": self.initializer(k1, (n, 2 * u), x.dtype), "b_gates": jnp.zeros((2 * u,), x.dtype),
                "w_cand": self.initializer(k2, (n, u), x.dtype), "b_cand": jnp.zeros((u,), x.dtype)}

    def apply(self, params: Weights, x: jax.Array, h: jax.Array,
              key: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
        x = _flat(x)
        gates = jnp.concatenate([x, h], axis=-1) @ params["w_gates"] + params["b_gates"]
        r, z = jnp.split(jax.nn.sigmoid(gates), 2, axis=-1)
        cand = jnp.tanh(jnp.concatenate([x, r * h], axis=-1) @ params["w_cand"] + params["b_cand"])
        cand = dropout(key, self.recurrent_dropout, cand)
        h2 = z * h + (1.0 - z) * cand
        return h2, h2


class BinaryTreeLSTMCell(_LSTMFamily):
    """Binary Tree-LSTM cell (Tai et al. 2015, N-ary with N=2).

    ``(x, ((c_l, h_l), (c_r, h_r))) -> (h, (c, h))`` with input, output and
    update gates and one forget gate per child, each reading ``x`` and both
    children's ``h``. The forget gates get ``forget_bias`` (default 1).

    Parameters (``H = num_units``, ``X`` the input size): ``w`` of shape
    ``(X + 2H, 5H)`` on ``[x; h_l; h_r]`` and ``b`` ``(5H,)``, whose column
    blocks are, in order, ``i``, ``f_l``, ``f_r``, ``o`` and the update
    ``u``::

        c = sigmoid(i) * tanh(u) + sigmoid(f_l + forget_bias) * c_l + sigmoid(f_r + forget_bias) * c_r
        h = sigmoid(o) * tanh(c)
    """

    def init(self, key: jax.Array, input_type: Type) -> Weights:
        x, states = self._split_input(input_type)
        h = TensorType((self.num_units,), x.dtype)
        self._check_state(states, TupleType(TupleType(h, h), TupleType(h, h)), input_type)
        n = x.shape[0] + 2 * self.num_units
        return {"w": self.initializer(key, (n, 5 * self.num_units), x.dtype),
                "b": jnp.zeros((5 * self.num_units,), x.dtype)}

    def apply(self, params: Weights, x: jax.Array,
              states: tuple[tuple[jax.Array, jax.Array], tuple[jax.Array, jax.Array]],
              key: jax.Array | None = None) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
        (c_l, h_l), (c_r, h_r) = states
        z = jnp.concatenate([_flat(x), h_l, h_r], axis=-1) @ params["w"] + params["b"]
        i, f_l, f_r, o, u = jnp.split(z, 5, axis=-1)
        u = dropout(key, self.recurrent_dropout, jnp.tanh(u))
        c = (jax.nn.sigmoid(i) * u + jax.nn.sigmoid(f_l + self.forget_bias) * c_l
             + jax.nn.sigmoid(f_r + self.forget_bias) * c_r)
        h = jax.nn.sigmoid(o) * jnp.tanh(c)
        return h, (c, h)
