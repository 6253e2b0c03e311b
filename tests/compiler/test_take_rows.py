"""``take_rows``: the executor's row gather, against plain indexing."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from fold.compiler.executor import take_rows


def test_take_rows_equals_indexing_for_row_numbers_in_bounds():
    a = jax.random.normal(jax.random.key(0), (7, 3, 2))
    rows = np.array([6, 0, 0, 3, 5], np.int32)
    np.testing.assert_array_equal(jax.jit(take_rows)(a, rows), a[rows])
    np.testing.assert_array_equal(take_rows(np.asarray(a), jnp.asarray(rows)), np.asarray(a)[rows])


def test_take_rows_clamps_rows_past_the_end_and_does_not_wrap_negative_ones():
    a = jnp.arange(5.0)
    # Padded rows may hold any number: they must read some row, never fault (their values are masked).
    np.testing.assert_array_equal(take_rows(a, jnp.array([7, -1, 2])), [4.0, 0.0, 2.0])


def test_take_rows_gradient_scatters_into_the_rows_read():
    a = jnp.arange(6.0).reshape(3, 2)
    grad = jax.grad(lambda a: jnp.sum(take_rows(a, jnp.array([2, 2, 0])) ** 2))(a)
    np.testing.assert_allclose(grad, [[0.0, 2.0], [0.0, 0.0], [16.0, 20.0]])
