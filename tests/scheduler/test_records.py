"""Recorded examples (``compiler.record``): batches merged from them compute what batches built
from the examples compute, in any selection and order, across processes and with clear errors."""

from __future__ import annotations

import pickle

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fold as fd
from tests.models import MODELS, enable_x64


def _metric_model() -> fd.Block:
    """Shared zeros (an empty Fold, None leaves), an Embedding (checked constants), a tuple root
    and two metrics per example."""
    embed = fd.Embedding(10, 3, mod_inputs=False)
    word = fd.Optional(fd.Scalar("int32") >> fd.Function(embed))
    total = fd.Map(word) >> fd.Fold(fd.Function(lambda a, b: a + b), fd.Zeros(fd.TensorType((3,))))
    score = fd.FC(1, activation=None) >> fd.Function(lambda v: v[..., 0]) >> fd.Metric("score")
    return fd.Record({"words": total, "n": fd.Length() >> fd.Metric("length")}) >> fd.GetItem(1) >> \
        fd.AllOf(score, fd.Identity(), fd.Function(jnp.tanh)) >> fd.Slice(start=1)


def _examples(n: int, seed: int = 0) -> list:
    rng = np.random.default_rng(seed)
    return [{"words": [None if rng.random() < 0.2 else int(w) for w in rng.integers(0, 10, k)],
             "n": [0] * int(k)} for k in rng.integers(0, 6, n)]


def _results(compiler: fd.Compiler, params, batch: fd.Batch):
    r = compiler.apply(params, batch)
    return r.outputs, {k: (m.values, m.mask, m.example) for k, m in r.metrics.items()}


def _assert_tree_close(a, b):
    la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    assert len(la) == len(lb)
    for x, y in zip(la, lb):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6, atol=1e-7)


def test_merged_batches_compute_what_built_batches_compute_in_any_order():
    compiler = fd.Compiler.create(_metric_model())
    examples = _examples(30)
    recorded = compiler.record(examples)
    assert len(recorded) == 30
    params = compiler.init(jax.random.key(1))
    for sel in (np.arange(30), np.array([7, 3, 29, 3, 0]), slice(4, 11), [12]):
        chosen = [examples[i] for i in np.arange(30)[sel]]
        _assert_tree_close(_results(compiler, params, compiler.build_batch(recorded[sel])),
                           _results(compiler, params, compiler.build_batch(chosen)))
    # A selection of a selection.
    _assert_tree_close(_results(compiler, params, compiler.build_batch(recorded[5:20][[4, 0]])),
                       _results(compiler, params, compiler.build_batch([examples[9], examples[5]])))


# Recording is independent of the model: two of them (a tree and a sequence) run in CI.
@pytest.mark.parametrize("name", [n if n in ("rnn", "tree_lstm") else pytest.param(n, marks=pytest.mark.slow)
                                  for n in sorted(MODELS)])
def test_gradients_from_recorded_examples_match(name):
    with enable_x64():
        block, _, examples = MODELS[name](dtype="float64", n=10)
        compiler = fd.Compiler.create(block, chunk_size=8)
        recorded = compiler.record(examples)
        order = np.random.default_rng(0).permutation(len(examples))
        params = compiler.init(jax.random.key(0))

        def loss(p, batch):
            return sum(jnp.sum(jnp.square(x)) for x in jax.tree_util.tree_leaves(compiler.apply(p, batch).outputs))

        grad = jax.jit(jax.grad(loss))
        _assert_tree_close(grad(params, compiler.build_batch(recorded[order])),
                           grad(params, compiler.build_batch([examples[i] for i in order])))


def test_batches_of_recorded_examples_follow_the_same_order_also_in_workers():
    compiler = fd.Compiler.create(_metric_model())
    examples = _examples(45, seed=3)
    recorded = compiler.record(examples)
    params = compiler.init(jax.random.key(0))
    expected = [_results(compiler, params, b) for b in compiler.batches(examples, 8, shuffle=True, seed=5)]
    for workers in (0, 1):
        got = [_results(compiler, params, b)
               for b in compiler.batches(recorded, 8, shuffle=True, seed=5, num_workers=workers)]
        assert len(got) == len(expected) == 6
        for x, y in zip(got, expected):
            _assert_tree_close(x, y)


def test_a_pickled_selection_carries_only_its_examples():
    compiler = fd.Compiler.create(_metric_model())
    examples = _examples(400, seed=1)
    recorded = compiler.record(examples)
    part = recorded[[17, 5, 300]]
    copy = pickle.loads(pickle.dumps(part))
    assert len(copy) == 3
    assert len(pickle.dumps(part)) * 20 < len(pickle.dumps(recorded))
    params = compiler.init(jax.random.key(0))
    _assert_tree_close(_results(compiler, params, compiler.build_batch(copy)),
                       _results(compiler, params, compiler.build_batch([examples[i] for i in (17, 5, 300)])))


def test_recording_errors_name_the_example_and_misuse_is_refused():
    compiler = fd.Compiler.create(_metric_model())
    bad_type = _examples(3) + [{"words": ["x"], "n": []}]
    with pytest.raises(ValueError, match="example 3: at .*Scalar"):
        compiler.record(bad_type)
    out_of_range = _examples(5) + [{"words": [3, 12], "n": [0, 0]}]
    with pytest.raises(ValueError, match=r"example 5: at .*outside \[0, 10\)"):
        compiler.record(out_of_range)
    recorded = compiler.record(_examples(4))
    other = fd.Compiler.create(_metric_model())
    with pytest.raises(ValueError, match="recorded by another compiler"):
        other.build_batch(recorded)
    with pytest.raises(ValueError, match="at least one example"):
        compiler.build_batch(recorded[2:2])
    with pytest.raises(IndexError, match="example 4 is out of range for 4"):
        recorded[4]
    assert len(recorded[-1]) == 1
    with pytest.raises(TypeError, match="indexed by an int, a slice"):
        recorded[[0.5, 1.0]]
    with pytest.raises(IndexError, match="needs shape"):
        recorded[np.array([True, False])]


def test_a_boolean_mask_selects_like_its_indices():
    compiler = fd.Compiler.create(_metric_model())
    examples = _examples(6, seed=2)
    recorded = compiler.record(examples)
    mask = np.array([True, False, False, True, True, False])
    params = compiler.init(jax.random.key(0))
    _assert_tree_close(_results(compiler, params, compiler.build_batch(recorded[mask])),
                       _results(compiler, params, compiler.build_batch(recorded[[0, 3, 4]])))


def test_recording_can_show_progress(capsys):
    compiler = fd.Compiler.create(_metric_model())
    recorded = compiler.record(_examples(7), progress=True)
    assert len(recorded) == 7
    assert "recording examples" in capsys.readouterr().err


def test_workers_forked_after_a_recording_get_indices_and_later_recordings_travel_whole():
    from fold.scheduler.records import next_serial

    compiler = fd.Compiler.create(_metric_model())
    early_examples, late_examples = _examples(20, seed=4), _examples(20, seed=5)
    early = compiler.record(early_examples)
    born = next_serial()
    late = compiler.record(late_examples)
    ref = early[[3, 1]].by_reference(born)
    assert ref is not None and late[[3, 1]].by_reference(born) is None
    many = np.arange(15)
    assert len(pickle.dumps(early[many].by_reference(born))) * 5 < len(pickle.dumps(early[many]))
    params = compiler.init(jax.random.key(0))
    _assert_tree_close(_results(compiler, params, compiler.build_batch(ref.resolve())),
                       _results(compiler, params, compiler.build_batch([early_examples[3], early_examples[1]])))
    # End to end: the workers are forked at the first call, after `early` and `late` were made; a
    # recording made after that reaches them as arrays. All give the walked batches.
    newest_examples = _examples(20, seed=6)
    for data, examples in ((early, early_examples), (late, late_examples), (None, newest_examples)):
        data = compiler.record(examples) if data is None else data
        got = list(compiler.batches(data, 6, shuffle=True, seed=1, num_workers=1))
        want = list(compiler.batches(examples, 6, shuffle=True, seed=1))
        assert len(got) == len(want) == 4
        for x, y in zip(got, want):
            _assert_tree_close(_results(compiler, params, x), _results(compiler, params, y))
