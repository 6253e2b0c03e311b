"""Host-side plumbing blocks: ``Pipe``, ``Record``, ``AllOf``, ``GetItem``, ``Slice``.

They route values between blocks and cost nothing on the device.
"""

from __future__ import annotations

import dataclasses
import unicodedata
from collections import OrderedDict
from collections.abc import Hashable, Mapping

from fold.blocks.base import Block, is_block_like, run_leaf, set_child, unify
from fold.blocks.host import BlockLike, EmitContext, HostContext, HostValue, HostWalk
from fold.blocks.types import (
    BroadcastSequenceType,
    PyObjectType,
    SequenceType,
    TupleType,
    Type,
    VoidType,
    convert_to_type,
)

__all__ = ["Pipe", "Record", "AllOf", "GetItem", "Slice"]


def _short(x: object, limit: int = 60) -> str:
    r = repr(x)
    return r if len(r) <= limit else r[: limit - 3] + "..."


def _normalization_hint(x: object, key: Hashable) -> str:
    """Where ``x`` has a key that differs from ``key`` only in its Unicode normal form (``'é'`` as one
    code point or as ``e`` and a combining accent: they print the same), says so."""
    if not isinstance(key, str) or not isinstance(x, Mapping):
        return ""
    want = unicodedata.normalize("NFC", key)
    same = [k for k in x if isinstance(k, str) and unicodedata.normalize("NFC", k) == want]
    if not same:
        return ""
    return (f"; it has {ascii(same[0])}, which prints the same but is another Unicode form of the key asked for, "
            f"{ascii(key)}: normalize both with unicodedata.normalize('NFC', ...)")


def _attribute_hint(x: object, key: Hashable) -> str:
    """A hint for reading ``key`` of ``x`` by subscript where ``x`` has it as an attribute (a
    dataclass, a namedtuple, an object): Fold's blocks read items, as ``x[key]``."""
    if not isinstance(key, str) or not hasattr(x, key):
        return ""
    convert = ("fd.InputTransform(dataclasses.asdict)" if dataclasses.is_dataclass(x)
               else "fd.InputTransform(lambda e: e._asdict())" if hasattr(x, "_asdict") else None)
    how = f"convert it first with {convert}, or " if convert else ""
    return f"; it has an attribute {key!r}, but blocks read items (x[key]): {how}read it with " \
           f"fd.InputTransform(lambda e: e.{key})"


class Pipe(Block):
    """``Pipe(a, b, c)`` is ``a >> b >> c``: feeds each block's output to the next.

    Examples:
        >>> import fold as fd
        >>> float((fd.Scalar() >> fd.Function(lambda x: 2 * x)).eval(3))
        6.0
    """

    def __init__(self, *blocks: BlockLike, name: str | None = None):
        if not blocks:
            from fold.blocks.inputs import Identity

            blocks = (Identity(),)  # ``Pipe()`` is the identity, as in Fold
        super().__init__(name)
        self._blocks = [self._adopt(b) for b in blocks]
        # A pipe of leaves is a leaf: the walk calls it instead of driving a generator
        # (``a >> b >> c`` nests pipes, so whole chains of leaves fold into one).
        self._leaf = all(b._leaf for b in self._blocks)

    def children(self) -> list[Block]:
        return list(self._blocks)

    def stages(self, open_named: bool = True) -> list[Block]:
        """The blocks this pipe runs in order, the pipes nested in it (one per ``>>``) opened, named
        ones too unless ``open_named`` is False; without recursion, as a chain of a thousand ``>>``
        is a thousand nested pipes."""
        out: list[Block] = []
        stack = list(reversed(self._blocks))
        while stack:
            b = stack.pop()
            if isinstance(b, Pipe) and (open_named or not b.name):
                stack.extend(reversed(b._blocks))
            else:
                out.append(b)
        return out

    def _host_leaf(self, x: HostValue, ctx: HostContext) -> HostValue:
        for b in ctx.steps(self):
            x = run_leaf(b, x, ctx)
        return x

    def _infer(self) -> None:
        blocks = self._blocks
        unify(self, "input", blocks[0], "input")
        for a, b in zip(blocks, blocks[1:]):
            unify(a, "output", b, "input")
        unify(blocks[-1], "output", self, "output")

    def _host(self, x: HostValue, ctx: HostContext) -> HostWalk:
        for b in ctx.steps(self):
            x = run_leaf(b, x, ctx) if b._leaf else (yield b, x, None)
        return x

    def _emit(self, em: EmitContext, x: str) -> str:
        for b in em.steps(self):
            x = em.emit(b, x)
        return x


def _is_key(k: object) -> bool:
    return isinstance(k, (int, str, slice)) and not isinstance(k, bool)


def _record_fields(named_children: BlockLike) -> list[tuple[Hashable, BlockLike]]:
    if isinstance(named_children, OrderedDict):
        return list(named_children.items())
    if isinstance(named_children, dict):
        try:
            keys = sorted(named_children)
        except TypeError as e:
            raise TypeError(f"Record keys must be sortable, got {list(named_children)!r}") from e
        return [(k, named_children[k]) for k in keys]
    if isinstance(named_children, (tuple, list)):
        fields = []
        for i, item in enumerate(named_children):
            if (isinstance(item, tuple) and len(item) == 2 and _is_key(item[0])
                    and is_block_like(item[1])):
                fields.append(item)
            else:
                fields.append((i, item))
        return fields
    raise TypeError(f"Record needs a dict or a sequence of blocks, got {named_children!r}")


class Record(Block):
    """Applies a child block to each field of its input; outputs the tuple of results.

    ``Record({'a': a, 'b': b})`` maps ``x`` to ``(a(x['a']), b(x['b']))`` (dict
    keys sorted; an ``OrderedDict`` keeps its order); ``Record((a, b))`` maps
    ``x`` to ``(a(x[0]), b(x[1]))``. On a tuple-typed input the keys must be
    ints or slices.
    """

    def __init__(self, named_children: BlockLike, name: str | None = None):
        super().__init__(name)
        self._plain_dict = isinstance(named_children, dict) and not isinstance(named_children, OrderedDict)
        self._fields = [(k, self._adopt(b)) for k, b in _record_fields(named_children)]
        # Error-path labels, fixed per field (formatted only when an error needs them).
        self._labels = [(f"{type(self).__name__}[{{!r}}]", k) for k, _ in self._fields]

    @property
    def keys(self) -> list[Hashable]:
        return [k for k, _ in self._fields]

    def children(self) -> list[Block]:
        return [b for _, b in self._fields]

    def __getitem__(self, key: Hashable) -> Block:
        """The output of the field ``key`` (a key of the record, as in Fold), else item ``key`` of the
        output tuple."""
        keys = self.keys
        return super().__getitem__(keys.index(key) if key in keys and not isinstance(key, slice) else key)

    def _check_input(self, t: Type) -> None:
        if isinstance(t, TupleType):
            for k, _ in self._fields:
                if not isinstance(k, (int, slice)):
                    raise TypeError(f"{self!r} has key {k!r}, which cannot index a tuple input {t}")
                if isinstance(k, int) and not -len(t) <= k < len(t):
                    raise TypeError(f"{self!r} has key {k}, out of range for input {t}")
        elif not isinstance(t, PyObjectType):
            raise TypeError(f"{self!r} takes a PyObject or a tuple, not {t}")

    def _infer(self) -> None:
        fields = self._fields
        t = self.input_type
        for k, b in fields:
            if isinstance(t, PyObjectType):
                set_child(self, t, b, "input", f"field {k!r}")
            elif isinstance(t, TupleType):
                assert isinstance(k, (int, slice))  # _check_input: a tuple's record has int or slice keys
                set_child(self, t[k], b, "input", f"field {k!r}")
        outs = [b.output_type for _, b in fields]
        if all(o is not None for o in outs):
            set_child(self, TupleType(*outs), self, "output", "output")
        elif isinstance(self.output_type, TupleType) and len(self.output_type) == len(fields):
            for (k, b), o in zip(fields, self.output_type):
                set_child(self, o, b, "output", f"field {k!r}")

    def _host(self, x: HostValue, ctx: HostContext) -> HostWalk:
        out = []
        for (k, b), label in zip(self._fields, self._labels):
            try:
                v = x[k]
            except KeyError:
                raise KeyError(f"{self!r} found no key {k!r} in {_short(x)}{_normalization_hint(x, k)}") from None
            except IndexError:
                raise TypeError(f"{self!r} found no item {k!r} in {_short(x)}") from None
            except TypeError as e:
                raise TypeError(f"{self!r} cannot read key {k!r} of {type(x).__name__} {_short(x)}: {e}"
                                f"{_attribute_hint(x, k)}") from None
            out.append(run_leaf(b, v, ctx, label) if b._leaf else (yield b, v, label))
        return tuple(out)

    def _emit(self, em: EmitContext, x: str) -> str:
        return em.tuple([em.emit(b, em.assign(f"{x}[{em.literal(k)}]")) for k, b in self._fields])


class AllOf(Block):
    """Runs every block on the same input: ``AllOf(a, b)(x) == (a(x), b(x))``."""

    def __init__(self, *blocks: BlockLike, name: str | None = None):
        super().__init__(name)
        self._blocks = [self._adopt(b) for b in blocks]
        if not self._blocks:
            self.set_output_type(VoidType())

    def children(self) -> list[Block]:
        return list(self._blocks)

    def _infer(self) -> None:
        blocks = self._blocks
        if not blocks:
            return
        for b in blocks:
            unify(self, "input", b, "input")
        outs = [b.output_type for b in blocks]
        if all(o is not None for o in outs):
            set_child(self, TupleType(*outs), self, "output", "output")

    def _host(self, x: HostValue, ctx: HostContext) -> HostWalk:
        if not self._blocks:
            return None
        out = []
        for i, b in enumerate(self._blocks):
            out.append(run_leaf(b, x, ctx, ("AllOf[{}]", i)) if b._leaf else (yield b, x, ("AllOf[{}]", i)))
        return tuple(out)

    def _emit(self, em: EmitContext, x: str) -> str:
        if not self._blocks:
            return em.assign("None")
        return em.tuple([em.emit(b, x) for b in self._blocks])


def _item_type(owner: Block, t: Type, key: Hashable) -> Type | None:
    if isinstance(t, PyObjectType):
        return t
    if isinstance(t, TupleType):
        if isinstance(key, slice):
            return t[key]
        if not isinstance(key, int) or not -len(t) <= key < len(t):
            raise TypeError(f"{owner!r} cannot take item {key!r} of {t}")
        return t[key]
    if isinstance(t, SequenceType) and not isinstance(t, BroadcastSequenceType):
        if isinstance(key, slice):
            return t
        if isinstance(key, int):
            return t.element_type
    raise TypeError(f"{owner!r} cannot take item {key!r} of {t}")


class GetItem(Block):
    """``x[key]`` on a PyObject, tuple or (finite) sequence; KeyError if missing."""

    _leaf = True

    def __init__(self, key: Hashable, name: str | None = None):
        self.key = key
        super().__init__(name)

    def _path_name(self) -> str:
        return f"GetItem[{self.key!r}]"

    def _check_input(self, t: Type) -> None:
        _item_type(self, t, self.key)

    def _infer(self) -> None:
        if self.input_type is not None:
            out = _item_type(self, self.input_type, self.key)
            if out is not None:
                unify_type(self, out)

    def _host_leaf(self, x: HostValue, ctx: HostContext) -> HostValue:
        try:
            return x[self.key]
        except (KeyError, IndexError):
            raise KeyError(f"{self!r} found no key {self.key!r} in {_short(x)}"
                           f"{_normalization_hint(x, self.key)}") from None
        except TypeError as e:
            raise TypeError(f"{self!r} cannot read key {self.key!r} of {type(x).__name__}: {e}"
                            f"{_attribute_hint(x, self.key)}") from None

    def _emit(self, em: EmitContext, x: str) -> str:
        return em.item(x, self.key)


def unify_type(block: Block, out: Type) -> None:
    """Sets ``block``'s output type to ``out``, raising a TypeError on conflict."""
    if block.output_type is None:
        block.set_output_type(out)
    elif block.output_type != convert_to_type(out):
        raise TypeError(f"{block!r} produces {convert_to_type(out)} but its output type is {block.output_type}")


class Slice(Block):
    """Python slicing of a sequence, tuple or PyObject: ``x[start:stop:step]``.

    Examples:
        >>> import fold as fd
        >>> [float(v) for v in (fd.Map(fd.Scalar()) >> fd.Slice(step=-1)).eval([1, 2, 3])]
        [3.0, 2.0, 1.0]
    """

    _leaf = True

    def __init__(self, *args: object, start: int | None = None, stop: int | None = None,
                 step: int | None = None, name: str | None = None):
        if args:
            raise TypeError("Slice takes keyword arguments only: Slice(start=, stop=, step=)")
        if step == 0:  # Python raises this only when the first example is sliced
            raise ValueError("Slice step cannot be zero")
        self.key = slice(start, stop, step)
        super().__init__(name)

    def _check_input(self, t: Type) -> None:
        if isinstance(t, BroadcastSequenceType) or not isinstance(t, (SequenceType, TupleType, PyObjectType)):
            raise TypeError(f"{self!r} cannot slice {t}")
        if not isinstance(t, PyObjectType):  # a PyObject may take other keys (labels, dates)
            for bound in (self.key.start, self.key.stop, self.key.step):
                if bound is not None and not hasattr(type(bound), "__index__"):
                    raise TypeError(f"{self!r} slices {t} by position: start, stop and step must be ints or "
                                    f"None, got {bound!r}")

    def _infer(self) -> None:
        t = self.input_type
        if t is not None:
            unify_type(self, t[self.key] if isinstance(t, TupleType) else t)

    def _host_leaf(self, x: HostValue, ctx: HostContext) -> HostValue:
        try:
            return x[self.key]
        except TypeError as e:
            raise TypeError(f"{self!r} cannot slice {type(x).__name__}: {e}") from None

