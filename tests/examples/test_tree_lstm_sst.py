"""The SST Tree-LSTM example in --quick mode, on the committed SST sample."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

from examples import sst, tree_lstm_sst

SAMPLE = pathlib.Path(__file__).resolve().parents[1] / "data" / "sst_sample"


def test_glove_loader(tmp_path):
    glove = tmp_path / "glove.txt"
    glove.write_text("good 1 2 3\nunused 0 0 0\n", encoding="utf-8")
    table = tree_lstm_sst.load_glove(glove, {"bad": 0, "good": 1}, 3, seed=0)
    np.testing.assert_array_equal(table[1], [1, 2, 3])
    assert table.shape == (2, 3) and np.abs(table[0]).max() < 1


def _glove_file(tmp_path: pathlib.Path, words: list[str]) -> tuple[pathlib.Path, np.ndarray]:
    glove = tmp_path / "glove.txt"
    vectors = np.arange(3 * 16, dtype=np.float32).reshape(3, 16) / 100
    glove.write_text("".join(w + " " + " ".join(map(str, v)) + "\n" for w, v in zip(words, vectors)),
                     encoding="utf-8")
    return glove, vectors


def test_glove_vectors_are_the_initial_embeddings(tmp_path):
    """--glove: the model starts from the file's vectors for the words it has; a file of another
    width than --embed-size is refused."""
    import jax

    import fold as fd

    word_idx = sst.vocabulary(sst.load("train", SAMPLE))
    words = sorted(word_idx)[:3]
    glove, vectors = _glove_file(tmp_path, words)
    args = tree_lstm_sst.parse_args(["--quick", "--glove", str(glove)])
    table = tree_lstm_sst.load_glove(glove, word_idx, args.embed_size, seed=0)
    params = fd.Compiler.create(tree_lstm_sst.build_model(word_idx, args, table)).init(jax.random.key(0))
    rows = np.asarray(params["embedding"]["table"])[[word_idx[w] for w in words]]
    np.testing.assert_allclose(rows, vectors, rtol=1e-6)
    with pytest.raises(ValueError, match="--embed-size is 8"):
        tree_lstm_sst.load_glove(glove, word_idx, 8, seed=0)


@pytest.mark.slow  # a second quick run (15-30 s) beside test_quick_run_learns
def test_a_quick_run_trains_from_glove_vectors(tmp_path):
    glove, _ = _glove_file(tmp_path, sorted(sst.vocabulary(sst.load("train", SAMPLE)))[:3])
    report = tree_lstm_sst.main(["--quick", "--quiet", "--glove", str(glove), "--checkpoint-dir", str(tmp_path),
                                 "--data-dir", str(SAMPLE), "--json", str(tmp_path / "t.json"), "--no-test"])
    assert report["history"][-1]["train_loss"] < report["history"][0]["train_loss"]
    assert list(report["results"]) == ["dev"]  # --no-test: the test set is not evaluated


def test_quick_run_learns(tmp_path):
    report = tree_lstm_sst.main(["--quick", "--quiet", "--checkpoint-dir", str(tmp_path),
                                 "--data-dir", str(SAMPLE), "--json", str(tmp_path / "t.json")])
    history = report["history"]
    assert history[-1]["train_loss"] < history[0]["train_loss"]
    majority = np.mean([t[0] == 2 for t in sst.load("dev", SAMPLE)])
    for split in ("dev", "test"):
        r = report["results"][split]
        assert 0.0 <= r["root_fine"] <= 1.0 and 0.0 <= r["root_binary"] <= 1.0
        assert r["all_nodes_fine"] > 0.3  # most nodes are neutral; the loss is per node
    assert 1 <= report["best_epoch"] <= 3 and majority < 1


def test_tai_optimizer_decays_weights_but_not_embeddings():
    """Adagrad (Tai et al.): L2 on the cell and readout, none on the embeddings, which take
    their own step size; compared with Adagrad's first step written out."""
    import jax
    import jax.numpy as jnp
    args = tree_lstm_sst.parse_args(["--optimizer", "adagrad", "--learning-rate", "0.05", "--l2", "0.01",
                                     "--embed-learning-rate", "0.1"])
    params = {"embedding": {"table": jnp.full(3, 2.0)}, "fc": {"w": jnp.full(3, 2.0), "b": jnp.zeros(3)}}
    grads = {"embedding": {"table": jnp.full(3, 0.5)}, "fc": {"w": jnp.full(3, 0.5), "b": jnp.full(3, 0.5)}}
    opt = tree_lstm_sst.make_optimizer(args)
    updates, _ = opt.update(grads, opt.init(params), params)

    def adagrad(lr, g):
        acc = g * g  # Tai's Adagrad: the accumulator starts at zero
        return -lr * g / jnp.sqrt(acc + 1e-10)

    np.testing.assert_allclose(updates["embedding"]["table"], adagrad(0.1, grads["embedding"]["table"]), rtol=1e-6)
    np.testing.assert_allclose(updates["fc"]["w"], adagrad(0.05, grads["fc"]["w"] + 0.01 * 2.0), rtol=1e-6)
    np.testing.assert_allclose(updates["fc"]["b"], adagrad(0.05, grads["fc"]["b"]), rtol=1e-6)
    assert jax.tree_util.tree_structure(updates) == jax.tree_util.tree_structure(params)


def test_lr_decay_scales_both_learning_rates_after_each_epoch():
    """SGD with --lr-decay 0.5 and 2 steps an epoch: steps 0-1 at the full rates, 2-3 at half."""
    import jax.numpy as jnp
    args = tree_lstm_sst.parse_args(["--optimizer", "sgd", "--learning-rate", "0.1", "--embed-learning-rate", "0.2",
                                     "--lr-decay", "0.5"])
    params = {"embedding": {"table": jnp.ones(2)}, "fc": {"w": jnp.ones(2)}}
    grads = {"embedding": {"table": jnp.ones(2)}, "fc": {"w": jnp.ones(2)}}
    opt = tree_lstm_sst.make_optimizer(args, steps_per_epoch=2)
    state, steps = opt.init(params), []
    for _ in range(4):
        updates, state = opt.update(grads, state, params)
        steps.append((float(updates["fc"]["w"][0]), float(updates["embedding"]["table"][0])))
    np.testing.assert_allclose(steps, [(-0.1, -0.2), (-0.1, -0.2), (-0.05, -0.1), (-0.05, -0.1)], rtol=1e-6)
    for bad in ("0", "1.5", "-0.1"):
        with pytest.raises(SystemExit):
            tree_lstm_sst.parse_args(["--lr-decay", bad])


# Slow: a full quick run to check the flag's plumbing; the Trainer's patience is tested in
# tests/test_trainer.py.
@pytest.mark.slow
def test_patience_stops_a_run_early(tmp_path):
    """No run goes on more than ``--patience`` epochs past its best dev epoch."""
    report = tree_lstm_sst.main(["--quick", "--quiet", "--checkpoint-dir", str(tmp_path),
                                 "--optimizer", "adagrad", "--learning-rate", "0.05", "--l2", "1e-4",
                                 "--patience", "1", "--data-dir", str(SAMPLE), "--json", str(tmp_path / "t.json")])
    epochs = [h["epoch"] for h in report["history"]]
    assert len(epochs) <= report["best_epoch"] + 1 and report["args"]["optimizer"] == "adagrad"


def test_paper_flag_selects_the_paper_variant():
    args = tree_lstm_sst.parse_args(["--paper"])
    assert (args.state_size, args.recurrent_dropout, args.embed_dropout) == (300, 0.25, 0.25)


@pytest.mark.slow
def test_output_dropout_drops_what_the_logits_read_but_not_what_the_parent_reads():
    """With state size 5 and an identity readout, a root's logits are its h. With
    ``--output-dropout`` and a key, each is either 0 or the h of the same model without it, scaled
    by 1 / (1 - rate): the h itself, computed from children that were not dropped, is unchanged."""
    import jax

    import fold as fd

    trees = sst.load("train", SAMPLE)[:8]
    word_idx = sst.vocabulary(trees)
    flags = ["--state-size", "5", "--embed-size", "4"]
    plain = fd.Compiler.create(tree_lstm_sst.build_model(word_idx, tree_lstm_sst.parse_args(flags)))
    dropped = fd.Compiler.create(tree_lstm_sst.build_model(
        word_idx, tree_lstm_sst.parse_args([*flags, "--output-dropout", "0.5"])))
    params = plain.init(jax.random.key(0))
    (readout,) = [k for k in params if k.startswith("fc")]
    params[readout] = {"w": np.eye(5, dtype=np.float32), "b": np.zeros(5, np.float32)}
    h = np.asarray(plain.apply(params, plain.build_batch(trees)).outputs)
    params = {**dropped.init(jax.random.key(0)), **params}  # and the dropout layer's (empty) entry
    batch = dropped.build_batch(trees)
    np.testing.assert_array_equal(dropped.apply(params, batch).outputs, h)  # no key: no dropout
    out = np.asarray(dropped.apply(params, batch, jax.random.key(1)).outputs)
    kept = out != 0
    assert 0.2 < kept.mean() < 0.8
    np.testing.assert_allclose(out[kept], 2 * h[kept], rtol=1e-6)
    for flag in ("--output-dropout", "--embed-dropout", "--recurrent-dropout"):
        for bad in ("1", "-0.1"):
            with pytest.raises(SystemExit):
                tree_lstm_sst.parse_args([flag, bad])


@pytest.mark.slow
def test_word_dropout_trains_the_vector_unknown_words_get():
    """--word-dropout: words not seen in training embed to the unknown-word row (not zeros),
    training replaces words by it at about the rate, and evaluation replaces none."""
    import jax

    import fold as fd

    layer = tree_lstm_sst.WordDropout(0.3, unknown=7)
    ids = np.arange(7, dtype=np.int32).repeat(1000)
    np.testing.assert_array_equal(layer.apply({}, ids), ids)  # no key
    out = np.asarray(layer.apply({}, ids, key=jax.random.key(0)))
    assert set(out[out != ids].tolist()) == {7} and abs((out == 7).mean() - 0.3) < 0.02
    with pytest.raises(ValueError, match="rate in"):
        tree_lstm_sst.WordDropout(1.0, unknown=7)

    trees = sst.load("train", SAMPLE)[:8]
    word_idx = {**sst.vocabulary(trees[:4]), tree_lstm_sst.UNKNOWN: len(sst.vocabulary(trees[:4]))}
    args = tree_lstm_sst.parse_args(["--state-size", "5", "--embed-size", "4", "--word-dropout", "0.5"])
    compiler = fd.Compiler.create(tree_lstm_sst.build_model(word_idx, args))
    params = compiler.init(jax.random.key(0))
    unseen, unknown = (0, "unseen-word"), (0, tree_lstm_sst.UNKNOWN)  # leaves: (label, word)
    out = compiler.apply(params, compiler.build_batch([unseen, unknown, trees[5]])).outputs
    np.testing.assert_array_equal(out[0], out[1])

    def loss(p, key):
        return compiler.apply(p, compiler.build_batch(trees[:4]), key).metrics["loss"].mean()

    # Trees 0-3 have no unseen word: only the replacements reach the unknown row.
    assert np.any(jax.grad(loss)(params, jax.random.key(1))["embedding"]["table"][-1])
    assert params["embedding"]["table"].shape[0] == len(word_idx)


def _labels(tree) -> list[int]:
    """Every node's label: a tree is ``(label, word)`` or ``(label, left, right)``."""
    return [tree[0]] + ([] if len(tree) == 2 else _labels(tree[1]) + _labels(tree[2]))


@pytest.mark.slow
def test_binary_model_has_a_loss_on_non_neutral_nodes_only(tmp_path):
    """--binary: with logits fixed at (0, 1) for every node, the loss entries are exactly
    softplus(1) for each negative node and softplus(-1) for each positive one, and none for
    neutral nodes; a quick run reports binary accuracies only."""
    import jax

    import fold as fd

    trees = sst.load("train", SAMPLE)[:6]
    args = tree_lstm_sst.parse_args(["--binary", "--state-size", "4", "--embed-size", "3"])
    compiler = fd.Compiler.create(tree_lstm_sst.build_model(sst.vocabulary(trees), args))
    params = compiler.init(jax.random.key(0))
    params["fc"] = {"w": np.zeros((4, 2), np.float32), "b": np.array([0.0, 1.0], np.float32)}
    result = compiler.apply(params, compiler.build_batch(trees))
    loss = result.metrics["loss"]
    labels = np.array([y for t in trees for y in _labels(t)])
    expected = np.where(labels[labels != 2] > 2, np.log1p(np.exp(-1.0)), np.log1p(np.exp(1.0)))
    np.testing.assert_allclose(np.sort(np.asarray(loss.padded)[np.asarray(loss.mask)]), np.sort(expected),
                               rtol=1e-6)
    assert result.outputs.shape == (6, 2)

    tiny = tmp_path / "sst"  # the sample's first trees: the flag's plumbing, not learning
    tiny.mkdir()
    for split in ("train", "dev", "test"):
        lines = (SAMPLE / f"{split}.txt").read_text(encoding="utf-8").splitlines(keepends=True)
        (tiny / f"{split}.txt").write_text("".join(lines[:64 if split == "train" else 32]), encoding="utf-8")
    report = tree_lstm_sst.main(["--quick", "--quiet", "--binary", "--checkpoint-dir", str(tmp_path),
                                 "--data-dir", str(tiny), "--json", str(tmp_path / "t.json")])
    for split in ("dev", "test"):
        assert set(report["results"][split]) == {"root_binary", "all_nodes_binary"}
        assert all(0.0 <= v <= 1.0 for v in report["results"][split].values())
    assert {"dev_root_binary", "dev_all_nodes_binary"} <= set(report["history"][-1])


# Slow (about a minute on a 2-core CI machine, mostly compiling the dropout
# layouts); dropout inside the loop is covered by tests/compiler/test_randomness.py.
@pytest.mark.slow
def test_quick_run_of_the_paper_variant_with_dropout(tmp_path):
    report = tree_lstm_sst.main(["--quick", "--quiet", "--checkpoint-dir", str(tmp_path),
                                 "--paper", "--data-dir", str(SAMPLE),
                                 "--json", str(tmp_path / "t.json")])
    assert report["args"]["recurrent_dropout"] == 0.25
    history = report["history"]
    assert history[-1]["train_loss"] < history[0]["train_loss"]
    assert report["results"]["dev"]["all_nodes_fine"] > 0.3


@pytest.mark.slow
def test_a_seed_reproduces_its_run(tmp_path):
    """The same command and seed give the same per-epoch numbers, with dropout and a worker process
    building batches (dropout keys depend on the seed and the step only)."""

    def run(name):
        report = tree_lstm_sst.main(["--quick", "--quiet", "--seed", "3", "--recurrent-dropout", "0.25",
                                     "--embed-dropout", "0.25", "--workers", "1", "--data-dir", str(SAMPLE),
                                     "--checkpoint-dir", str(tmp_path / name),
                                     "--json", str(tmp_path / f"{name}.json")])
        return [{k: v for k, v in h.items() if k != "seconds"} for h in report["history"]], report["results"]

    first, second = run("a"), run("b")
    assert first == second
    assert len(first[0]) >= 2 and first[0][-1]["train_loss"] > 0


def test_every_model_built_in_a_process_names_its_parameters_alike():
    """Benchmarks and tools read the cell's and the readout's parameters by name: a second model of
    the same process got numbered default names (``binary_tree_lstm_cell_1``), and
    ``benchmarks.step_profile`` failed on its second size."""
    import jax

    import fold as fd

    args = tree_lstm_sst.parse_args(["--quick"])
    names = [set(fd.Compiler.create(tree_lstm_sst.build_model({"a": 0}, args)).init(jax.random.key(0)))
             for _ in range(2)]
    assert names[0] == names[1] and {"binary_tree_lstm_cell", "fc", "embedding"} <= names[0]
