"""The documentation site (docs/ and the API reference built from the docstrings) builds with mkdocs
in strict mode: a broken docstring section or cross-reference fails the suite."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_mkdocs_builds_without_warnings(tmp_path):
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stdout + done.stderr
    warnings = re.findall(r"^WARNING\s+-.*$", done.stderr, re.MULTILINE)
    assert not warnings, warnings
    api = (tmp_path / "site" / "api" / "index.html").read_text(encoding="utf-8")
    for name in ("Compiler", "Trainer", "ForwardDeclaration", "save_checkpoint"):
        assert f'id="fold.{name}"' in api, name


def test_the_reference_lists_every_public_name_once_in_a_group():
    """The reference was one page of every name in alphabetical order, internals beside entry points."""
    import fold

    page = (ROOT / "docs" / "api.md").read_text()
    listed = re.findall(r"^::: fold\.(\w+)$", page, re.M)
    assert sorted(listed) == sorted(fold.__all__) and len(listed) == len(set(listed))
    assert len(re.findall(r"^## ", page, re.M)) >= 5
