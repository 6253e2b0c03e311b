"""docs/errors.md is a test: every entry's snippet raises exactly the error the page shows."""

from __future__ import annotations

import builtins
import pathlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fold as fd

PAGE = pathlib.Path(__file__).resolve().parents[1] / "docs" / "errors.md"
ENTRY = re.compile(r"^### (?P<title>.+?)\n\n```python\n(?P<code>.*?)```\n\n```text\n(?P<error>.*?)```", re.S | re.M)
ENTRIES = {m["title"]: (m["code"], m["error"]) for m in ENTRY.finditer(PAGE.read_text())}


def shown(e: BaseException) -> str:
    """How the page shows an error: the builtin type to catch and the message."""
    name = next(c.__name__ for c in type(e).__mro__ if getattr(builtins, c.__name__, None) is c)
    message = e.args[0] if isinstance(e, KeyError) and len(e.args) == 1 else str(e)
    return f"{name}: {message}"


def test_the_page_has_every_kind_of_entry():
    sections = re.findall(r"^## (.+)$", PAGE.read_text(), re.M)
    assert sections == ["Input values", "Model construction", "Compiler misuse", "Numerics"]
    assert len(ENTRIES) >= 25
    assert PAGE.read_text().count("### ") == len(ENTRIES)  # every entry parses


@pytest.mark.parametrize("title", sorted(ENTRIES))
def test_entry(title):
    code, error = ENTRIES[title]
    names = {"fd": fd, "jax": jax, "jnp": jnp, "np": np}
    with pytest.raises(Exception) as raised:
        exec(code, names)
    message = shown(raised.value)
    if "run_dir" in names:  # a temporary folder: the page shows it as RUN_DIR
        message = message.replace(str(names["run_dir"]), "RUN_DIR")
    assert " ".join(message.split()) == " ".join(error.split())
