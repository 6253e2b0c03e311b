"""One weave module (Kearnes et al. 2016, sec. 3.3), in fold.

A molecule is ``(atoms, pairs)``: one feature vector per atom and an n x n grid of pair features.
The module maps it to new atom and pair features::

    atoms'_i = f_A(f_AA(a_i), sum_j f_PA(p_ij))
    pairs'_ij = f_P(f_AP(a_i, a_j) + f_AP(a_j, a_i), f_PP(p_ij))

every f a dense ReLU layer of the concatenated arguments.
"""

import jax.numpy as jnp

import fold as fd


def weave_module(atom_in, pair_in, hidden=50, atom_out=50, pair_out=50):
    f_aa, f_pa, f_ap, f_pp = (fd.FC(hidden, name=f) for f in ("f_aa", "f_pa", "f_ap", "f_pp"))
    f_a, f_p = fd.FC(atom_out, name="f_a"), fd.FC(pair_out, name="f_p")
    a_i_to_p = fd.Composition()  # (a_i, atoms) -> f_AP(a_i, a_j) + f_AP(a_j, a_i) for every j
    with a_i_to_p.scope():
        a_i, atoms = fd.Broadcast().reads(a_i_to_p.input[0]), a_i_to_p.input[1]
        ij, ji = fd.ZipWith(fd.Function(f_ap)).reads(a_i, atoms), fd.ZipWith(fd.Function(f_ap)).reads(atoms, a_i)
        a_i_to_p.output.reads(fd.ZipWith(fd.Function(jnp.add)).reads(ij, ji))
    module = fd.Composition()
    with module.scope():
        atoms = fd.Map(fd.Vector(atom_in)).reads(module.input[0])
        pairs = fd.Map(fd.Map(fd.Vector(pair_in))).reads(module.input[1])
        a_to_a = fd.Map(fd.Function(f_aa)).reads(atoms)
        p_to_a = fd.Map(fd.Map(fd.Function(f_pa)) >> fd.Sum()).reads(pairs)
        a_to_p = fd.ZipWith(a_i_to_p).reads(atoms, fd.Broadcast().reads(atoms))
        p_to_p = fd.Map(fd.Map(fd.Function(f_pp))).reads(pairs)
        module.output.reads(fd.ZipWith(fd.Function(f_a)).reads(a_to_a, p_to_a),
                            fd.ZipWith(fd.ZipWith(fd.Function(f_p))).reads(a_to_p, p_to_p))
    return module
