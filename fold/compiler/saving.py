"""The ``backward`` save policy: whether a batch's backward pass keeps loop outputs or recomputes them.

Under ``backward="save"`` (or ``"auto"`` when it pays) each loop item keeps what its ``vjp``
needs (its matmul outputs, ``Executor.saved_row_bytes``) in buffers of its operation's own, one
item after another (``items_saved`` in the batch arrays), and the backward loop reads them back
instead of running the item's forward pass again. The scheduler records the rows each loop
operation's items would take (``BatchStats.saved_rows``) without knowing the policy; this module
decides, on the host, per batch, which buffers its layout gets (``BatchLayout.saved_rows``).

The costs are per operation and per ``C``, from shapes alone (``jax.eval_shape`` and XLA's cost
analysis), computed on first use and then kept: ``SavePolicy.decide`` only looks them up, so
call ``row_bytes`` for every ``C`` before forking processes that decide.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax

from fold.compiler.executor import Executor
from fold.scheduler.batch import Batch
from fold.scheduler.layouts import saved_floor
from fold.scheduler.schedule import arena_rows_for
from fold.typing import Params

__all__ = ["BACKWARDS", "SAVE_INTENSITY", "SAVE_LIMIT", "SavePolicy", "abstract_params",
           "saved_buffer_bytes"]

BACKWARDS = ("auto", "recompute", "save")  # how the loop's backward pass gets each item's vjp
# backward="auto" saves when the saved buffers take at most this many bytes (see Compiler.create).
# Measured on a 2-core CPU with freed host memory kept (benchmarks.backward, backward_kept.json):
# saving made steps 16-25 % shorter up to 26 MiB saved (SST at batch 25-128, Table 1 trees at 32),
# and 0.94-1.06x as long from 31 MiB up (SST at 256, Table 1 at 64 and 256), where it doubles the
# step's temporaries past the 64 MiB fold keeps in the heap (fold/host_memory.py), so they are
# mapped fresh every step. The limit sits between: SST's batches of 256 (29-32 MiB) recompute.
SAVE_LIMIT = 28 * 2**20
# ... and only the operations whose forward pass costs at least this many FLOPs per byte they would
# save: a saved row is written, kept and read back whatever the matmul behind it, while recomputing
# it costs that matmul. Measured on a 2-core CPU (benchmarks.executor): the SST Tree-LSTM cell
# (201 FLOPs per saved byte at H = 150) trained 10-13 % faster saving at batch 64, a weave module's
# FCs (16-33: 32-float rows from 32-64 inputs) 7-22 % slower.
SAVE_INTENSITY = 64


def saved_buffer_bytes(saved_rows: Sequence[int], row_bytes: Sequence[int], chunk: int) -> int:
    """Bytes of a batch's saved buffers: per loop operation, its saved rows plus ``chunk`` spill rows
    (an item writes ``chunk`` rows, so its operation's last one runs past its saved rows) times
    the bytes it saves per row (``SavePolicy.row_bytes``). This is what the executor's
    ``_SavedBuffers`` allocates."""
    return sum((rows + chunk) * b for rows, b in zip(saved_rows, row_bytes))


class SavePolicy:
    """Decides per batch whether its backward pass saves, and for which operations.

    Args:
      backward: ``"auto"``, ``"save"`` or ``"recompute"`` (see ``Compiler.create``).
      save_limit: under ``"auto"``, the most bytes a batch's saved buffers may take.
      executor: the ``Executor`` whose loop saves (it prices each operation's saved rows and FLOPs).
      params: the parameters' shapes and dtypes (``abstract_params``), computed when first needed.
    """

    def __init__(self, backward: str, save_limit: int, executor: Executor, params: Callable[[], Params]):
        self.backward = backward
        self.save_limit = save_limit
        self._executor = executor
        self._params = params
        self._row_bytes: dict[int, tuple[int, ...]] = {}  # C -> per op, saved bytes per loop row
        self.flops_per_row: dict[int, float | None] = {}  # op -> its forward pass's FLOPs per row

    def row_bytes(self, chunk: int) -> tuple[int, ...]:
        """Per operation, the bytes the backward pass keeps per loop row with ``C = chunk`` when a
        batch saves: 0 where it keeps nothing, which under ``"auto"`` includes the operations
        whose forward pass costs fewer than ``SAVE_INTENSITY`` FLOPs per saved byte (cheaper to
        recompute than to keep)."""
        if chunk not in self._row_bytes:
            params = self._params()
            saved = [self._executor.saved_row_bytes(o, params, chunk) for o in range(len(self._executor.ops))]
            if self.backward == "auto":
                saved = [b if b and self._worth_saving(o, b, params) else 0 for o, b in enumerate(saved)]
            self._row_bytes[chunk] = tuple(saved)
        return self._row_bytes[chunk]

    def _worth_saving(self, o: int, row_bytes: int, params: Params) -> bool:
        """Whether operation ``o`` costs at least ``SAVE_INTENSITY`` FLOPs per byte it saves (yes
        when XLA gives no FLOP count)."""
        if o not in self.flops_per_row:
            self.flops_per_row[o] = self._executor.flops_per_row(o, params)
        flops = self.flops_per_row[o]
        return flops is None or flops >= SAVE_INTENSITY * row_bytes

    def saved_rows(self, batch: Batch) -> tuple[int, ...]:
        """Per loop operation of ``batch``, the rows of its saved buffers, or () when the batch does
        not save: under ``"recompute"``, when nothing is worth saving, or under ``"auto"`` when the
        buffers would take more than ``save_limit`` bytes. Operations that save nothing get no
        buffer (and no size in the layout to compile for)."""
        if self.backward == "recompute":
            return ()
        layout = batch.layout
        op_bytes = self.row_bytes(layout.chunk)
        row_bytes = [op_bytes[o] for o in layout.loop_ops]
        need = batch.built_stats().saved_rows
        rows = saved_floor(tuple(arena_rows_for(r) if b else 0 for r, b in zip(need, row_bytes)), layout.size_class)
        saved_bytes = saved_buffer_bytes(rows, row_bytes, layout.chunk)
        if not saved_bytes or (self.backward == "auto" and saved_bytes > self.save_limit):
            return ()
        return rows

    def decide(self, batch: Batch) -> Batch:
        """``batch`` with the saved buffers of ``saved_rows`` in its layout."""
        rows = self.saved_rows(batch)
        if rows == batch.layout.saved_rows:
            return batch
        return batch.replace(layout=batch.layout._replace(saved_rows=rows))


def abstract_params(init: Callable[[jax.Array], Params]) -> Params:
    """The shapes and dtypes ``init`` gives the parameters (or the parameters, for a layer whose
    init needs concrete values)."""
    try:
        structs: Params = jax.eval_shape(init, jax.random.key(0))
        return structs
    except jax.errors.JAXTypeError:  # host randomness in a layer's init
        return init(jax.random.key(0))
