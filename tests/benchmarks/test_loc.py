"""``benchmarks.loc``: the line-counting protocol on files whose counts are known, and each
functional unit's implementations (fold, plain JAX, PyTorch) computing the same function with
their parameters tied, so that the counts compare code that does the same thing."""

from __future__ import annotations

import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks.loc import attention_fold, attention_jax, tree_lstm_fold, tree_lstm_jax, weave_fold, weave_jax
from benchmarks.loc.count import check_unit, count, strip
from examples import sst
from examples.attention import make_data
from examples.weave import random_molecule

SAMPLE = pathlib.Path(__file__).parents[1] / "data" / "sst_sample"


# --- the counter ----------------------------------------------------------------------------------

KNOWN = [
    ("x = 1\n", 1),
    ("\n\n# only a comment\n\n", 0),
    ("import os\nfrom typing import (\n    Any,\n    List,\n)\nx = os.sep\n", 1),
    ('"""Module\ndocstring."""\n\n\ndef f(x):\n    """Doc."""\n    return x  # trailing comment counts\n', 2),
    ("class A:\n    '''Doc\n    on two lines.'''\n\n    y = 2\n", 2),
    ("s = '''a string\nthat is data,\nnot a docstring'''\n", 3),
    ("total = (1 +\n         2 +  # why\n\n         3)\n", 3),
    ("def f():\n    x = 1\n    'not first: an expression, kept'\n    return x\n", 4),
]


@pytest.mark.parametrize(("source", "expected"), KNOWN)
def test_counts_of_small_files(source, expected, tmp_path):
    path = tmp_path / "unit.py"
    path.write_text(source)
    assert count(path, "tokenize") == (expected, "tokenize")
    assert len(strip(source).splitlines()) == expected


def test_stripping_keeps_lines_verbatim():
    source = "import os\n\n\ndef f(x):\n    '''Doc.'''\n    return x + 1  # note\n"
    assert strip(source) == "def f(x):\n    return x + 1  # note"


@pytest.mark.parametrize("source", ["def f(x):\n    if x < 0:\n        raise ValueError(x)\n    return x\n",
                                    "def f(x):\n    print(x)\n", "import logging\nlogging.info('x')\n",
                                    "with open('f') as f:\n    pass\n",
                                    "from abc import ABC\nclass A(ABC):\n    pass\n"])
def test_units_may_not_hold_what_the_protocol_removes(source, tmp_path):
    path = tmp_path / "unit.py"
    path.write_text(source)
    with pytest.raises(ValueError, match="unit.py:"):
        check_unit(path)


def test_unknown_counter(tmp_path):
    path = tmp_path / "unit.py"
    path.write_text("x = 1\n")
    with pytest.raises(ValueError, match="counter must be"):
        count(path, "wc")


def test_table_is_written(tmp_path, monkeypatch, capsys):
    from benchmarks.loc import __main__ as loc

    monkeypatch.setattr(loc, "RESULTS", tmp_path)
    loc.main(["--counter", "tokenize"])
    table = json.loads((tmp_path / "loc.json").read_text())
    units = {row["unit"]: row for row in table["rows"]}
    assert set(units) == {"feed-forward attention", "Tree-LSTM", "weave module"}
    for row in units.values():
        for impl in ("fold", "jax", "torch"):
            assert row[impl] == count(pathlib.Path(loc.__file__).parent / row["files"][impl], "tokenize").lines
        assert row["fold_to_jax"] == pytest.approx(row["fold"] / row["jax"], abs=0.005)
    assert units["Tree-LSTM"]["paper_fold"] == 119 and units["Tree-LSTM"]["paper_original"] == 219
    assert table["counter"] == "tokenize"
    markdown = (tmp_path / "loc.md").read_text()
    assert "| Tree-LSTM |" in markdown and "| weave module |" in markdown
    assert "Tree-LSTM" in capsys.readouterr().out


# --- the units compute the same function ----------------------------------------------------------

def _tie_torch(module, params):
    """Copies ``{layer: {"w": [in, out], "b": [out]}}`` into the module's ``nn.Linear`` layers."""
    import torch

    with torch.no_grad():
        for name, p in params.items():
            layer = getattr(module, name)
            layer.weight.copy_(torch.tensor(np.asarray(p["w"]).T))
            layer.bias.copy_(torch.tensor(np.asarray(p["b"])))


def _assert_close(actual, expected, tol=1e-5):
    np.testing.assert_allclose(np.asarray(actual, np.float64), np.asarray(expected, np.float64), rtol=tol, atol=tol)


@pytest.fixture(scope="module")
def attention():
    compiler = attention_fold.model(hidden=16)
    params = compiler.init(jax.random.key(0))
    return compiler, params, make_data(np.random.default_rng(0), 12, 10)


@pytest.mark.slow
def test_attention_fold_equals_jax(attention):
    compiler, params, data = attention
    assert jax.tree.map(jnp.shape, params) == jax.tree.map(jnp.shape, attention_jax.init(jax.random.key(1), 16))
    fold_loss, fold_accuracy = attention_fold.loss_and_accuracy(compiler, params, data)
    jax_loss, jax_accuracy = attention_jax.loss_and_accuracy(params, data)
    _assert_close(fold_loss, jax_loss)
    assert float(fold_accuracy) == float(jax_accuracy)
    fold_grads = jax.grad(lambda p: attention_fold.loss_and_accuracy(compiler, p, data)[0])(params)
    jax_grads = jax.grad(lambda p: attention_jax.loss_and_accuracy(p, data)[0])(params)
    jax.tree.map(_assert_close, fold_grads, jax_grads)


def test_attention_fold_equals_torch(attention):
    torch = pytest.importorskip("torch")
    from benchmarks.loc import attention_torch

    compiler, params, data = attention
    model = attention_torch.Attention(hidden=16)
    _tie_torch(model, params)
    fold_loss, fold_accuracy = attention_fold.loss_and_accuracy(compiler, params, data)
    with torch.no_grad():
        torch_loss, torch_accuracy = attention_torch.loss_and_accuracy(model, data)
    _assert_close(fold_loss, torch_loss.item())
    assert float(fold_accuracy) == torch_accuracy.item()


def _random_tree(rng, vocabulary, depth):
    if depth == 0 or rng.random() < 0.3:
        return (int(rng.integers(5)), int(rng.integers(vocabulary)))
    return (int(rng.integers(5)), _random_tree(rng, vocabulary, depth - 1), _random_tree(rng, vocabulary, depth - 1))


@pytest.fixture(scope="module")
def trees():
    """30 trees: the SST sample's first trees with word indices, and random deeper ones."""
    sample = sst.load("train", SAMPLE, limit=20)
    vocabulary = sst.vocabulary(sample)

    def indexed(tree):
        return (tree[0], vocabulary[tree[1]]) if len(tree) == 2 else (tree[0], indexed(tree[1]), indexed(tree[2]))

    rng = np.random.default_rng(0)
    trees = [indexed(t) for t in sample] + [_random_tree(rng, len(vocabulary), 9) for _ in range(10)]
    embeddings = rng.normal(size=(len(vocabulary), 6)).astype(np.float32)
    return trees, embeddings


@pytest.mark.slow
def test_tree_lstm_fold_equals_jax(trees):
    trees, embeddings = trees
    compiler = tree_lstm_fold.model(embeddings, state=8)
    params = compiler.init(jax.random.key(0))
    assert jax.tree.map(jnp.shape, params) == jax.tree.map(jnp.shape, tree_lstm_jax.init(jax.random.key(1), 6, 8))
    fold_loss = compiler.apply(params, compiler.build_batch(trees)).metrics["loss"].mean()
    _assert_close(fold_loss, tree_lstm_jax.loss(params, embeddings, tree_lstm_jax.flatten(trees)))
    trained = tree_lstm_fold.train_epoch(compiler, params, trees)  # minibatches of 25 and 5
    jax.tree.map(_assert_close, trained, tree_lstm_jax.train_epoch(params, embeddings, trees))
    assert not np.allclose(trained["cell"]["w"], params["cell"]["w"])


def test_tree_lstm_fold_equals_torch(trees):
    torch = pytest.importorskip("torch")
    from benchmarks.loc import tree_lstm_torch

    trees, embeddings = trees
    compiler = tree_lstm_fold.model(embeddings, state=8)
    params = compiler.init(jax.random.key(0))
    model = tree_lstm_torch.TreeLSTM(embeddings, state=8)
    _tie_torch(model, params)
    losses: list = []
    with torch.no_grad():
        for tree in trees:
            model(tree, losses)
    fold_loss = compiler.apply(params, compiler.build_batch(trees)).metrics["loss"].mean()
    _assert_close(fold_loss, torch.stack(losses).mean().item())
    trained = tree_lstm_fold.train_epoch(compiler, params, trees)
    tree_lstm_torch.train_epoch(model, trees)
    for name, p in trained.items():
        layer = getattr(model, name)
        _assert_close(p["w"], layer.weight.detach().numpy().T)
        _assert_close(p["b"], layer.bias.detach().numpy())


@pytest.fixture(scope="module")
def weave():
    rng = np.random.default_rng(0)
    molecules = [random_molecule(rng, 2, 7) for _ in range(6)]
    molecules = [(m["atoms"], m["pairs"]) for m in molecules]
    atom_in, pair_in = len(molecules[0][0][0]), len(molecules[0][1][0][0])
    module = weave_fold.weave_module(atom_in, pair_in, hidden=12, atom_out=10, pair_out=7)
    import fold as fd

    # The module's sequences come out as metrics, one entry per atom and per pair, molecule by molecule.
    harness = module >> fd.Record((fd.Map(fd.Metric("atoms")), fd.Map(fd.Map(fd.Metric("pairs"))))) >> fd.Void()
    compiler = fd.Compiler.create(harness)
    params = compiler.init(jax.random.key(0))
    metrics = compiler.apply(params, compiler.build_batch(molecules)).metrics
    return molecules, (atom_in, pair_in), params, metrics["atoms"].values, metrics["pairs"].values


@pytest.mark.slow
def test_weave_fold_equals_jax(weave):
    molecules, sizes, params, fold_atoms, fold_pairs = weave
    assert jax.tree.map(jnp.shape, params) == jax.tree.map(jnp.shape, weave_jax.init(jax.random.key(1), *sizes, 12,
                                                                                     10, 7))
    atoms, pairs, mask = weave_jax.pad(molecules)
    new_atoms, new_pairs = weave_jax.weave_module(params, atoms, pairs, mask)
    n = [len(a) for a, _ in molecules]
    _assert_close(fold_atoms, np.concatenate([new_atoms[i, :k] for i, k in enumerate(n)]))
    _assert_close(fold_pairs, np.concatenate([new_pairs[i, :k, :k].reshape(k * k, -1) for i, k in enumerate(n)]))
    padding = ~mask
    assert not np.any(np.asarray(new_atoms)[padding]) and not np.any(np.asarray(new_pairs)[padding])


def test_weave_fold_equals_torch(weave):
    torch = pytest.importorskip("torch")
    from benchmarks.loc import weave_torch

    molecules, sizes, params, fold_atoms, fold_pairs = weave
    model = weave_torch.Weave(*sizes, hidden=12, atom_out=10, pair_out=7)
    _tie_torch(model, params)
    with torch.no_grad():
        outputs = [model(a, p) for a, p in molecules]
    _assert_close(fold_atoms, np.concatenate([a.numpy() for a, _ in outputs]))
    _assert_close(fold_pairs, np.concatenate([p.numpy().reshape(-1, p.shape[-1]) for _, p in outputs]))


def test_pygount_counts_the_stripped_lines():
    pytest.importorskip("pygount")
    from benchmarks.loc.__main__ import HERE, IMPLEMENTATIONS, UNITS

    for path in [HERE / f"{stem}_{impl}.py" for _, stem, _, _ in UNITS for impl in IMPLEMENTATIONS]:
        assert count(path, "pygount").lines == count(path, "tokenize").lines, path.name
