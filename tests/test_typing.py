"""The package type-checks: mypy in strict mode over ``fold/`` with the settings in pyproject.toml (run in CI),
and ``Any`` appears only through the aliases that say what the user's values are (``fold/typing.py``)."""

import ast
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_mypy_finds_no_errors():
    done = subprocess.run([sys.executable, "-m", "mypy", "--no-incremental"], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no issues found" in done.stdout


def _uses_of_any(tree: ast.Module) -> list[int]:
    """Lines where ``Any`` is used other than as the whole value of a ``TypeAlias``."""
    aliases = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.AnnAssign)
               and isinstance(node.annotation, ast.Name) and node.annotation.id == "TypeAlias"}
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Name) and node.id == "Any" and id(node) not in aliases]


def test_any_appears_only_as_a_named_alias():
    uses = {str(path.relative_to(ROOT)): lines for path in sorted((ROOT / "fold").rglob("*.py"))
            if (lines := _uses_of_any(ast.parse(path.read_text())))}
    assert not uses, f"Any outside a TypeAlias that names what the value is: {uses}"


def test_the_any_check_finds_a_bare_any():
    assert _uses_of_any(ast.parse("from typing import Any\nX: TypeAlias = Any\ndef f(x: Any) -> int: ...")) == [3]


def test_mypy_runs_strict():
    assert "strict = true" in (ROOT / "pyproject.toml").read_text()
