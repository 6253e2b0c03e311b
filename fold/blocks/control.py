"""Control blocks: ``OneOf`` dispatch, ``ForwardDeclaration`` recursion, ``Metric``."""

from __future__ import annotations

import functools
import reprlib
from collections.abc import Callable, Hashable

import numpy as np

from fold.blocks.base import Block, convert_to_block, run_leaf, unify
from fold.blocks.host import BlockLike, EmitContext, HostContext, HostValue, HostWalk
from fold.blocks.types import PyObjectType, TensorType, TupleType, Type, TypeLike, VoidType
from fold.errors import ExplainedTypeError
from fold.typing import PyObject

__all__ = ["OneOf", "ForwardDeclaration", "Metric"]


class OneOf(Block):
    """Dispatches its input to one of ``case_blocks`` by ``key_fn(input)``.

    ``key_fn`` is a callable or a block (run on the host, PyObject output);
    ``case_blocks`` is a dict (or a list of ``(key, block)`` pairs), or a
    tuple/list of blocks indexed by the key. ``pre_block``, if given,
    preprocesses the input before the chosen case. All cases share one
    input type and one output type. A key with no case is a KeyError.
    """

    def __init__(self, key_fn: Callable[[PyObject], Hashable] | Block, case_blocks: BlockLike,
                 pre_block: BlockLike = None, name: str | None = None):
        super().__init__(name)
        if isinstance(case_blocks, dict):
            cases = list(case_blocks.items())
            self._indexed = False
        elif isinstance(case_blocks, (tuple, list)):
            if case_blocks and all(isinstance(c, tuple) and len(c) == 2 and not isinstance(c[0], Block)
                                   and not isinstance(c[0], (tuple, list, dict)) for c in case_blocks):
                cases, self._indexed = list(case_blocks), False
            else:
                cases, self._indexed = list(enumerate(case_blocks)), True
        else:
            raise TypeError(f"OneOf case_blocks must be a dict or a sequence, got {type(case_blocks).__name__}")
        if not cases:
            raise ValueError("OneOf needs at least one case")
        if isinstance(key_fn, Block):
            self.key_block: Block | None = self._adopt(key_fn)
            self.key_fn = None
        elif callable(key_fn):
            self.key_block, self.key_fn = None, key_fn
        else:
            raise TypeError(f"OneOf key_fn must be a callable or a block, got {key_fn!r}")
        self.pre_block = None if pre_block is None else self._adopt(pre_block)
        adopted = [(k, self._adopt(b)) for k, b in cases]  # a layer or function case becomes a block
        self._cases = dict(adopted)
        self._case_list = [b for _, b in adopted]

    def children(self) -> list[Block]:
        extra = [b for b in (self.key_block, self.pre_block) if b is not None]
        return extra + self._case_list

    def _infer(self) -> None:
        if self.key_block is not None:
            unify(self, "input", self.key_block, "input")
            if self.key_block.output_type is None:
                self.key_block.set_output_type(PyObjectType())
        src, side = (self.pre_block, "output") if self.pre_block is not None else (self, "input")
        if self.pre_block is not None:
            unify(self, "input", self.pre_block, "input")
        # The case keys: ``self._cases`` maps each key to its case (indices for a sequence of cases).
        keyed = list(enumerate(self._case_list)) if self._indexed else list(self._cases.items())
        for key, case in keyed:
            self._unify_case(key, functools.partial(unify, src, side, case, "input"))
        for key, case in keyed:
            self._unify_case(key, functools.partial(unify, case, "output", self, "output"))

    def _unify_case(self, key: Hashable, unify_it: Callable[[], None]) -> None:
        """Runs ``unify_it``; a type conflict names the case's key, which the blocks alone do not."""
        try:
            unify_it()
        except ExplainedTypeError as e:
            if id(self) in e.cases:
                raise
            raise ExplainedTypeError(f"{self!r}, in the case for key {key!r}: {e}", e.cases | {id(self)}) from e

    def _case(self, key: Hashable) -> Block:
        try:
            if self._indexed:
                # Python's indexing, as in Fold: a bool picks case 0 or 1 (``key_fn`` often is a test).
                if not isinstance(key, (int, np.integer)):
                    raise KeyError(key)
                case: Block = self._case_list[key]
                return case
            return self._cases[key]
        except (KeyError, IndexError):
            raise KeyError(f"{self!r} has no case for key {key!r}; cases are {list(self._cases)!r}") from None
        except TypeError:
            raise TypeError(f"{self!r}: key {key!r} is unhashable") from None

    def _host(self, x: HostValue, ctx: HostContext) -> HostWalk:
        if self.key_block is not None:
            key = yield self.key_block, x, "OneOf[key]"
        else:
            key = self.key_fn(x)  # type: ignore[misc]
        case = self._case(key)
        if self.pre_block is not None:
            x = yield self.pre_block, x, "OneOf[pre]"
        return run_leaf(case, x, ctx, "OneOf") if case._leaf else (yield case, x, "OneOf")

    def _emit(self, em: EmitContext, x: str) -> str:
        if self.key_block is not None:
            key = em.emit(self.key_block, x)
        else:
            key = em.assign(f"{em.bind(self.key_fn, 'key')}({x})")
        case = em.assign(f"{em.bind(self._case, 'case')}({key})")
        if self.pre_block is not None:
            x = em.emit(self.pre_block, x)
        out = em.var()

        def arm(c: Block) -> Callable[[], None]:
            return lambda: em.line(f"{out} = {em.emit(c, x)}")

        em.branches([(f"{case} is {em.bind(c, 'b')}", arm(c)) for c in self._case_list])
        return out


class ForwardDeclaration(Block):
    """Declares a block before it is defined, for recursive models.

    Call the declaration (``decl()``) to get a reference block, use the
    references to build the model, then ``decl.resolve_to(model)``.

    Examples:
        >>> import fold as fd
        >>> decl = fd.ForwardDeclaration(fd.PyObjectType(), fd.TensorType(()))
        >>> leaf = fd.Scalar()
        >>> pair = fd.Record((decl(), decl())) >> fd.Function(lambda a, b: a + b)
        >>> tree = fd.OneOf(lambda x: isinstance(x, tuple), {False: leaf, True: pair})
        >>> decl.resolve_to(tree)
        >>> float(tree.eval((1, (2, 3))))
        6.0
    """

    _scoped = False
    _refers_to_children = True

    def __init__(self, input_type: TypeLike = None, output_type: TypeLike = None, name: str | None = None):
        self.target: Block | None = None
        self._refs: list[Block] = []
        super().__init__(name, input_type, output_type)

    def __call__(self) -> Block:
        ref = _Reference(self)
        self._refs.append(ref)
        self._listen(ref)
        ref._listen(self)
        ref._infer()
        return ref

    def resolve_to(self, target_block: BlockLike) -> None:
        """Ties the declaration to its definition. The definition may also be used in one other
        place (``decl.resolve_to(expr)`` then ``expr >> fd.FC(3)``, as Fold's calculator does)."""
        if self.target is not None:
            raise ValueError(f"{self!r} is already resolved to {self.target!r}")
        target = convert_to_block(target_block)
        self.target = target
        if target._parent is None:
            target._parent = self  # until a block uses it (Fold's calculator pipes it further)
        self._listen(target)
        self._infer()

    def children(self) -> list[Block]:
        return [] if self.target is None else [self.target]

    def _infer(self) -> None:
        if self.target is not None:
            unify(self, "input", self.target, "input")
            unify(self, "output", self.target, "output")
        for ref in self._refs:
            unify(self, "input", ref, "input")
            unify(self, "output", ref, "output")


class _Reference(Block):
    """A use of a ``ForwardDeclaration``: runs its target."""

    def __init__(self, decl: ForwardDeclaration):
        self.decl = decl
        super().__init__()

    def __repr__(self) -> str:
        return f"{self.decl!r}()"

    def children(self) -> list[Block]:
        return [self.decl]

    def _infer(self) -> None:
        self.decl._infer()

    def _host(self, x: HostValue, ctx: HostContext) -> HostWalk:
        target = self.decl.target
        if target is None:
            raise ValueError(f"{self.decl!r} was never resolved: call resolve_to(block)")
        # A call on an object that an enclosing call of the same declaration is processing would
        # repeat it forever (host work is deterministic): a cyclic input (a list that contains
        # itself), or a recursion that consumes no input (decl() >> Function(f)).
        call = (id(self.decl), id(x))
        if call in ctx.recursing:
            raise ValueError(f"{self.decl!r} is called on an object it is already processing, so it would "
                             f"recurse forever: the input contains itself ({reprlib.repr(x)}), or the recursion "
                             "consumes no input")
        limit = ctx.limits.max_recursion
        if len(ctx.recursing) >= limit:
            raise ValueError(f"{self.decl!r} recurses more than {limit:,} calls deep: raise the limit with "
                             "Compiler.create(max_recursion=...) if the input is meant to be this deep, or check "
                             "that the recursion consumes its input")
        ctx.check_size()
        ctx.recursing.add(call)
        try:
            return (yield target, x, None)
        finally:
            ctx.recursing.discard(call)

    def _emit(self, em: EmitContext, x: str) -> str:
        return em.recurse(self.decl, x)


class Metric(Block):
    """Records its tensor input under ``metric_name``; outputs void.

    Every call in a batch becomes one entry of ``result.metrics[name]``. As in
    Fold, the input may also be a pair ``(tensor, label)``, the label any
    Python object (a node id, a word): ``batch.metric_labels[name]`` then
    holds the labels in the order of ``result.metrics[name].values``.

    Examples:
        >>> import fold as fd, jax
        >>> block = fd.Map(fd.Record((fd.Scalar(), fd.Identity())) >> fd.Metric("bar")) >> fd.Void()
        >>> compiler = fd.Compiler.create(block)
        >>> batch = compiler.build_batch([[(0, "zero"), (1, "one")], [(2, "two")]])
        >>> batch.metric_labels["bar"], compiler.apply({}, batch).metrics["bar"].values.tolist()
        (['zero', 'one', 'two'], [0.0, 1.0, 2.0])
    """

    _leaf = True

    def __init__(self, metric_name: str):
        if not isinstance(metric_name, str) or not metric_name:
            raise ValueError(f"Metric needs a non-empty string name, got {metric_name!r}")
        self.metric_name = metric_name
        super().__init__(None, None, VoidType())

    def __repr__(self) -> str:
        return f"Metric({self.metric_name!r})"

    def _check_input(self, t: Type) -> None:
        value = t[0] if isinstance(t, TupleType) and len(t) == 2 and isinstance(t[1], PyObjectType) else t
        if not isinstance(value, TensorType):
            raise TypeError(f"{self!r} takes a tensor or a pair (tensor, label), not {t}")

    @property
    def labeled(self) -> bool:
        """Whether its input is a pair ``(tensor, label)``."""
        return isinstance(self.input_type, TupleType)

    @property
    def value_type(self) -> TensorType | None:
        """The type of the values it records (its input, or the tensor of its pair)."""
        t = self.input_type
        t = t[0] if isinstance(t, TupleType) else t
        return t if isinstance(t, TensorType) else None

    def _host_leaf(self, x: HostValue, ctx: HostContext) -> None:
        if self.labeled:
            ctx.metric(self.metric_name, x[0], x[1])
        else:
            ctx.metric(self.metric_name, x)
        return None

    def _emit(self, em: EmitContext, x: str) -> str:
        if self.labeled:
            em.metric(self.metric_name, f"{x}[0]", f"{x}[1]")
        else:
            em.metric(self.metric_name, x)
        return "None"

