"""What ``Compiler.apply`` returns: ``Result`` and ``MetricValues`` (JAX pytrees)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

__all__ = ["Result", "MetricValues"]


@jax.tree_util.register_pytree_node_class
class MetricValues:
    """Every value of one metric in a batch.

    ``values`` is ``[M, *shape]`` with the real entries first (ordered by
    example, then by the order the walk produced them) and padding after;
    ``mask`` marks real entries and ``example`` gives each entry's example
    index (-1 for padding).
    """

    def __init__(self, values: Any, mask: Any, example: Any):
        self.values = values
        self.mask = mask
        self.example = example

    def tree_flatten(self):
        return (self.values, self.mask, self.example), None

    @classmethod
    def tree_unflatten(cls, aux: Any, children: tuple) -> MetricValues:
        return cls(*children)

    def masked(self) -> jax.Array:
        """``values`` with zeros in the padded entries."""
        mask = self.mask.reshape(self.mask.shape + (1,) * (self.values.ndim - 1))
        return jnp.where(mask, self.values, jnp.zeros((), self.values.dtype))

    def replace(self, values: Any) -> MetricValues:
        """These entries with other ``values``."""
        return MetricValues(values, self.mask, self.example)

    def count(self) -> jax.Array:
        """The number of real entries."""
        return jnp.sum(self.mask.astype(jnp.int32))

    def sum(self) -> jax.Array:
        """Sum over real entries (a vector metric gives a vector)."""
        return jnp.sum(self.masked(), axis=0)

    def mean(self) -> jax.Array:
        """Mean over real entries; 0 when there are none."""
        n = jnp.maximum(self.count(), 1).astype(self.values.dtype)
        return self.sum() / n

    def __repr__(self) -> str:
        return f"MetricValues(values={self.values!r}, mask={self.mask!r})"


@jax.tree_util.register_pytree_node_class
class Result:
    """``outputs``: nested like the root's output type, ``[num_examples, *shape]``
    arrays (None for void parts); ``metrics``: ``{name: MetricValues}``."""

    def __init__(self, outputs: Any, metrics: dict):
        self.outputs = outputs
        self.metrics = metrics

    def tree_flatten(self):
        return (self.outputs, self.metrics), None

    @classmethod
    def tree_unflatten(cls, aux: Any, children: tuple) -> Result:
        return cls(*children)

    def __repr__(self) -> str:
        return f"Result(outputs={self.outputs!r}, metrics={self.metrics!r})"
