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


def test_a_run_records_any_error_and_clears_caches_as_it_goes(monkeypatch, tmp_path):
    """A case that raises is a finding, not the end of the run (a long run once stopped after 40
    cases when XLA's LLVM could not allocate memory), and JAX's caches are cleared every
    ``CLEAR_EVERY`` cases so that its memory stays flat."""
    checked, cleared = [], []

    def check(seed, examples=5):
        checked.append(seed)
        if seed == 11:
            raise RuntimeError("LLVM ERROR: out of memory")
        if seed == 12:
            raise random_decoders.Failure(f"seed {seed}: generated [1] (flag False), reference [2] (flag False)")
        return {"seed": seed, "decoder": "SequenceDecoder(...)", "flagged": 0}

    monkeypatch.setattr(random_decoders, "check", check)
    monkeypatch.setattr("benchmarks.common.CLEAR_EVERY", 2)
    monkeypatch.setattr("jax.clear_caches", lambda: cleared.append(len(checked)))
    result = random_decoders.main(["--cases", "5", "--first-seed", "10", "--json", str(tmp_path / "out.json")])
    assert checked == [10, 11, 12, 13, 14]
    assert result["failures"] == ["seed 11: RuntimeError: LLVM ERROR: out of memory",
                                  "seed 12: generated [1] (flag False), reference [2] (flag False)"]
    assert result["kinds"] == {"SequenceDecoder": 3}
    assert cleared == [2, 4]
