"""The names fold gives to values whose type is the user's: each says what it holds.

``Any`` in fold's signatures appears only through these aliases (and the block-level ones in
``fold/blocks/host.py``), where a value really is whatever the user made.

Examples:
    >>> import jax.numpy as jnp
    >>> params: Params = {"fc": {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}}
"""

from __future__ import annotations

from typing import Any, TypeAlias

__all__ = ["PyObject", "PyTree", "Params", "UserModule"]

PyObject: TypeAlias = Any
"""Any Python object: a user's example, a field of it, a label, a user function's result."""

PyTree: TypeAlias = Any
"""A JAX pytree whose structure its maker decides: a layer's parameters, an optimizer's state."""

Params: TypeAlias = dict[str, PyTree]
"""A model's parameters: ``{layer name: that layer's pytree}`` (``Compiler.init``)."""

UserModule: TypeAlias = Any
"""A user's Equinox module or Flax (Linen or NNX) module, wrapped as a layer."""
