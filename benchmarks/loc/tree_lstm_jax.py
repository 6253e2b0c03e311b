"""A binary constituency Tree-LSTM and one epoch of training for fine-grained SST (Tai et al. 2015,
sec. 5.1), in plain JAX.

The same function as ``tree_lstm_fold.py``, batched by hand: the minibatch's nodes are numbered
children first and grouped into levels by height; a loop over the levels gathers each level's
children states, runs the cell on the whole level and scatters the new states back. Sizes are
rounded up to powers of two so that minibatches share compilations.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax


def init(key, embed_size, state=150, classes=5):
    glorot = jax.nn.initializers.glorot_uniform()
    k1, k2 = jax.random.split(key)
    return {"cell": {"w": glorot(k1, (embed_size + 2 * state, 5 * state)), "b": jnp.zeros(5 * state)},
            "readout": {"w": glorot(k2, (state, classes)), "b": jnp.zeros(classes)}}


def _pow2(n):
    return 1 << (n - 1).bit_length()


def flatten(trees):
    words, labels, left, right, height = [], [], [], [], []

    def visit(tree):
        children = [visit(child) for child in tree[1:]] if len(tree) == 3 else [-1, -1]
        words.append(tree[1] if len(tree) == 2 else 0)
        labels.append(tree[0])
        left.append(children[0])
        right.append(children[1])
        height.append(0 if len(tree) == 2 else 1 + max(height[children[0]], height[children[1]]))
        return len(labels) - 1

    for tree in trees:
        visit(tree)
    n, height = _pow2(len(labels) + 2), np.array(height)
    levels = [np.flatnonzero(height == d) for d in range(height.max() + 1)]
    level_nodes = np.full((_pow2(len(levels)), _pow2(max(map(len, levels)))), n - 1)  # n - 1: a sink
    for d, nodes in enumerate(levels):
        level_nodes[d, :len(nodes)] = nodes

    def padded(values, fill):  # n - 2: the zero state of a leaf's missing children
        return np.pad(np.array(values), (0, n - len(values)), constant_values=fill)

    return {"words": padded(words, 0), "labels": padded(labels, 0), "real": padded([True] * len(labels), False),
            "leaf": padded(np.array(left) < 0, False), "left": padded(np.where(np.array(left) < 0, n - 2, left), 0),
            "right": padded(np.where(np.array(right) < 0, n - 2, right), 0), "levels": level_nodes}


@jax.jit
def loss(params, embeddings, nodes):
    state = params["readout"]["w"].shape[0]
    x = jnp.where(nodes["leaf"][:, None], embeddings[nodes["words"]], 0.0)

    def level(d, ch):
        c, h = ch
        ids = nodes["levels"][d]
        left, right = nodes["left"][ids], nodes["right"][ids]
        z = jnp.concatenate([x[ids], h[left], h[right]], 1) @ params["cell"]["w"] + params["cell"]["b"]
        i, f_l, f_r, o, u = jnp.split(z, 5, axis=1)
        c_new = jax.nn.sigmoid(i) * jnp.tanh(u) + jax.nn.sigmoid(f_l + 1) * c[left] + jax.nn.sigmoid(f_r + 1) * c[right]
        h_new = jax.nn.sigmoid(o) * jnp.tanh(c_new)
        return c.at[ids].set(c_new), h.at[ids].set(h_new)

    zeros = jnp.zeros((len(nodes["words"]), state))
    _, h = jax.lax.fori_loop(0, len(nodes["levels"]), level, (zeros, zeros))
    logits = h @ params["readout"]["w"] + params["readout"]["b"]
    losses = optax.softmax_cross_entropy_with_integer_labels(logits, nodes["labels"])
    return jnp.sum(jnp.where(nodes["real"], losses, 0.0)) / jnp.sum(nodes["real"])


optimizer = optax.chain(optax.add_decayed_weights(1e-4), optax.adagrad(0.05))


@jax.jit
def _step(params, opt_state, embeddings, nodes):
    grads = jax.grad(loss)(params, embeddings, nodes)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state


def train_epoch(params, embeddings, trees, batch_size=25):
    opt_state = optimizer.init(params)
    for start in range(0, len(trees), batch_size):
        params, opt_state = _step(params, opt_state, embeddings, flatten(trees[start:start + batch_size]))
    return params
