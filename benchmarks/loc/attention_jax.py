"""Feed-forward attention (Raffel & Ellis 2016, sec. 2.3) with its loss and accuracy, in plain JAX.

The same function as ``attention_fold.py``, batched by hand: sequences padded to the longest, a
mask keeping the padding out of the softmax.
"""

import jax
import jax.numpy as jnp
import numpy as np


def init(key, hidden=100):
    def dense(key, n_in, n_out):
        return {"w": jax.nn.initializers.glorot_uniform()(key, (n_in, n_out)), "b": jnp.zeros(n_out)}

    keys = jax.random.split(key, 4)
    return {"encode": dense(keys[0], 2, hidden), "score": dense(keys[1], hidden, 1),
            "hidden": dense(keys[2], hidden, hidden), "out": dense(keys[3], hidden, 1)}


def pad(examples):
    length = max(len(steps) for steps, _ in examples)
    x = np.zeros((len(examples), length, 2), np.float32)
    mask = np.zeros((len(examples), length), bool)
    for i, (steps, _) in enumerate(examples):
        x[i, :len(steps)] = steps
        mask[i, :len(steps)] = True
    return x, mask, np.array([target for _, target in examples], np.float32)


@jax.jit
def _loss_and_accuracy(params, x, mask, target):
    def dense(name, x):
        return x @ params[name]["w"] + params[name]["b"]

    h = jax.nn.relu(dense("encode", x))
    e = jnp.tanh(dense("score", h))[..., 0]
    alpha = jax.nn.softmax(jnp.where(mask, e, -jnp.inf), axis=1)
    context = jnp.sum(alpha[..., None] * h, axis=1)
    error = dense("out", jax.nn.relu(dense("hidden", context)))[:, 0] - target
    return jnp.mean(error**2), jnp.mean(jnp.abs(error) < 0.04)


def loss_and_accuracy(params, examples):
    return _loss_and_accuracy(params, *pad(examples))
