"""The weave example: molecule generator, one module against NumPy, and a --quick run."""

from __future__ import annotations

import itertools

import jax
import numpy as np
import pytest

import fold as fd
from examples import weave


def test_random_molecules_are_valid_and_the_target_is_the_pairwise_sum():
    rng = np.random.default_rng(0)
    for _ in range(30):
        m = weave.random_molecule(rng, 3, 9)
        atoms, pairs = np.array(m["atoms"]), np.array(m["pairs"])
        n = len(atoms)
        assert 3 <= n <= 9 and atoms.shape == (n, weave.ATOM_FEATURES)
        assert pairs.shape == (n, n, weave.PAIR_FEATURES)
        types = atoms[:, :4].argmax(1)
        order = pairs[:, :, :4].argmax(2)
        dist = pairs[:, :, 4:].argmax(2)
        assert np.array_equal(order, order.T) and np.array_equal(dist, dist.T)
        assert np.all(np.diag(dist) == 0) and np.all(dist[~np.eye(n, dtype=bool)] >= 1)  # connected
        bonded = order > 0
        assert np.array_equal(bonded, dist == 1)
        np.testing.assert_array_equal(atoms[:, 4:].argmax(1) + 1, bonded.sum(1))  # degree feature
        expected = sum(weave.PAIR_WEIGHTS[types[i], types[j]]
                       for i, j in itertools.combinations(range(n), 2) if dist[i, j] <= 2)
        assert np.isclose(m["target"], expected)


def _np_weave(params: dict, atoms: np.ndarray, pairs: np.ndarray, name: str) -> tuple:
    def fc(layer, x):
        p = params[f"{name}/{layer}"]
        return np.maximum(x @ np.asarray(p["w"]) + np.asarray(p["b"]), 0)

    n = len(atoms)
    a_to_a = fc("f_aa", atoms)
    p_to_a = fc("f_pa", pairs).sum(axis=1)
    a_to_p = np.array([[fc("f_ap", np.concatenate([atoms[i], atoms[j]]))
                        + fc("f_ap", np.concatenate([atoms[j], atoms[i]])) for j in range(n)] for i in range(n)])
    p_to_p = fc("f_pp", pairs)
    new_atoms = fc("f_a", np.concatenate([a_to_a, p_to_a], axis=-1))
    new_pairs = fc("f_p", np.concatenate([a_to_p, p_to_p], axis=-1))
    return new_atoms, new_pairs


def test_weave_module_matches_numpy():
    module = weave.weave_module(5, 3, 4, name="w")
    model = fd.Record({"atoms": fd.Map(fd.Vector(weave.ATOM_FEATURES)),
                       "pairs": fd.Map(fd.Map(fd.Vector(weave.PAIR_FEATURES)))}) >> module
    compiler = fd.Compiler.for_eval(model)
    params = compiler.init(jax.random.key(1))
    assert sorted(params) == [f"w/{f}" for f in ("f_a", "f_aa", "f_ap", "f_p", "f_pa", "f_pp")]
    rng = np.random.default_rng(2)
    for n in (1, 2, 5):
        m = weave.random_molecule(rng, n, n) if n > 1 else {"atoms": [[1.0] + [0] * 7], "pairs": [[[1.0] + [0] * 8]]}
        atoms, pairs = model.eval(m, params)
        ref_atoms, ref_pairs = _np_weave(params, np.array(m["atoms"]), np.array(m["pairs"]), "w")
        np.testing.assert_allclose(np.array(atoms), ref_atoms, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(np.array([np.array(row) for row in pairs]), ref_pairs, rtol=1e-5, atol=1e-6)


@pytest.mark.slow  # 35-70 s; test_weave_module_matches_numpy checks the model in CI
def test_quick_run_learns(tmp_path):
    report = weave.main(["--quick", "--quiet", "--checkpoint-dir", str(tmp_path), "--json", str(tmp_path / "w.json")])
    for name in ("weave", "atoms_only"):
        history = report["results"][name]["history"]
        assert history[-1]["train_loss"] < history[0]["train_loss"]
        assert -1.0 < history[-1]["test_r2"] <= 1.0
    assert report["results"]["weave"]["test_r2"] > 0.0
