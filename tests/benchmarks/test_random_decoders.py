"""``benchmarks.random_decoders``: random decoders against their per-example references, and a
broken generator caught."""

from __future__ import annotations

import jax.numpy as jnp
import pytest

import fold as fd
from benchmarks import random_decoders
from fold.generation import decoder as decoder_module


def _seeds(kind: type, count: int) -> list[int]:
    return [s for s in range(60) if isinstance(random_decoders.random_decoder(s).decoder, kind)][:count]


def test_a_random_decoder_matches_its_reference():
    seed = _seeds(fd.SequenceDecoder, 1)[0]
    assert random_decoders.check(seed, examples=4)["seed"] == seed


@pytest.mark.slow  # tree decoders' references take 10-30 s each; the generation tests check trees in CI
@pytest.mark.parametrize("seed", range(100))
def test_more_random_decoders_match_their_references(seed):
    random_decoders.check(seed)


def test_a_generator_that_decides_wrongly_is_caught(monkeypatch):
    def worst(logits, key, example, node, decision):  # the least likely choice, not the greedy one
        return jnp.argmin(logits, axis=-1).astype(jnp.int32)

    monkeypatch.setattr(decoder_module, "choose", worst)
    for module in ("fold.generation.sequence", "fold.generation.tree"):
        monkeypatch.setattr(f"{module}.choose", worst)
    with pytest.raises(random_decoders.Failure, match="generated"):
        random_decoders.check(_seeds(fd.TreeDecoder, 1)[0], examples=3)
