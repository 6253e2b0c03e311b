"""One weave module (Kearnes et al. 2016, sec. 3.3), in plain JAX.

The same function as ``weave_fold.py``, batched by hand: molecules padded to the largest, masks
keeping the padding atoms out of the sums and zeroing their outputs, the atom pairs made by tiling.
"""

import jax
import jax.numpy as jnp
import numpy as np


def init(key, atom_in, pair_in, hidden=50, atom_out=50, pair_out=50):
    shapes = {"f_aa": (atom_in, hidden), "f_pa": (pair_in, hidden), "f_ap": (2 * atom_in, hidden),
              "f_pp": (pair_in, hidden), "f_a": (2 * hidden, atom_out), "f_p": (2 * hidden, pair_out)}
    keys = jax.random.split(key, len(shapes))
    return {name: {"w": jax.nn.initializers.glorot_uniform()(k, shape), "b": jnp.zeros(shape[1])}
            for k, (name, shape) in zip(keys, shapes.items())}


def pad(molecules):
    n = max(len(atoms) for atoms, _ in molecules)
    atoms = np.zeros((len(molecules), n, len(molecules[0][0][0])), np.float32)
    pairs = np.zeros((len(molecules), n, n, len(molecules[0][1][0][0])), np.float32)
    mask = np.zeros((len(molecules), n), bool)
    for i, (a, p) in enumerate(molecules):
        atoms[i, :len(a)], pairs[i, :len(a), :len(a)], mask[i, :len(a)] = a, p, True
    return atoms, pairs, mask


@jax.jit
def weave_module(params, atoms, pairs, mask):
    def dense(name, *x):
        return jax.nn.relu(jnp.concatenate(x, -1) @ params[name]["w"] + params[name]["b"])

    n = atoms.shape[1]
    pair_mask = (mask[:, :, None] & mask[:, None, :])[..., None]
    p_to_a = jnp.sum(jnp.where(pair_mask, dense("f_pa", pairs), 0.0), axis=2)
    a_i = jnp.tile(atoms[:, :, None, :], (1, 1, n, 1))
    a_j = jnp.tile(atoms[:, None, :, :], (1, n, 1, 1))
    a_to_p = dense("f_ap", a_i, a_j) + dense("f_ap", a_j, a_i)
    new_atoms = dense("f_a", dense("f_aa", atoms), p_to_a) * mask[..., None]
    return new_atoms, dense("f_p", a_to_p, dense("f_pp", pairs)) * pair_mask
