"""The host plan: a block tree compiled once into straight-line Python.

``walk`` interprets blocks per node: every block run costs a generator
step or a ``run_leaf`` round trip, and that plumbing was most of the host
time. At ``Compiler.create`` the plan instead asks every block to *emit*
the Python that does its host work (``Block._emit``): a ``Pipe`` becomes
consecutive statements, a ``Record`` a tuple of item reads, a ``OneOf`` an
``if`` chain, an operation call its recording statements inlined, and a
``ForwardDeclaration`` one generated function per
declaration, so a tree costs one Python call per recursion level. Blocks
that emit nothing special run their ``_host_leaf`` (leaves) or ``walk``
(composites) from the generated code, so every block works in a plan.

The generated code runs the blocks in exactly the walk's order, so a
batch gets the same ids, nodes and metric order either way. It does not
format errors and it recurses in Python: ``BatchBuilder.run`` rolls an
example back and re-walks it when the plan raises (``walk`` then raises
the error with the example index and block path) or when the recursion
gets deeper than ``MAX_PLAN_DEPTH`` (``walk`` keeps its own stack). User
functions of a failing example (``InputTransform``, ``OneOf`` keys) may
therefore run twice.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import weakref
from collections.abc import Callable, Hashable, Iterator, Sequence
from typing import TYPE_CHECKING, TypeAlias, cast

from fold.blocks.base import Block
from fold.blocks.control import ForwardDeclaration
from fold.blocks.host import Arm, ConstValue, HostValue, OpBlock, Step
from fold.blocks.types import TensorType, TupleType, Type, fold_type
from fold.scheduler.program import Program
from fold.scheduler.walk import walk
from fold.typing import PyObject

if TYPE_CHECKING:
    from fold.scheduler.builder import BatchBuilder

PlanEntries: TypeAlias = tuple[Callable[[PyObject, int], HostValue], list[Callable[[HostValue], HostValue]],
                               list[Callable[[ConstValue], int]], Callable[[], None]]
"""A plan bound to one builder: ``(run, callers, constant makers, release)`` (``HostPlan.bind``)."""

__all__ = ["HostPlan", "Emitter", "TooDeep", "MAX_PLAN_DEPTH", "host_plan", "leaf_paths"]

# Recursion levels (ForwardDeclaration calls) one plan call may nest; each is
# one Python frame, so this stays well inside Python's default limit of 1000.
MAX_PLAN_DEPTH = 200


def leaf_paths(t: Type) -> list[tuple[int, ...]]:
    """Index paths (``(1, 0)`` for ``x[1][0]``) of the tensor ids in a host value of type ``t``, in order."""
    return fold_type(t, lambda _: [()], lambda _, items: [(i, *p) for i, paths in enumerate(items) for p in paths],
                     lambda *_: [], lambda _: [])


def _subscript(path: tuple[int, ...]) -> str:
    """Source text reading ``path`` (see ``leaf_paths``): ``"[1][0]"``."""
    return "".join(f"[{k}]" for k in path)


def _tuple_expr(items: list[str]) -> str:
    return "(" + "".join(f"{item}, " for item in items) + ")"


def value_expr(t: Type, first: str, leaf: Callable[[str], str] = lambda e: e,
               tup: Callable[[list[str]], str] = _tuple_expr,
               void: Callable[[], str] = lambda: "None", ids: Sequence[int] | None = None) -> str:
    """An expression for the host value of type ``t`` whose tensor ids are ``first, first + 1, ...``,
    or ``first + ids[0], first + ids[1], ...`` (``CompiledOp.out_leaves``: outputs that are one
    value share an id). ``leaf``, ``tup`` and ``void`` make each part from its id expression or
    items (the emitter passes ones that emit statements and return variables)."""
    counter = itertools.count()

    def expr(t: Type) -> str:
        if isinstance(t, TensorType):
            n = next(counter)
            k = n if ids is None else ids[n]
            return leaf(f"{first} + {k}" if k else first)
        if isinstance(t, TupleType):
            return tup([expr(i) for i in t])
        return void()

    return expr(t)


def _const_lines(t: int, value: str, vid: str) -> tuple[str, ...]:
    """Statements recording expression ``value`` as a new constant of arena type ``t`` (its table
    ``table{t}``, its ids ``vids{t}``); they set ``vid`` to its value id."""
    return f"table{t}.append({value})", f"{vid} = len(v_depth)", f"vids{t}.append({vid})", "v_depth.append(0)"


class TooDeep(Exception):
    """The example recurses deeper than the plan's limit: walk it instead."""


class Emitter:
    """Collects generated source; blocks call it from ``Block._emit``.

    Generated statements read the host value from a variable name and
    assign their result to a fresh one, which ``emit`` returns. Everything
    that is not a literal (blocks, keys, functions) is bound by name in the
    generated module's namespace.
    """

    def __init__(self, program: Program):
        self.program = program
        self.namespace: dict[str, object] = {"_walk": walk, "_TooDeep": TooDeep}
        self._bound: dict[int, str] = {}
        self._ids = itertools.count()
        self._lines: list[str] = []
        self._indent = 1
        self._functions: list[list[str]] = []
        self._decl_functions: dict[ForwardDeclaration, str] = {}
        self._block_functions: dict[Block, str] = {}  # ``function``'s, one per block
        self._metrics: dict[str, int] = {}
        self._tuples: dict[str, list[str]] = {}  # variables holding tuples built here -> their items
        # Variables holding value ids made here -> their depth's variable ("0" for a constant), so
        # that a call on them computes its depth without looking it up in ``v_depth``.
        self._depths: dict[str, str] = {}

    # ------------------------------------------------------------ building
    def var(self, prefix: str = "v") -> str:
        """A fresh local variable name."""
        return f"{prefix}{next(self._ids)}"

    def bind(self, obj: object, prefix: str = "k") -> str:
        """A namespace name for ``obj`` (one per object)."""
        name = self._bound.get(id(obj))
        if name is None:
            name = self._bound[id(obj)] = f"_{prefix}{next(self._ids)}"
            self.namespace[name] = obj
        return name

    def line(self, text: str) -> None:
        self._lines.append("    " * self._indent + text)

    @contextlib.contextmanager
    def nested(self) -> Iterator[None]:
        """Indents the lines emitted inside (the body of an ``if`` or ``for``)."""
        self._indent += 1
        try:
            yield
        finally:
            self._indent -= 1

    def literal(self, obj: object) -> str:
        """``obj`` as an expression: ints and strings inline, anything else bound by name."""
        return repr(obj) if type(obj) in (int, str) else self.bind(obj)

    def tuple(self, items: list[str]) -> str:
        """Emits a tuple of the given variables; returns its variable (see ``item``)."""
        v = self.assign("(" + "".join(f"{v}, " for v in items) + ")")
        self._tuples[v] = list(items)
        return v

    def over_list(self, block: Block, x: str, out: str, start: Callable[[], str],
                  step: Callable[[str], str]) -> None:
        """A loop over the elements ``e`` of list ``x``: ``out = start()``, then the
        statement ``step(e)`` per element. Any other ``x`` (a broadcast, a tuple, a
        malformed input) goes to the generic walk of ``block``, which sets ``out``."""
        def loop() -> None:
            self.line(f"{out} = {start()}")
            e = self.var("e")
            self.line(f"for {e} in {x}:")
            with self.nested():
                self.line(step(e))

        self.branches([(f"type({x}) is not list", lambda: self.line(f"{out} = {self.walk_call(block, x)}")),
                       (None, loop)])

    def branches(self, arms: list[Arm]) -> None:
        """``if``/``elif`` arms (``else`` where the condition is None); each arm emits its body."""
        for i, (condition, body) in enumerate(arms):
            self.line("else:" if condition is None else f"{'elif' if i else 'if'} {condition}:")
            with self.nested():
                body()

    def assign(self, expr: str) -> str:
        """Emits ``v = expr`` and returns ``v``."""
        v = self.var()
        self.line(f"{v} = {expr}")
        return v

    # -------------------------------------------------------------- blocks
    def emit(self, block: Step, x: str) -> str:
        """Emits ``block`` run on the value in variable ``x``; returns its result's variable."""
        return block._emit(self, x)

    def leaf(self, block: Step, x: str) -> str:
        """A leaf run through its ``_host_leaf``."""
        return self.assign(f"{self.bind(block._host_leaf, 'h')}({x}, ctx)")

    def walk(self, block: Block, x: str) -> str:
        """A composite block the plan does not know, run by the generic walk."""
        return self.assign(self.walk_call(block, x))

    def walk_call(self, block: Block, x: str) -> str:
        return f"_walk({self.bind(block, 'b')}, {x}, ctx)"

    def steps(self, pipe: Block) -> Sequence[Step]:
        """The blocks ``pipe`` runs (see ``BatchBuilder.steps``)."""
        return self.program.steps(pipe)

    def call(self, block: OpBlock, x: str) -> str:
        """One call of ``block``'s operation on host value ``x``."""
        o = self.program.block_ops[block]
        # Inline: a Python call per node was a tenth of the plan's time.
        args = []
        for path in self.program.ops[o].in_paths:
            a = x
            for k in path:
                a = self.item(a, k)
            args.append(a)
        first, d = self.var("f"), self.var("d")
        for text in self._record_lines(o, args, first, d):
            self.line(text)

        def leaf(e: str) -> str:
            v = e if e == first else self.assign(e)
            self._depths[v] = d
            return v

        op = self.program.ops[o]
        return value_expr(op.spec.out_type, first, leaf=leaf, tup=self.tuple, void=lambda: self.assign("None"),
                          ids=op.out_leaves)

    def item(self, x: str, key: Hashable) -> str:
        """``x[key]``; for a tuple the plan built itself, the element's variable (no lookup at run time)."""
        items = self._tuples.get(x)
        if items is not None and type(key) is int and -len(items) <= key < len(items):
            return items[key]
        return self.assign(f"{x}[{self.literal(key)}]")

    def const(self, ttype: TensorType, value: str) -> str:
        """A new depth-0 constant of ``ttype`` holding the array that expression ``value`` makes
        (``const{t}`` inlined)."""
        v = self.var()
        for text in _const_lines(self.program.type_index[ttype], value, v):
            self.line(text)
        self._depths[v] = "0"
        return v

    def metric(self, name: str, x: str, label: str = "None") -> None:
        """Records tensor ``x`` as an entry of metric ``name``, labeled ``label`` if the metric has
        labels (see ``BatchBuilder.metric``)."""
        i = self._metrics.setdefault(name, len(self._metrics))
        self.line(f"metric_ex{i}.append(ctx.example_index or 0)")
        self.line(f"metric_vid{i}.append({x})")
        if name in self.program.labeled_metrics:
            self.line(f"metric_label{i}.append({label})")

    def recurse(self, decl: ForwardDeclaration, x: str) -> str:
        """A call of ``decl``'s target, generated once as its own function."""
        fn = self._decl_functions.get(decl)
        if fn is None:
            fn = self._decl_functions[decl] = self.var("decl")
            assert decl.target is not None  # build_program refuses unresolved declarations
            self._function(fn, decl.target, check_depth=True)
        return self.assign(f"{fn}({x}, depth + 1)")

    def function(self, block: Block) -> str:
        """The name of a generated function ``f(x, depth)`` running ``block`` on host value ``x``
        (``depth``: the recursion depth of the caller), made once per block."""
        fn = self._block_functions.get(block)
        if fn is None:
            fn = self._block_functions[block] = self.var("fn")
            self._function(fn, block, check_depth=None)
        return fn

    def _function(self, name: str, block: Block, check_depth: bool | None) -> None:
        """Emits ``def name(x, depth)`` running ``block``: a declaration's target checks its
        depth (``check_depth``), the root sets the node limit (False), a block's (None) neither."""
        saved = self._lines, self._indent
        self._lines, self._indent = [], 1
        self.line(f"def {name}(x, depth):")
        with self.nested():
            if check_depth:
                # Deeper than the plan recurses, near the recursion limit or past the node limit (an
                # input that shares sub-objects can unfold into exponentially many calls at a small
                # depth): the walk goes on, or raises.
                self.line(f"if depth > {min(MAX_PLAN_DEPTH, self.program.limits.max_recursion - 1)} or "
                          "len(n_op) > node_limit:")
                with self.nested():
                    self.line("raise _TooDeep")
            elif check_depth is False:
                self.line("nonlocal node_limit")
                self.line(f"node_limit = len(n_op) + {self.program.limits.max_nodes}")
            self.line(f"return {self.emit(block, 'x')}")
        self._functions.append(self._lines)
        self._lines, self._indent = saved

    # ------------------------------------------------------------- source
    def _recorder(self, o: int) -> list[str]:
        """``rec{o}(*input ids)`` records one call of operation ``o`` (see ``BatchBuilder``);
        ``call{o}(x)`` does it for host value ``x``, checking constant inputs first (the walk's
        entry point)."""
        op = self.program.ops[o]
        args = [f"i{j}" for j in range(len(op.in_paths))]
        lines = [f"def rec{o}({', '.join(args)}):"]
        body = self._record_lines(o, args, "first", "d")
        body.append(f"return {value_expr(op.spec.out_type, 'first', ids=op.out_leaves)}")
        caller = [f"def call{o}(x):"]
        if op.check_inputs is not None:
            # The walk checks each call; the plan leaves it to ``schedule``, which checks all at once.
            check = self.bind(op.check_inputs, "check")
            caller += [f"    {', '.join(args)}, = {', '.join('x' + _subscript(p) for p in op.in_paths)},",
                       f"    if {' and '.join(f'v_depth[{a}] == 0' for a in args) or 'True'}:",
                       f"        {check}({', '.join(f'ctx.const_value({a})[None]' for a in args)})",
                       f"    return rec{o}({', '.join(args)})"]
        else:
            caller.append(f"    return rec{o}({', '.join('x' + _subscript(p) for p in op.in_paths)})")
        return lines + ["    " + b for b in body] + caller

    def _record_lines(self, o: int, args: list[str], first: str, d: str) -> list[str]:
        """Statements recording one call of operation ``o`` on the value ids in variables ``args``:
        they set ``d`` (its depth) and ``first`` (its first output's value id)."""
        op = self.program.ops[o]
        n_out = len(op.out_tidx)
        # Distinct depths other than a constant's 0, each known (``_depths``) or looked up.
        depths = list(dict.fromkeys(e for e in (self._depths.get(a, f"v_depth[{a}]") for a in args) if e != "0"))
        if not depths:
            lines = [f"{d} = 1"]
        elif len(depths) == 1:
            lines = [f"{d} = {depths[0]} + 1"]
        else:
            lines = [f"{d} = max({', '.join(depths)}) + 1"]
        lines += [f"n_op.append({o})", f"n_depth.append({d})", f"{first} = len(v_depth)", f"n_first.append({first})"]
        if args:
            lines.append(f"n_inputs.append({args[0]})" if len(args) == 1 else f"n_inputs.extend(({', '.join(args)}))")
        # A tuple display: ``[d] * n`` made a list that cost a multi-output call (the Tree-LSTM
        # cell's) a fifth of its recording time.
        lines.append(f"v_depth.append({d})" if n_out == 1 else f"v_depth.extend(({f'{d}, ' * n_out}))")
        return lines

    @staticmethod
    def _const_maker(t: int) -> list[str]:
        """``const{t}(value)``: a new constant of arena type ``t`` (see ``BatchBuilder.const``)."""
        return [f"table{t}, vids{t} = consts[{t}], const_vids[{t}]", f"def const{t}(value):",
                *("    " + text for text in _const_lines(t, "value", "vid")), "    return vid"]

    def source(self, root: Block) -> str:
        """The module: ``_make(ctx)`` returns ``(run, callers, constant makers, release)`` bound to
        one builder; ``release()`` ends that binding."""
        self._function("run", root, check_depth=False)
        out = ["def _make(ctx):", "    node_limit = 0"]
        for field in ("v_depth", "n_op", "n_depth", "n_first", "n_inputs", "consts", "const_vids"):
            out.append(f"    {field} = ctx.{field}")
        for i, name in enumerate(self._metrics):
            out.append(f"    metric_ex{i} = ctx.metric_examples[{name!r}]")
            out.append(f"    metric_vid{i} = ctx.metric_values[{name!r}]")
            if name in self.program.labeled_metrics:
                out.append(f"    metric_label{i} = ctx.metric_labels[{name!r}]")
        # Every operation and type gets one: the walk records through them too.
        for o in range(len(self.program.ops)):
            out += ["    " + s for s in self._recorder(o)]
        for t in range(len(self.program.types)):
            out += ["    " + s for s in self._const_maker(t)]
        for fn in self._functions:
            out += fn
        # Recursive functions refer to themselves through closure cells: clearing those cells
        # breaks the cycles, so one builder's plan is freed by reference counting.
        out.append("    def release():")
        decls = list(self._decl_functions.values())
        if decls:
            out += [f"        nonlocal {', '.join(decls)}", f"        {' = '.join(decls)} = None"]
        else:
            out.append("        pass")
        callers = ", ".join(f"call{o}" for o in range(len(self.program.ops)))
        makers = ", ".join(f"const{t}" for t in range(len(self.program.types)))
        out.append(f"    return run, [{callers}], [{makers}], release")
        return "\n".join(out) + "\n"


class HostPlan:
    """A model's compiled host walk; ``bind(builder)`` gives its entry points for one batch."""

    def __init__(self, program: Program):
        em = Emitter(program)
        self.source = em.source(program.root)
        namespace = em.namespace
        exec(compile(self.source, "<fold host plan>", "exec"), namespace)  # noqa: S102 (generated)
        # The generated module's entry point (``Emitter.source``).
        self._make = cast("Callable[[BatchBuilder], PlanEntries]", namespace["_make"])

    def bind(self, builder: BatchBuilder) -> PlanEntries:
        """``(run, callers, makers, release)`` writing to ``builder``: ``run(x, 0)`` records one
        example, ``callers[o](x)`` one call of operation ``o``, ``makers[t](value)`` one constant of
        type ``t``; ``release()`` breaks the reference cycles between them once recording is done."""
        return self._make(builder)


_plans: weakref.WeakKeyDictionary[Program, HostPlan] = weakref.WeakKeyDictionary()
_plans_lock = threading.Lock()


def _after_fork_in_child() -> None:
    """Another thread may have held the lock at the fork; a forked worker has only the forking thread."""
    global _plans_lock
    _plans_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def host_plan(program: Program) -> HostPlan:
    """``program``'s host plan, generated on first use and kept as long as the program lives.

    A ``Program`` is plain data; its plan is derived from it. Batches are built on
    background threads too, so the first use is under a lock (the plan is made once).
    """
    with _plans_lock:
        plan = _plans.get(program)
        if plan is None:
            plan = _plans[program] = HostPlan(program)
        return plan
