"""What the generation blocks share: the ``Decoder`` contract, decisions and their log-probabilities.

A decoder (``SequenceDecoder``, ``TreeDecoder``) is a block with two uses. In a model it scores a
known structure (teacher forcing): its input is ``(start state, structure)`` and its output one
log-probability per decision.
``fd.Generator`` runs the same blocks on the device, where the decoder decides the structure
itself: each decoder's ``device_parts`` become functions of batched arrays (made by
``fold/generation/device.py``), and its ``decode(fns, params, start, key, examples)`` decides for
every example at once in one ``lax.while_loop``, only the first ``examples`` rows generating.

Decisions are greedy (``argmax``) without a key. With one, decision ``d`` (0, 1, ...) of node
or step ``n`` of example ``b`` draws from ``categorical(fold_in(fold_in(fold_in(key, b), n), d),
logits)``: what an example generates does not depend on the batch around it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeAlias

import jax
import jax.numpy as jnp
from jax import lax

from fold.blocks.base import Block
from fold.blocks.types import TupleType, Type
from fold.typing import PyTree

if TYPE_CHECKING:
    from fold.generation.sequence import Generated
    from fold.generation.tree import GeneratedTrees

__all__ = ["Decoder", "Generation", "argmax", "choose", "positive", "token_log_prob"]

Generation: TypeAlias = "Generated | GeneratedTrees"
"""What a decoder generates for a batch of start states."""


def token_log_prob(logits: jax.Array, token: jax.Array) -> jax.Array:
    """Per row, ``log_softmax(logits)[token]``; NaN for a token outside the logits (never a
    silently clamped index)."""
    logp = jax.nn.log_softmax(logits, axis=-1)
    picked = jnp.take_along_axis(logp, token[..., None].astype(jnp.int32), axis=-1, mode="fill",
                                 fill_value=jnp.nan)
    return picked[..., 0]


def argmax(x: jax.Array) -> jax.Array:
    """``jnp.argmax(x, axis=-1)`` as int32 (the first index among equal maxima, the first NaN if
    there is one), computed as a max and a min rather than as one reduction of (value, index)
    pairs: XLA's CPU backend runs that pair reduction element by element, 3-4x slower (over 1,000
    labels it was 40 % of a tree generation's time)."""
    top = jnp.max(x, axis=-1, keepdims=True)
    index = lax.broadcasted_iota(jnp.int32, x.shape, x.ndim - 1)
    return jnp.min(jnp.where((x == top) | jnp.isnan(x), index, x.shape[-1]), axis=-1)


def choose(logits: jax.Array, key: jax.Array | None, example: jax.Array, node: jax.Array, decision: int) -> jax.Array:
    """Per row, the chosen index of ``logits``: its argmax without ``key``, else drawn with the
    key of (``example``, ``node``, ``decision``) (see the module docstring)."""
    if key is None:
        return argmax(logits)

    def noise(b: jax.Array, n: jax.Array, row: jax.Array) -> jax.Array:
        k = jax.random.fold_in(jax.random.fold_in(jax.random.fold_in(key, b), n), decision)
        return jax.random.gumbel(k, row.shape, row.dtype)

    # categorical(k, row) is argmax(gumbel(k) + row): the same draws, with the faster argmax.
    return argmax(jax.vmap(noise)(example, node, logits) + logits)


def positive(owner: str, what: str, n: object) -> int:
    """``n``, checked to be a positive int."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"{owner}: {what} must be a positive int, got {n!r}")
    return n


class Decoder(Block):
    """A generation block: ``(start state, structure) -> log-probabilities`` in a model, decided on
    the device by ``fd.Generator`` (see the module docstring)."""

    @property
    def state_type(self) -> Type | None:
        """The start state's type, once known."""
        t = self.input_type
        return t[0] if isinstance(t, TupleType) else None

    #: The type of the structure it scores, the second item of its input.
    structure_type: Type

    def scratch(self, start: PyTree) -> PyTree:
        """Buffers ``decode`` may be handed back from an earlier call, for start states shaped as
        ``start`` (``fd.Generator.generate`` keeps them): ``decode`` writes every part of them it
        reads, so their contents never matter. None where it needs none."""
        return None

    def set_state_type(self, state: Type) -> None:
        """Sets the input type from the start state's type ``state`` (``fd.Generator`` does, from
        ``state_type=`` or the first start states it gets)."""
        self.set_input_type(TupleType(state, self.structure_type))
