r"""``visualize(block)``: a block tree as a Graphviz graph, for notebooks and docs.

Each block is a node showing what it is and its types (``float32[3]`` for a tensor, ``[...]`` for
a sequence, ``(..., ...)`` for a tuple, ``obj`` for a Python object); an arrow goes from each
block to the blocks it contains, in order (a pipe's stages, a record's fields, a one-of's cases,
a map's element block), and a dashed arrow from each use of a ``ForwardDeclaration`` back to the
declaration: the recursion. Needs the ``graphviz`` package; the graph's ``source`` is DOT text,
and rendering it (inline SVG in a notebook, ``graph.render(...)``) needs Graphviz's ``dot``
program.

Examples:
    >>> import fold as fd
    >>> graph = fd.visualize(fd.Map(fd.Scalar()) >> fd.Sum())
    >>> [line.strip() for line in graph.source.splitlines()[3:5]]
    ['b0 [label="Pipe\\nobj → float32"]', 'b1 [label="Map\\nobj → [float32]"]']
"""

from __future__ import annotations

import shutil
import warnings
from typing import TYPE_CHECKING

from fold.blocks.base import Block
from fold.blocks.host import BlockLike
from fold.blocks.types import (
    BroadcastSequenceType,
    PyObjectType,
    SequenceType,
    Type,
    VoidType,
    fold_type,
)

if TYPE_CHECKING:
    import graphviz

    from fold.compiler.compiler import Compiler

__all__ = ["visualize", "short_type"]


def short_type(t: Type | None) -> str:
    """A compact spelling of a type: ``float32[3]``, ``[int32]``, ``(float32[2], obj)``, ``void``."""
    if t is None:
        return "?"

    def sequence(s: SequenceType, element: str) -> str:
        return f"[{element}]*" if isinstance(s, BroadcastSequenceType) else f"[{element}]"

    def other(o: Type) -> str:
        return "obj" if isinstance(o, PyObjectType) else "void" if isinstance(o, VoidType) else repr(o)

    return fold_type(t, lambda x: f"{x.dtype}[{', '.join(map(str, x.shape))}]" if x.shape else x.dtype,
                     lambda _, items: f"({', '.join(items)})", sequence, other)


def visualize(block: BlockLike | Compiler, types: bool = True) -> graphviz.Digraph:
    """The block tree of ``block`` as a ``graphviz.Digraph`` (see the module docstring).

    Args:
      block: a block, anything ``convert_to_block`` takes, or a ``Compiler`` (its model).
      types: show each block's input and output types.

    Raises:
      ImportError: the ``graphviz`` package is not installed.
    """
    try:
        import graphviz
    except ImportError as e:
        raise ImportError("fd.visualize needs the graphviz package: pip install graphviz "
                          "(and Graphviz's dot program to render the graph)") from e
    from fold.blocks.base import convert_to_block
    from fold.blocks.control import ForwardDeclaration
    from fold.blocks.plumbing import Pipe
    from fold.compiler.compiler import Compiler

    root = block.program.root if isinstance(block, Compiler) else convert_to_block(block)
    if shutil.which("dot") is None:
        warnings.warn("Graphviz's dot program is not installed, so this graph cannot be drawn (a notebook shows an "
                      "error in its place; graph.source is its DOT text): install Graphviz, e.g. apt install graphviz, "
                      "brew install graphviz or conda install graphviz", RuntimeWarning, stacklevel=2)
    graph = graphviz.Digraph(graph_attr={"rankdir": "TB"}, node_attr={"shape": "box", "fontsize": "10"})
    ids: dict[int, str] = {}

    def add(b: Block) -> str:
        name = ids.get(id(b))
        if name is not None:
            return name
        name = ids[id(b)] = f"b{len(ids)}"
        # "\\n" is DOT's centred line break.
        label = _label(b) + (f"\\n{short_type(b.input_type)} → {short_type(b.output_type)}" if types else "")
        shape = {"shape": "ellipse"} if isinstance(b, ForwardDeclaration) else {}
        graph.node(name, label, **shape)
        keys = _case_keys(b)
        # A chain of ``>>`` is drawn as one pipe with all its stages (named sub-chains as their own).
        for child in b.stages(open_named=False) if isinstance(b, Pipe) else b.children():
            recursion = isinstance(child, ForwardDeclaration) and id(child) in ids
            style = {"style": "dashed", "label": "recurses"} if recursion else {}
            if id(child) in keys:
                style = {**style, "label": f"{style['label']} ({keys[id(child)]})" if style else keys[id(child)]}
            graph.edge(name, add(child), **style)
        return name

    add(root)
    return graph


def _label(b: Block) -> str:
    """What a node says a block is: a layer's class and name (``FC 'encoder'``) rather than the
    ``Function`` around it."""
    from fold.blocks.tensors import Function

    layer = b.layer if isinstance(b, Function) else None
    return f"{type(layer).__name__} {layer.name!r}" if layer is not None else repr(b)


def _case_keys(b: Block) -> dict[int, str]:
    """For a ``OneOf``, each case block's key as an edge label, by the block's id."""
    from fold.blocks.control import OneOf

    if not isinstance(b, OneOf):
        return {}
    return {id(case): repr(key) for key, case in b._cases.items()}
