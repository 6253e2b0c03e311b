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


def test_one_row_is_a_dynamic_slice_with_the_same_values_clamping_and_gradient():
    """One row is read with ``dynamic_slice``, not a gather: XLA's CPU emitter failed to compile
    seed 19469 of the fuzz (``test_fuzz``), where XLA had turned a one-row gather into a
    ``dynamic-slice`` reading its start from a ``dynamic_slice`` of JAX's in the same fusion."""
    a = jax.random.normal(jax.random.key(1), (7, 3))
    for r in (0, 4, 6, 9, -2):  # past the end clamps to the last row, negative to the first
        want = np.asarray(a)[[min(max(r, 0), 6)]]
        for rows in (np.array([r], np.int32), jnp.array([r], jnp.int32)):
            np.testing.assert_array_equal(jax.jit(take_rows)(a, rows), want)
    jaxpr = str(jax.make_jaxpr(take_rows)(a, jnp.array([3], jnp.int32)))
    assert "dynamic_slice" in jaxpr and "gather" not in jaxpr
    grad = jax.grad(lambda a: jnp.sum(take_rows(a, jnp.array([2])) ** 2))(a)
    np.testing.assert_allclose(grad, np.where(np.arange(7)[:, None] == 2, 2 * np.asarray(a), 0.0), rtol=1e-6)
