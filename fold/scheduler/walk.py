"""The host walk: runs one example through a block tree without recursion.

Blocks are generators (see ``fold/blocks/base.py``); this driver keeps
them on an explicit stack, so a 10,000-deep tree or sequence costs a long
list, not a deep Python stack. On a bad input it re-raises the error with
its natural type, prefixed by the example's index and the block path.
"""

from __future__ import annotations

from typing import cast

import jax

from fold.blocks.base import Block
from fold.blocks.host import HostContext, HostValue, HostWalk, Step
from fold.errors import LeafError
from fold.typing import PyObject

__all__ = ["walk", "InputError"]

# Exceptions rebuilt with the example and path in their message (others get a note).
_NATURAL = (KeyError, TypeError, ValueError, OverflowError, ZeroDivisionError)

# What reading a traced value as data raises: the examples were given to a function under jit.
_TRACED = (jax.errors.ConcretizationTypeError, jax.errors.TracerArrayConversionError,
           jax.errors.TracerIntegerConversionError)


class InputError:
    """Marks exceptions that already carry an example index and block path."""

    attribute = "_fold_input_error"


class _Frame:
    """A composite block the walk is in: its host walk, and the label of the child it runs."""

    __slots__ = ("walk", "block", "label")

    def __init__(self, walk: HostWalk, block: Block):
        self.walk = walk
        self.block = block
        self.label: PyObject = None


# Blocks shown at each end of an error's block path; the ones between are counted.
PATH_ENDS = 12


def _message(e: BaseException) -> str:
    if isinstance(e, KeyError) and len(e.args) == 1:
        return str(e.args[0])
    return str(e)


def _rewrap(e: BaseException, stack: list[_Frame], block: Step, where: str) -> BaseException:
    if getattr(e, InputError.attribute, False):
        return e
    parts = [label if isinstance(label, str) else label[0].format(*label[1:])
             for label in (frame.label for frame in stack) if label is not None]
    parts.append(block._path_name())
    if len(parts) > 2 * PATH_ENDS:  # a deep recursion: its start and where it failed say enough
        parts[PATH_ENDS:-PATH_ENDS] = [f"... {len(parts) - 2 * PATH_ENDS} blocks ..."]
    path = " > ".join(parts)
    cls: type[BaseException] = type(e)
    message = _message(e)
    if isinstance(e, _TRACED):
        cls, message = TypeError, ("the example holds a traced JAX value, not data: batches are built on the host, "
                                   "so build them outside jax.jit (or grad, vmap, ...) and pass the batch in")
    msg = f"{where}: at {path}: {message}"
    if isinstance(e, IndexError):
        cls = KeyError
    try:
        new = cls(msg) if isinstance(e, _NATURAL + (IndexError,)) else None
    except Exception:  # an exception class with an unusual constructor
        new = None
    if new is None:  # the user's own exception class (or one with an unusual constructor): keep it
        if e.args and isinstance(e.args[0], str) and str(e) == e.args[0]:
            # Its message is its first argument: say where in the message itself, which loggers
            # print (notes they may drop), keeping its type and attributes for handlers.
            e.args = (msg, *e.args[1:])
        elif hasattr(e, "add_note"):
            e.add_note(msg)
        setattr(e, InputError.attribute, True)
        return e
    setattr(new, InputError.attribute, True)
    return new


def _reraise(e: BaseException, stack: list[_Frame], block: Step, where: str) -> None:
    new = _rewrap(e, stack, block, where)
    if new is e:
        raise e
    raise new from e


def walk(root: Block, x: HostValue, ctx: HostContext) -> HostValue:
    """Evaluates ``root`` on host value ``x``, recording tensor work in ``ctx``."""
    stack: list[_Frame] = []
    pending: tuple[Step, HostValue] | None = (root, x)
    value: HostValue = None
    while True:
        if pending is not None:
            block, arg = pending
            pending = None
            if block._leaf:
                try:
                    value = block._host_leaf(arg, ctx)
                except LeafError as e:  # inside a leaf Pipe
                    _reraise(e.error, stack, cast(Step, e.block), ctx.where())  # run_leaf wraps a step's error
                except Exception as e:
                    _reraise(e, stack, block, ctx.where())
            else:
                composite = cast(Block, block)  # a step that is not a leaf is a block
                stack.append(_Frame(composite._host(arg, ctx), composite))
                value = None
        if not stack:
            return value
        frame = stack[-1]
        frame.label = None
        try:
            child, arg, label = frame.walk.send(value)
        except StopIteration as stop:
            stack.pop()
            value = stop.value
            continue
        except LeafError as e:
            frame.label = e.label
            _reraise(e.error, stack, cast(Step, e.block), ctx.where())  # run_leaf wraps a step's error
        except Exception as e:
            stack.pop()
            _reraise(e, stack, frame.block, ctx.where())
        frame.label = label
        pending = (child, arg)
