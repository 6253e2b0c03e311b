"""The code of README.md, docs/quickstart.md, docs/blocks.md and docs/sharing.md runs as written, block
after block in one namespace (as a reader would paste it), and a block that documents an error
(``# SomeError: message`` at its end) raises exactly that error. docs/errors.md is checked by
test_errors_catalogue.py."""

from __future__ import annotations

import builtins
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
# A trailing comment "# TypeError: ..." (continued by "#     ..." lines) is the error the block shows.
ERROR = re.compile(r"^# (\w+Error): (.*?)\Z", re.S | re.M)


def _expected_error(code: str) -> tuple[str, str] | None:
    m = ERROR.search(code)
    if m is None:
        return None
    message = " ".join(line.lstrip("#").strip() for line in m.group(2).splitlines())
    return m.group(1), message


def _shown(e: BaseException) -> tuple[str, str]:
    name = next(c.__name__ for c in type(e).__mro__ if getattr(builtins, c.__name__, None) is c)
    return name, " ".join(str(e.args[0] if isinstance(e, KeyError) else e).split())


@pytest.mark.parametrize("page", ["README.md", "docs/quickstart.md", "docs/blocks.md", "docs/sharing.md"])
def test_the_page_runs_as_written(page):
    blocks = BLOCK.findall((ROOT / page).read_text())
    assert blocks, page
    namespace: dict = {}
    for i, code in enumerate(blocks):
        expected = _expected_error(code)
        if expected is None:
            exec(compile(code, f"{page} block {i}", "exec"), namespace)
            continue
        with pytest.raises(Exception) as raised:
            exec(compile(code, f"{page} block {i}", "exec"), namespace)
        assert _shown(raised.value) == expected, f"{page} block {i}"
