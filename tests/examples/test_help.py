"""Every example's --help explains every flag and shows the defaults."""

from __future__ import annotations

import importlib
import re
import sys

import pytest

EXAMPLES = ["attention", "calculator", "quickstart", "sentiment_pipeline", "tree_lstm_sst", "weave"]


@pytest.mark.parametrize("name", EXAMPLES)
def test_every_flag_has_a_help_line_and_its_default(name, capsys, monkeypatch):
    module = importlib.import_module(f"examples.{name}")
    monkeypatch.setattr(sys, "argv", [f"{name}.py", "--help"])
    with pytest.raises(SystemExit) as exit_:
        module.parse_args(["--help"]) if hasattr(module, "parse_args") else module.main()
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
