"""``plot_schedule(compiler, examples)``: a batch's schedule as a bar chart, for notebooks and docs.

One bar per step of the schedule (a depth; hoisted groups run first, tail groups after the loop),
stacked by operation: the solid part is the group's nodes (one row each), the hatched part the
padding the executor computes on top (loop items are padded to their item size, hoisted and tail
groups to a power of two). It shows where a batch's work goes: how wide each depth is, which
operations dominate, and what padding costs. Needs matplotlib.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from fold.compiler.compiler import Compiler, check_compiler
from fold.errors import check_examples
from fold.scheduler.builder import run_examples
from fold.scheduler.schedule import GroupProfile, profile
from fold.typing import PyObject

if TYPE_CHECKING:
    from matplotlib.axes import Axes

    from fold.scheduler.program import CompiledOp

__all__ = ["plot_schedule", "schedule_profile"]


def schedule_profile(compiler: Compiler, examples: Iterable[PyObject]) -> tuple[list[GroupProfile], int]:
    """The groups of the schedule ``examples`` get as one batch, in the order they run, and the
    ``C`` the compiler picks for it.

    Returns:
      ``([GroupProfile(stage, depth, op, rows, computed), ...], C)``; ``op`` indexes
      ``compiler.program.ops``.
    """
    check_compiler(compiler, "schedule_profile")
    examples = list(check_examples(examples, "schedule_profile"))
    chunk = compiler.build_batch(examples, exact_layout=True).layout.chunk
    builder, _ = run_examples(compiler.program, examples)
    return profile(compiler.program, builder.arrays(), chunk, len(examples)), chunk


def plot_schedule(compiler: Compiler, examples: Iterable[PyObject], ax: Axes | None = None) -> Axes:
    """Draws the schedule of ``examples`` as one batch (see the module docstring).

    Args:
      compiler: the compiled model.
      examples: the batch's examples.
      ax: a matplotlib ``Axes`` to draw on (default: a new figure's).

    Returns:
      The ``Axes``.

    Raises:
      ImportError: matplotlib is not installed.
    """
    try:
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise ImportError("fd.plot_schedule needs matplotlib: pip install matplotlib") from e
    check_compiler(compiler, "plot_schedule")
    examples = list(check_examples(examples, "plot_schedule"))
    groups, chunk = schedule_profile(compiler, examples)
    own_figure = ax is None
    if ax is None:
        figure, ax = plt.subplots(figsize=(8, 3.5))
    steps = sorted({(g.depth, g.stage) for g in groups})
    x_of = {step: i for i, step in enumerate(steps)}
    ops = sorted({g.op for g in groups})
    colors = {op: plt.get_cmap("tab10")(i % 10) for i, op in enumerate(ops)}
    bottom = [0] * len(steps)
    for g in groups:
        x = x_of[(g.depth, g.stage)]
        ax.bar(x, g.rows, bottom=bottom[x], color=colors[g.op], edgecolor="white", linewidth=0.3)
        ax.bar(x, g.computed - g.rows, bottom=bottom[x] + g.rows, color=colors[g.op], alpha=0.35, hatch="//",
               edgecolor="white", linewidth=0.3)
        bottom[x] += g.computed
    for op in ops:
        ax.bar(0, 0, color=colors[op], label=f"{op}: {_op_label(compiler.program.ops[op])}")
    ax.bar(0, 0, color="grey", alpha=0.35, hatch="//", label="padding")
    ax.set_xticks(range(len(steps)), [f"{d}" if s == "loop" else f"{d}\n{s}" for d, s in steps])
    depths = {d for d, _ in steps}
    empty = sorted(set(range(min(depths), max(depths) + 1)) - depths) if depths else []
    shown = ", ".join(map(str, empty[:6])) + (", ..." if len(empty) > 6 else "")
    ax.set_xlabel("depth (one batched call per operation)"
                  + (f"; depths {shown} run nothing and are left out" if empty else ""))
    ax.set_ylabel("rows")
    nodes, computed = sum(g.rows for g in groups), sum(g.computed for g in groups)
    ax.set_title(f"{len(examples)} examples: {nodes:,} nodes, {computed:,} rows computed (C = {chunk})")
    ax.legend(fontsize="small", loc="upper right")
    if own_figure:
        figure.tight_layout()
    return ax


def _op_label(op: CompiledOp) -> str:
    """An operation as the legend names it: its layer's class and name where it has one."""
    return f"{type(op.layer).__name__} {op.layer.name!r}" if op.layer is not None else op.spec.label
