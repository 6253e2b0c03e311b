"""The library's exceptions and the helpers that build them.

Errors a user sees are ``TypeError``, ``ValueError`` or ``KeyError`` (the
natural type of what went wrong) with a message that names the blocks,
types, example and path involved. The classes here are how the library
marks and carries them between its layers:

- ``ExplainedTypeError``: a type mismatch whose message already names both
  blocks and both types (``type_error``); ``set_type`` re-explains any other
  ``TypeError`` raised while setting a type, and passes these through.
- ``LeafError``: an error of a leaf block, carried to the walk, which adds
  the example index and block path.
- ``InvalidConstant``: a layer's ``check_constant_inputs`` rejected a
  constant; the compiler re-walks the examples to name the first bad one.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Mapping
from collections.abc import Set as AbstractSet
from typing import Protocol, TypeGuard, TypeVar

import numpy as np

__all__ = ["ExplainedTypeError", "InvalidConstant", "LeafError", "check_int", "set_type", "type_error"]

T = TypeVar("T")


class ExplainedTypeError(TypeError):
    """A type mismatch whose message names the blocks and types involved. ``cases`` holds the
    ids of the blocks (``OneOf``) that added which of their cases it came from."""

    def __init__(self, message: str, cases: frozenset[int] = frozenset()):
        super().__init__(message)
        self.cases = cases


def type_error(a: object, a_type: object, b: object, b_type: object, how: str, detail: str = "",
               side: str | None = None) -> ExplainedTypeError:
    """A type mismatch naming both blocks and both types: ``{a} {how} {a_type} but {b} has {b_type}``,
    with what to write instead where ``b`` knows (its ``mismatch_hint`` of ``side``, the side of ``b``
    whose type is ``b_type``)."""
    msg = f"type mismatch: {a!r} {how} {a_type} but {b!r} has {b_type}"
    if detail:
        msg += f" ({detail})"
    hinted = getattr(b, "mismatch_hint", None)
    hint = hinted(side) if side is not None and hinted is not None else None
    if hint:
        msg += f": {hint}"
    return ExplainedTypeError(msg)


class _Typed(Protocol):
    """What ``set_type`` sets types on: a block."""

    def set_input_type(self, input_type: object) -> object: ...

    def set_output_type(self, output_type: object) -> object: ...


def set_type(block: _Typed, side: str, t: object, explain: Callable[[TypeError], TypeError]) -> None:
    """Sets ``block``'s ``side`` (``"input"`` or ``"output"``) type to ``t``. A ``TypeError`` that
    setting it raises (inference runs in every block it reaches) is replaced by ``explain(e)``
    unless it is already explained."""
    try:
        if side == "input":
            block.set_input_type(t)
        else:
            block.set_output_type(t)
    except ExplainedTypeError:
        raise
    except TypeError as e:
        raise explain(e) from e


class LeafError(Exception):
    """An error of a leaf run by its parent with ``run_leaf``: the driver unwraps it."""

    def __init__(self, block: object, label: object, error: Exception):
        super().__init__(error)
        self.block, self.label, self.error = block, label, error


class InvalidConstant(Exception):
    """A layer's ``check_constant_inputs`` rejected a constant; ``error`` is what it raised."""

    def __init__(self, error: Exception):
        super().__init__(str(error))
        self.error = error


def check_examples(examples: Iterable[T], where: str) -> Iterable[T]:
    """``examples`` if it can be a collection of examples for ``where`` (``"build_batch"``, ...):
    an iterable, but not a string, bytes, a dict or a set, whose iteration gives characters,
    keys or an order of its own: a batch of those would hold other examples than the caller
    meant, or in an order the caller cannot map back. Else TypeError."""
    if isinstance(examples, (str, bytes, Mapping, AbstractSet)):
        kind = type(examples).__name__
        hint = ("; pass list(d.values()) for its values, or [d] for one example" if isinstance(examples, Mapping)
                else "; for one example, pass [example]" if isinstance(examples, (str, bytes))
                else "; pass a list (a set has no order to match the outputs to)")
        raise TypeError(f"{where} takes a list or iterable of examples, got a {kind}{hint}")
    try:
        iter(examples)  # also a sequence with __getitem__ and __len__ only (a PyTorch Dataset)
    except TypeError:
        raise TypeError(f"{where} takes a list or iterable of examples, got {type(examples).__name__} "
                        f"{examples!r}; for one example, pass [example]") from None
    return examples


def _is_int(value: object) -> TypeGuard[int | np.integer]:
    """Whether ``value`` is a Python or NumPy int (a bool is not)."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def whole(owner: str, name: str, value: object) -> int:
    """``value`` as an int if it is one (a Python or NumPy int, not a bool); else TypeError naming
    ``owner``'s argument ``name``: ``int(2.5)`` would make ``FC(2.5)`` a 2-unit layer without a word."""
    if not _is_int(value):
        raise TypeError(f"{owner}'s {name} must be an int, got {value!r}")
    return int(value)


def check_int(name: str, value: object, minimum: int) -> int:
    """``value`` as an int, if it is one (a Python or NumPy int, not a bool) of at least
    ``minimum``; else ValueError naming the option ``name``. A float such as 2.5 or a string
    would otherwise fail later, in ``range`` or ``islice``, with a message that names neither."""
    if not _is_int(value) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    if value > sys.maxsize:
        raise ValueError(f"{name} must be at most sys.maxsize ({sys.maxsize}), got {value!r}")
    return int(value)
