"""The generation decisions: ``argmax`` against ``jnp.argmax``, draws against ``jax.random.categorical``."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fold.generation.decoder import argmax, choose


@pytest.mark.parametrize("case", ["random", "ties", "nan", "infinities", "signed zeros"])
def test_argmax_equals_jnp_argmax(case):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(50, 37)).astype(np.float32)
    if case == "ties":
        x = np.round(x)  # many equal maxima: the first wins
    elif case == "nan":
        x[rng.random(x.shape) < 0.05] = np.nan
        x[0] = np.nan
    elif case == "infinities":
        x[rng.random(x.shape) < 0.1] = np.inf
        x[rng.random(x.shape) < 0.1] = -np.inf
        x[1] = -np.inf
    elif case == "signed zeros":
        x = np.where(rng.random(x.shape) < 0.5, np.float32(0.0), np.float32(-0.0))
    got = jax.jit(argmax)(jnp.asarray(x))
    assert got.dtype == jnp.int32
    np.testing.assert_array_equal(got, jnp.argmax(x, axis=-1))


def test_argmax_keeps_leading_axes():
    x = jax.random.normal(jax.random.key(0), (3, 4, 9))
    np.testing.assert_array_equal(argmax(x), jnp.argmax(x, axis=-1))


def test_draws_equal_categorical_with_the_documented_keys():
    key = jax.random.key(7)
    logits = jax.random.normal(jax.random.key(1), (40, 11)) * 3
    example, node = jnp.arange(40) % 5, jnp.arange(40) // 5
    got = jax.jit(lambda lg: choose(lg, key, example, node, 1))(logits)
    want = [int(jax.random.categorical(jax.random.fold_in(jax.random.fold_in(jax.random.fold_in(key, b), n), 1), row))
            for b, n, row in zip(example.tolist(), node.tolist(), logits)]
    np.testing.assert_array_equal(got, want)


def test_greedy_choice_is_argmax():
    logits = jax.random.normal(jax.random.key(2), (16, 6))
    np.testing.assert_array_equal(choose(logits, None, jnp.zeros(16, jnp.int32), jnp.arange(16), 0),
                                  jnp.argmax(logits, -1))
