"""Weave graph convolutions on random molecular graphs (Fold paper, section 3.6 and Appendix B).

A molecule is a dict with ``atoms`` (one feature vector per atom: its type,
one-hot, and its degree, one-hot), ``pairs`` (an n x n grid of pair
features: bond order and graph distance, both one-hot) and ``target``.
The weave module of Kearnes et al. (2016) updates both at once::

    atoms' = fA(fA->A(a_i), sum_j fP->A(p_ij))
    pairs' = fP(fA->P(a_i, a_j) + fA->P(a_j, a_i), fP->P(p_ij))

written, as in the paper's Appendix B, with ``Map``, ``ZipWith``,
``Broadcast`` and a ``Composition`` (``a_i_to_p``) for the pair update.
Two stacked modules feed a molecule-level read-out (a sum over atoms).

The target needs pair information: it is a sum of pairwise terms
``PAIR_WEIGHTS[type_i, type_j]`` over the atom pairs at most two bonds
apart. A baseline with the same read-out that sees only the atom features
(types and degrees, no pairs) shows how much of it the atoms alone explain.
The report gives R^2 on held-out molecules for both.

Run: ``python -m examples.weave`` (``--quick`` for a few-second run).
"""

from __future__ import annotations

import argparse
from typing import Any

import jax
import numpy as np
import optax

import fold as fd
from examples import common
from examples.common import COUNT, add_training_flags, print_table, write_report

ATOM_TYPES = ("C", "N", "O", "S")
TYPE_FREQUENCIES = (0.55, 0.2, 0.15, 0.1)
MAX_DEGREE = 4
MAX_DISTANCE = 4  # graph distances >= 4 share one feature
# The pairwise term of the target, by the two atoms' types (symmetric).
PAIR_WEIGHTS = np.array([[0.0, 0.5, 1.0, -0.5],
                         [0.5, -1.0, 1.5, 0.0],
                         [1.0, 1.5, -1.0, 2.0],
                         [-0.5, 0.0, 2.0, 1.0]])
ATOM_FEATURES = len(ATOM_TYPES) + MAX_DEGREE
PAIR_FEATURES = 4 + MAX_DISTANCE + 1  # bond order 0..3, distance 0..MAX_DISTANCE


def _distances(n: int, bonds: dict[tuple[int, int], int]) -> np.ndarray:
    """All-pairs graph distances (Floyd-Warshall; molecules are small)."""
    d = np.full((n, n), np.inf)
    np.fill_diagonal(d, 0)
    for i, j in bonds:
        d[i, j] = d[j, i] = 1
    for k in range(n):
        d = np.minimum(d, d[:, k:k + 1] + d[k:k + 1, :])
    return d


def random_molecule(rng: np.random.Generator, min_atoms: int, max_atoms: int) -> dict[str, Any]:
    """A connected random molecule-like graph with its features and target.

    Atoms get types by ``TYPE_FREQUENCIES``; bonds form a random tree (each
    atom bonds to an earlier one with fewer than ``MAX_DEGREE`` bonds) plus
    possibly one ring-closing bond; bond orders are 1, 2 or 3.
    """
    n = int(rng.integers(min_atoms, max_atoms + 1))
    types = rng.choice(len(ATOM_TYPES), n, p=TYPE_FREQUENCIES)
    degree = np.zeros(n, int)
    bonds: dict[tuple[int, int], int] = {}

    def bond(i: int, j: int) -> None:
        bonds[(min(i, j), max(i, j))] = int(rng.choice([1, 2, 3], p=[0.75, 0.2, 0.05]))
        degree[i] += 1
        degree[j] += 1

    for i in range(1, n):
        free = np.flatnonzero(degree[:i] < MAX_DEGREE)
        bond(i, int(rng.choice(free)))
    if rng.random() < 0.5:
        d = _distances(n, bonds)
        ring = [(i, j) for i in range(n) for j in range(i + 1, n)
                if d[i, j] >= 3 and degree[i] < MAX_DEGREE and degree[j] < MAX_DEGREE]
        if ring:
            bond(*ring[rng.integers(len(ring))])

    dist = _distances(n, bonds)
    order = np.zeros((n, n), int)
    for (i, j), o in bonds.items():
        order[i, j] = order[j, i] = o
    atoms = np.concatenate([np.eye(len(ATOM_TYPES))[types], np.eye(MAX_DEGREE)[degree - 1]], axis=1)
    pairs = np.concatenate([np.eye(4)[order], np.eye(MAX_DISTANCE + 1)[np.minimum(dist, MAX_DISTANCE).astype(int)]],
                           axis=2)
    near = np.triu((dist >= 1) & (dist <= 2))
    target = float(PAIR_WEIGHTS[types[:, None], types[None, :]][near].sum())
    return {"atoms": atoms.tolist(), "pairs": pairs.tolist(), "target": target}


def _add(x: jax.Array, y: jax.Array) -> jax.Array:
    return x + y


def weave_module(hidden: int, atom_out: int, pair_out: int, name: str = "weave") -> fd.Composition:
    """``(atoms, pairs) -> (atoms', pairs')``: one weave module (Kearnes et al. 2016).

    Its six ReLU layers are named ``NAME/f_aa`` (fA->A), ``NAME/f_pa``,
    ``NAME/f_ap``, ``NAME/f_pp``, ``NAME/f_a`` and ``NAME/f_p`` in ``params``.
    """
    f_aa, f_pa, f_ap, f_pp = (fd.FC(hidden, name=f"{name}/{f}") for f in ("f_aa", "f_pa", "f_ap", "f_pp"))
    f_a, f_p = fd.FC(atom_out, name=f"{name}/f_a"), fd.FC(pair_out, name=f"{name}/f_p")

    # Row i of the pair update: fA->P(a_i, a_j) + fA->P(a_j, a_i) for every j.
    a_i_to_p = fd.Composition()
    with a_i_to_p.scope():
        a_i = fd.Broadcast().reads(a_i_to_p.input[0])
        atoms = a_i_to_p.input[1]
        ij = fd.ZipWith(fd.Function(f_ap)).reads(a_i, atoms)
        ji = fd.ZipWith(fd.Function(f_ap)).reads(atoms, a_i)
        a_i_to_p.output.reads(fd.ZipWith(fd.Function(_add)).reads(ij, ji))

    module = fd.Composition()
    with module.scope():
        atoms, pairs = module.input[0], module.input[1]
        a_to_a = fd.Map(fd.Function(f_aa)).reads(atoms)
        p_to_a = fd.Map(fd.Map(fd.Function(f_pa)) >> fd.Sum()).reads(pairs)
        a_to_p = fd.ZipWith(a_i_to_p).reads(atoms, fd.Broadcast().reads(atoms))
        p_to_p = fd.Map(fd.Map(fd.Function(f_pp))).reads(pairs)
        new_atoms = fd.ZipWith(fd.Function(f_a)).reads(a_to_a, p_to_a)
        new_pairs = fd.ZipWith(fd.ZipWith(fd.Function(f_p))).reads(a_to_p, p_to_p)
        module.output.reads(new_atoms, new_pairs)
    return module


def _with_loss(embed_atoms: fd.Block, hidden: int) -> fd.Composition:
    """molecule -> predicted target; the squared error is the ``loss`` metric."""
    readout = embed_atoms >> fd.Map(fd.FC(hidden)) >> fd.Sum() >> fd.FC(1, activation=None) \
        >> fd.Function(lambda y: y[:, 0])
    c = fd.Composition()
    with c.scope():
        prediction = readout.reads(c.input)
        target = (fd.GetItem("target") >> fd.Scalar()).reads(c.input)
        fd.Metric("loss").reads(fd.Function(lambda p, t: (p - t) ** 2).reads(prediction, target))
        c.output.reads(prediction)
    return c


def build_weave(hidden: int, modules: int) -> fd.Composition:
    """Stacked weave modules and a sum-over-atoms read-out."""
    net: fd.Block = fd.Record({"atoms": fd.Map(fd.Vector(ATOM_FEATURES)),
                               "pairs": fd.Map(fd.Map(fd.Vector(PAIR_FEATURES)))})
    for i in range(modules):
        net = net >> weave_module(hidden, hidden, hidden, name=f"weave{i}")
    return _with_loss(net >> fd.GetItem(0), hidden)


def build_baseline(hidden: int) -> fd.Composition:
    """The same read-out on the atom features alone (no pair information)."""
    atoms = fd.GetItem("atoms") >> fd.Map(fd.Vector(ATOM_FEATURES) >> fd.FC(hidden))
    return _with_loss(atoms, hidden)


def r_squared(prediction: np.ndarray, target: np.ndarray) -> float:
    return float(1.0 - np.sum((prediction - target) ** 2) / np.sum((target - target.mean()) ** 2))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--train-size", type=COUNT, default=4_000, help="training molecules")
    p.add_argument("--test-size", type=COUNT, default=1_000, help="test molecules")
    p.add_argument("--min-atoms", type=int, default=4, help="fewest atoms of a molecule")
    p.add_argument("--max-atoms", type=int, default=10, help="most atoms of a molecule")
    p.add_argument("--hidden", type=COUNT, default=32, help="weave module width")
    p.add_argument("--modules", type=COUNT, default=2, help="stacked weave modules")
    add_training_flags(p, "weave", epochs=15, batch_size=32, learning_rate=3e-3,
                       learning_rate_help="initial Adam rate, cosine-decayed to 0")
    args = p.parse_args(argv)
    if args.quick:
        args.train_size, args.test_size, args.epochs, args.max_atoms, args.hidden = 640, 128, 4, 6, 16
        args.batch_size = 16
    if not 2 <= args.min_atoms <= args.max_atoms:
        p.error(f"need 2 <= --min-atoms <= --max-atoms, got {args.min_atoms} and {args.max_atoms}")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    rng = np.random.default_rng(args.seed)
    molecules = [random_molecule(rng, args.min_atoms, args.max_atoms) for _ in range(args.train_size + args.test_size)]
    # Standardise the target with training statistics only.
    train_targets = np.array([m["target"] for m in molecules[:args.train_size]])
    mean, std = float(train_targets.mean()), float(train_targets.std()) or 1.0
    for m in molecules:
        m["target"] = (m["target"] - mean) / std
    train_data, test_data = molecules[:args.train_size], molecules[args.train_size:]
    test_targets = np.array([m["target"] for m in test_data])

    report: dict[str, Any] = {"example": "weave", "args": vars(args), "target_mean": mean, "target_std": std}
    results = {}
    for name, model in (("weave", build_weave(args.hidden, args.modules)), ("atoms_only", build_baseline(args.hidden))):
        compiler = fd.Compiler.create(model)
        optimizer = optax.adam(optax.cosine_decay_schedule(args.learning_rate, args.epochs * max(
            args.train_size // args.batch_size, 1)))
        trainer = common.trainer(compiler, optimizer, args)

        def test_r2(p: Any, trainer: fd.Trainer = trainer) -> float:
            return r_squared(trainer.predict(p, test_data), test_targets)

        if not args.quiet:
            print(f"training {name}")
        history = common.fit(trainer, train_data, args, f"weave_{name}",
                             scores=lambda p: {"test_r2": test_r2(p)}).history
        results[name] = {"test_r2": history[-1]["test_r2"], "history": history}
    print_table("held-out R^2 of the pairwise target", ["model", "test R^2"],
                [[name, r["test_r2"]] for name, r in results.items()])
    report["results"] = results
    path = write_report("weave_quick" if args.quick else "weave", report, args.json)
    print(f"\nreport written to {path}")
    return report


if __name__ == "__main__":
    main()
