"""``HostContext``: what a block may ask of the batch builder while it walks an example.

A block's host work (``Block._host_leaf`` and ``Block._host``, see
``fold/blocks/base.py``) gets the builder as ``ctx``. This protocol is
the whole of that contract: the scheduler's ``BatchBuilder``
(``fold/scheduler/builder.py``) implements it, and a new block may use
exactly these members. Keeping it here, beside the blocks, lets the
blocks be type-checked without importing the scheduler.

Host values follow ``base.py``'s convention: a tensor is an ``int`` id
issued by ``const``, ``zeros`` or ``call``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from fold.blocks.types import TensorType

if TYPE_CHECKING:
    from fold.compiler.program import Program

__all__ = ["HostContext"]


class HostContext(Protocol):
    """The builder as blocks see it (implemented by ``fold.scheduler.builder.BatchBuilder``)."""

    program: Program
    """The compiled model: its operations, pipe steps and per-example limits."""

    block_cache: dict[Any, Any]
    """Values a block computes once per batch (``Zeros`` keeps its ids here)."""

    recursing: set[tuple[int, int]]
    """``(declaration, input object)`` ids of the recursive calls the walk is in (cycle check)."""

    def const(self, ttype: TensorType, value: Any) -> int:
        """A depth-0 constant of ``ttype`` (an array, a Python number for a scalar, or ``None`` for zeros)."""
        ...

    def const_shared(self, key: Any, ttype: TensorType, value: np.ndarray | None) -> int:
        """A constant stored once per batch under ``key``, whichever example asks for it."""
        ...

    def zeros(self, ttype: TensorType) -> int:
        """The batch's one zeros constant of ``ttype``."""
        ...

    def call(self, block: Any, x: Any) -> Any:
        """Records one call of ``block``'s operation on host value ``x``; returns its output's ids."""
        ...

    def metric(self, name: str, vid: int, label: Any = None) -> None:
        """Records tensor ``vid`` as an entry of metric ``name`` (with ``label`` if it has labels)."""
        ...

    def steps(self, pipe: Any) -> Sequence[Any]:
        """The blocks ``pipe`` runs, with runs of operations fused where the program fused them."""
        ...

    def check_size(self) -> None:
        """Raises ``ValueError`` once the current example exceeds the program's node limit."""
        ...

    def where(self) -> str:
        """The current example as errors name it (its dataset index where it has one)."""
        ...
