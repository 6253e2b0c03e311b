"""What ``Compiler.apply`` returns: ``Result`` and ``MetricValues`` (JAX pytrees)."""

from __future__ import annotations

from typing import TypeAlias

import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["Result", "MetricValues", "Outputs"]

Outputs: TypeAlias = "jax.Array | tuple[Outputs, ...] | None"
"""A root's outputs: arrays with one row per example, nested like its type (None for void)."""


@jax.tree_util.register_pytree_node_class
class MetricValues:
    """Every value of one metric in a batch.

    A batch's metric has a fixed number ``M`` of entries (so that batches
    share compilations), the real ones first (ordered by example, then by
    the order the walk produced them) and zeros after: ``padded`` is that
    ``[M, *shape]`` array, ``mask`` marks the real entries and ``example``
    gives each entry's example index (-1 for padding). Reduce with ``sum()``,
    ``mean()`` and ``count()``, which skip the padding and work under
    ``jit``. ``values`` is the real entries only, ``[count, *shape]``: its
    length depends on the batch, so it exists only outside traced code
    (inside, it raises rather than let a mean over ``padded`` count zeros).
    """

    def __init__(self, padded: jax.Array, mask: jax.Array, example: jax.Array):
        self.padded = padded
        self.mask = mask
        self.example = example

    def tree_flatten(self) -> tuple[tuple[jax.Array, jax.Array, jax.Array], None]:
        return (self.padded, self.mask, self.example), None

    @classmethod
    def tree_unflatten(cls, aux: None, children: tuple[jax.Array, jax.Array, jax.Array]) -> MetricValues:
        return cls(*children)

    @classmethod
    def zero_padded(cls, padded: jax.Array, mask: jax.Array, example: jax.Array) -> MetricValues:
        """Entries whose padded rows (whatever ``padded`` holds there) become zeros."""
        shaped = mask.reshape(mask.shape + (1,) * (padded.ndim - 1))
        return cls(jnp.where(shaped, padded, jnp.zeros((), padded.dtype)), mask, example)

    @property
    def values(self) -> jax.Array:
        """The real entries, ``[count, *shape]`` (outside traced code only; see the class)."""
        if any(isinstance(x, jax.core.Tracer) for x in (self.padded, self.mask)):
            raise TypeError("MetricValues.values has as many entries as the batch has, which traced code cannot "
                            "know: use .sum(), .mean() or .count(), or .padded with .mask")
        return self.padded[: int(np.asarray(self.mask).sum())]

    def count(self) -> jax.Array:
        """The number of real entries."""
        return jnp.sum(self.mask.astype(jnp.int32))

    def sum(self) -> jax.Array:
        """Sum over real entries (a vector metric gives a vector)."""
        return jnp.sum(self.padded, axis=0)  # padded entries are zeros

    def mean(self) -> jax.Array:
        """Mean over real entries; 0 when there are none."""
        n = jnp.maximum(self.count(), 1).astype(self.padded.dtype)
        return self.sum() / n

    def __repr__(self) -> str:
        if any(isinstance(x, jax.core.Tracer) for x in (self.padded, self.mask)):
            return f"MetricValues(padded={self.padded!r})"
        return f"MetricValues(count={int(np.asarray(self.mask).sum())}, values={np.asarray(self.values)!r})"


@jax.tree_util.register_pytree_node_class
class Result:
    """``outputs``: nested like the root's output type, ``[num_examples, *shape]``
    arrays (None for void parts); ``metrics``: ``{name: MetricValues}``."""

    def __init__(self, outputs: Outputs, metrics: dict[str, MetricValues]):
        self.outputs = outputs
        self.metrics = metrics

    def tree_flatten(self) -> tuple[tuple[Outputs, dict[str, MetricValues]], None]:
        return (self.outputs, self.metrics), None

    @classmethod
    def tree_unflatten(cls, aux: None, children: tuple[Outputs, dict[str, MetricValues]]) -> Result:
        return cls(*children)

    def __repr__(self) -> str:
        return f"Result(outputs={self.outputs!r}, metrics={self.metrics!r})"
