"""``summary``: what a compiled model is made of, as text (``Compiler.summary``).

Examples:
    >>> import fold as fd, jax
    >>> compiler = fd.Compiler.create(fd.Vector(2) >> fd.FC(1, name="out"))
    >>> print(summary(compiler.program, compiler.init(jax.random.key(0))).splitlines()[2])
      out  FC  takes TensorType((2,), 'float32')  b (1,), w (2, 1)  3
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np

from fold.compiler.params import Params
from fold.scheduler.program import Program

__all__ = ["summary"]


def summary(program: Program, structs: Params) -> str:
    """``program``'s layers (their parameters' shapes from ``structs``, what ``init`` gives, and
    counts), its operations with their types, its metrics and its arena types."""
    p = program
    layers = []
    for name, (layer, t) in sorted(p.layers.items()):
        leaves = jax.tree_util.tree_flatten_with_path(structs[name])[0]
        shapes = ", ".join(f"{jax.tree_util.keystr(path).strip('[]').strip(chr(39))} {tuple(x.shape)}"
                           for path, x in leaves)
        count = sum(int(np.prod(x.shape)) for _, x in leaves)
        layers.append((name, type(layer).__name__, f"takes {t}", shapes or "no parameters", str(count)))
    total = sum(int(row[-1]) for row in layers)
    lines = [f"root {p.root!r}: {p.root.input_type} -> {p.output_type}", f"layers ({total:,} parameters):"]
    lines += _table(layers) or ["  (none)"]
    lines.append(f"operations ({len(p.ops)}; one batched call per depth each):")
    lines += _table([(str(o), op.spec.label, f"{op.spec.in_type} -> {op.spec.out_type}")
                     for o, op in enumerate(p.ops)]) or ["  (none)"]
    if p.metric_types:
        lines.append("metrics: " + ", ".join(f"{n} {t}" for n, t in p.metric_types.items()))
    lines.append("tensor types (arenas): " + ", ".join(str(t) for t in p.types))
    return "\n".join(lines)


def _table(rows: Sequence[tuple[str, ...]]) -> list[str]:
    """``rows`` as indented lines with aligned columns (the last one ragged)."""
    if not rows:
        return []
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return ["  " + "  ".join([*(c.ljust(w) for c, w in zip(r, widths)), r[-1]]) for r in rows]
