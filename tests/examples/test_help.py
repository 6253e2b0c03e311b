"""Every example's --help explains every flag and shows the defaults; a bad flag is a usage error."""

from __future__ import annotations

import importlib
import re
import sys

import pytest

EXAMPLES = ["attention", "calculator", "expression_dag", "quickstart", "sentence_decoder", "sentiment_pipeline",
            "tagger", "tree_decoder", "tree_lstm_sst", "weave"]


def _parse(name: str, argv: list[str], monkeypatch) -> None:
    module = importlib.import_module(f"examples.{name}")
    monkeypatch.setattr(sys, "argv", [f"{name}.py", *argv])
    module.parse_args(argv) if hasattr(module, "parse_args") else module.main()


@pytest.mark.parametrize("name", EXAMPLES)
def test_every_flag_has_a_help_line_and_its_default(name, capsys, monkeypatch):
    with pytest.raises(SystemExit) as exit_:
        _parse(name, ["--help"], monkeypatch)
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    options = text.split("options:", 1)[1]
    entries = re.split(r"\n  (?=-)", options.strip("\n"))
    assert len(entries) > 1
    for entry in entries:
        flag, _, rest = entry.strip().partition("\n")
        first = re.split(r"\s{2,}", flag, maxsplit=1)
        described = " ".join((first[1] if len(first) > 1 else "").split() + rest.split())
        assert described, f"{name}: {flag.strip()} has no help line"
        takes_value = re.search(r"--[\w-]+ [A-Z_]", flag) is not None
        if takes_value:
            assert "(default:" in described, f"{name}: {flag.strip()} does not show its default"


BAD_FLAGS = [
    (["--batch-size", "0"], "--batch-size: must be int >= 1, got 0"),
    (["--epochs", "-2"], "--epochs: must be int >= 1, got -2"),
    (["--epochs", "2.5"], "--epochs: invalid int >= 1 value: '2.5'"),
    (["--workers", "-1"], "--workers: must be int >= 0, got -1"),
    (["--learning-rate", "0"], "--learning-rate: must be float > 0, got 0"),
    (["--seed", "-1"], "--seed: must be int >= 0, got -1"),
    (["--reserve-cores", "-1"], "--reserve-cores: must be int >= 0, got -1"),
]
EXAMPLE_FLAGS = [
    ("attention", ["--t0", "10", "0"], "--t0: must be int >= 1, got 0"),
    ("calculator", ["--max-depth", "0"], "--max-depth: must be int >= 1, got 0"),
    ("expression_dag", ["--max-steps", "0"], "--max-steps: must be int >= 1, got 0"),
    ("sentiment_pipeline", ["--state-size", "-4"], "--state-size: must be int >= 1, got -4"),
    ("tree_lstm_sst", ["--recurrent-dropout", "1"], "--recurrent-dropout: must be float in [0, 1), got 1"),
    ("tree_lstm_sst", ["--l2", "-0.1"], "--l2: must be float >= 0, got -0.1"),
    ("tree_lstm_sst", ["--lr-decay", "0"], "--lr-decay: must be float > 0, got 0"),
    ("weave", ["--min-atoms", "5", "--max-atoms", "4"], "need 2 <= --min-atoms <= --max-atoms, got 5 and 4"),
    ("quickstart", ["--batch-size", "0"], "need --steps and --batch-size >= 1 and --seed >= 0, got 300, 0, 0"),
]


@pytest.mark.parametrize("name, argv, message",
                         [(n, a, m) for n in EXAMPLES if n != "quickstart" for a, m in BAD_FLAGS] + EXAMPLE_FLAGS)
def test_a_flag_out_of_range_is_a_usage_error_naming_it(name, argv, message, capsys, monkeypatch):
    with pytest.raises(SystemExit) as exit_:
        _parse(name, argv, monkeypatch)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("name", [n for n in EXAMPLES if n != "quickstart"])
def test_reserving_cores_after_jax_started_is_a_usage_error(name, capsys, monkeypatch):
    """JAX runs here already (started first, so that the flag cannot reserve cores in the test
    process): the reservation comes too late. ``tests/test_cores.py`` runs one in a fresh process."""
    import jax

    jax.devices()
    with pytest.raises(SystemExit) as exit_:
        _parse(name, ["--reserve-cores", "1"], monkeypatch)
    assert exit_.value.code == 2
    assert "--reserve-cores 1: reserve_host_cores must run before JAX starts its backends" in capsys.readouterr().err
