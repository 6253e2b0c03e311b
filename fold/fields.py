"""Field docs for the public ``NamedTuple``\\ s: ``help(fd.FitResult)`` shows what each field holds.

Python documents a named tuple's fields as "Alias for field number 0". ``documented`` gives each
field the text written with it in the class body: the docstring under the field, or else the
comment at the end of its line.

Examples:
    >>> import fold as fd
    >>> fd.TrainState.step.__doc__
    'optimizer steps taken'
"""

from __future__ import annotations

import ast
import inspect
import re
import textwrap
from typing import TypeVar

__all__ = ["documented"]

T = TypeVar("T", bound=type)

_TYPE_IGNORE = re.compile(r"^type:\s*ignore(\[[^\]]*\])?\s*(#\s*)?")


def documented(cls: T) -> T:
    """Sets the ``__doc__`` of each field of the named tuple ``cls`` from its source (left as it is
    where the source cannot be read, as in a frozen application)."""
    try:
        lines, _ = inspect.getsourcelines(cls)
    except (OSError, TypeError):
        return cls
    body = ast.parse(textwrap.dedent("".join(lines))).body[0]
    assert isinstance(body, ast.ClassDef)
    statements = body.body
    for i, node in enumerate(statements):
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        nxt = statements[i + 1] if i + 1 < len(statements) else None
        doc = None
        if isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str):
            doc = inspect.cleandoc(nxt.value.value)
        else:
            _, hash_, comment = lines[node.lineno - 1].partition("#")
            doc = _TYPE_IGNORE.sub("", comment.strip()) if hash_ else None
        if doc and node.target.id in getattr(cls, "_fields", ()):
            getattr(cls, node.target.id).__doc__ = doc
    return cls
