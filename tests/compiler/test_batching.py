"""The batch stream's one ``C``: ``Compiler.batches`` picks it once from its first batches
(``stream_chunk``), where ``build_batch`` picks it per batch (``pick_chunk``)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fold as fd
from fold.scheduler import layouts


def _words_model() -> fd.Compiler:
    # A sentence of words, each a fold over its characters: every loop group is one character step
    # of every word of the batch, more rows than the batch has examples (as a tagger's character
    # LSTMs), so a batch built alone may not take C = 32.
    step = fd.Function(lambda h, x: jnp.tanh(0.5 * h + x))
    word = fd.Map(fd.Scalar()) >> fd.Fold(step, np.zeros((), np.float32))
    return fd.Compiler.create(fd.Map(word) >> fd.Sum())


def _sentences(n: int, seed: int = 0) -> list[list[list[float]]]:
    rng = np.random.default_rng(seed)
    return [[rng.normal(size=rng.integers(1, 6)).round(3).tolist() for _ in range(rng.integers(2, 4))]
            for _ in range(n)]


def _reference(sentence: list[list[float]]) -> float:
    total = 0.0
    for word in sentence:
        h = 0.0
        for x in word:
            h = float(np.tanh(0.5 * h + x))
        total += h
    return total


@pytest.mark.parametrize("num_workers, prefetch", [(0, False), (0, True), (2, True)])
def test_a_stream_of_small_chains_builds_every_batch_with_the_c_its_sample_prices_lowest(num_workers, prefetch):
    compiler = _words_model()
    data = _sentences(8 * (layouts.PLAN_AHEAD + 4))
    alone = _words_model().build_batch(data[:8])
    assert alone.layout.chunk == 128  # groups of up to 24 rows for 8 examples: C = 32 is not a candidate
    batches = list(compiler.batches(data, 8, num_workers=num_workers, prefetch=prefetch))
    assert len(batches) == layouts.PLAN_AHEAD + 4
    assert {b.layout.chunk for b in batches} == {32}
    assert compiler.stats().layouts == 1
    params = compiler.init(jax.random.key(0))
    out = np.concatenate([np.asarray(compiler.apply(params, b).outputs) for b in batches])
    np.testing.assert_allclose(out, [_reference(s) for s in data], rtol=1e-5, atol=1e-6)
    assert np.concatenate([b.example_indices for b in batches]).tolist() == list(range(len(data)))


def test_the_next_stream_of_the_same_batch_size_keeps_the_pick_and_waits_for_no_sample():
    compiler = _words_model()
    data = _sentences(8 * (layouts.PLAN_AHEAD + 2))
    first = list(compiler.batches(data, 8, shuffle=True, seed=0))
    built = []
    original = compiler._batcher.build_own

    def counting(examples, chunk_sizes=None):
        built.append(chunk_sizes)
        return original(examples, chunk_sizes)

    compiler._batcher.build_own = counting
    again = compiler.batches(data, 8, shuffle=True, seed=1, prefetch=False)
    next(again)
    assert built == [(32,)]  # one batch built, already with the stream's C
    assert [b.layout.chunk for b in [*first, *again]] == [32] * (2 * len(first) - 1)  # one taken by next
    assert compiler.stats().layouts == 1


def test_a_stream_of_large_trees_keeps_large_items():
    # SST-like groups of hundreds of rows: fewer, fuller items win, as per batch.
    compiler = fd.Compiler.create(fd.Map(fd.Scalar() >> fd.Function(lambda x: 2 * x)) >> fd.Sum())
    data = [np.arange(600.0).tolist()] * 40
    assert {b.layout.chunk for b in compiler.batches(data, 2)} == {compiler.build_batch(data[:2]).layout.chunk}


def test_a_bad_example_in_the_sample_is_raised_after_the_batches_before_it():
    compiler = _words_model()
    data = _sentences(8 * layouts.PLAN_AHEAD)
    data[8 * 3 + 2] = [["x"]]
    stream = compiler.batches(data, 8)
    for _ in range(3):
        assert next(stream).layout.chunk == 32
    with pytest.raises(ValueError, match="example 26 "):
        next(stream)
