"""The README's first example runs in --quick mode and learns (docs/examples.md says every example takes it)."""

from __future__ import annotations

from examples import quickstart


def test_quick_run_learns(capsys):
    report = quickstart.main(["--quick"])
    assert report["last_loss"] < 0.5 * report["first_loss"]
    assert report["test_error"] < report["first_loss"]
    out = capsys.readouterr().out
    assert "100 steps in" in out and "sum of" in out
