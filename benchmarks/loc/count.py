"""The Fold paper's line-counting protocol (Looks et al. 2017, Appendix C), applied mechanically.

A functional unit lives in one file that implements it and nothing else. Its count is the number
of physical lines that hold code once imports, docstrings, comments and blank lines are removed
(the paper counted with cloc). The protocol also removes abstract base classes, logging, file I/O
and validation logic; the unit files are written without them, and ``check_unit`` refuses a file
that has any, so that nothing needs removing by hand.
"""

from __future__ import annotations

import ast
import io
import json
import pathlib
import shutil
import subprocess
import tempfile
import tokenize
from typing import NamedTuple

# Token types that are not code.
_NOT_CODE = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
             tokenize.ENDMARKER, tokenize.ENCODING}


def _docstring(node: ast.AST) -> ast.Expr | None:
    body = getattr(node, "body", None)
    if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body:
        first = body[0]
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
            return first
    return None


def strip(source: str) -> str:
    """``source``'s lines that count: those holding code that is not an import or a docstring.

    >>> strip('import os\\n\\ndef f(x):\\n    "Doc."\\n    # why\\n    return (x +\\n            1)  # note\\n')
    'def f(x):\\n    return (x +\\n            1)  # note'
    """
    skip: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        dropped = node if isinstance(node, (ast.Import, ast.ImportFrom)) else _docstring(node)
        if dropped is not None:
            skip.update(range(dropped.lineno, dropped.end_lineno + 1))
    code: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in _NOT_CODE:
            code.update(range(token.start[0], token.end[0] + 1))
    lines = source.splitlines()
    return "\n".join(lines[i - 1] for i in sorted(code - skip))


class Count(NamedTuple):
    """A file's count and the tool that made it."""

    lines: int
    counter: str


def check_unit(path: pathlib.Path) -> None:
    """Raises ``ValueError`` when ``path`` holds what the protocol would have removed by hand."""
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        what = None
        if isinstance(node, ast.Raise | ast.Assert):
            what = "validation logic"
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("print", "open"):
            what = f"{node.func.id}()"
        elif isinstance(node, ast.Name | ast.Attribute) and "logging" in (getattr(node, "id", ""),
                                                                           getattr(node, "attr", "")):
            what = "logging"
        elif isinstance(node, ast.ClassDef) and any(getattr(b, "id", getattr(b, "attr", "")) in ("ABC", "Protocol")
                                                    for b in node.bases):
            what = "an abstract base class"
        if what is not None:
            raise ValueError(f"{path}:{node.lineno}: {what}; a unit file holds the unit's function only")


def _cloc(stripped: str) -> int:
    with tempfile.TemporaryDirectory() as d:
        path = pathlib.Path(d, "unit.py")
        path.write_text(stripped + "\n")
        out = subprocess.run(["cloc", "--json", "--quiet", str(path)], capture_output=True, text=True, check=True)
        return int(json.loads(out.stdout)["Python"]["code"])


def _pygount(stripped: str) -> int:
    from pygount import SourceAnalysis

    with tempfile.TemporaryDirectory() as d:
        path = pathlib.Path(d, "unit.py")
        path.write_text(stripped + "\n")
        return int(SourceAnalysis.from_file(str(path), "loc").code_count)


def available_counter() -> str:
    """``"cloc"`` when it is on the PATH, else ``"pygount"`` when it is installed, else ``"tokenize"``."""
    if shutil.which("cloc"):
        return "cloc"
    try:
        import pygount  # noqa: F401
    except ImportError:
        return "tokenize"
    return "pygount"


def count(path: str | pathlib.Path, counter: str | None = None) -> Count:
    """Counts ``path`` by the protocol: its stripped lines, counted by ``counter`` (default
    ``available_counter()``; ``"tokenize"`` counts the stripped lines themselves)."""
    path = pathlib.Path(path)
    check_unit(path)
    stripped = strip(path.read_text())
    counter = counter or available_counter()
    if counter == "cloc":
        return Count(_cloc(stripped), counter)
    if counter == "pygount":
        return Count(_pygount(stripped), counter)
    if counter != "tokenize":
        raise ValueError(f"counter must be 'cloc', 'pygount' or 'tokenize', got {counter!r}")
    return Count(len(stripped.splitlines()), counter)
