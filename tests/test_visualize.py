"""fd.visualize: the block tree as Graphviz DOT, recursion as dashed edges back to the declaration."""

from __future__ import annotations

import re

import pytest

import fold as fd

pytest.importorskip("graphviz")


def test_a_recursive_model_as_a_graph():
    node = fd.ForwardDeclaration(fd.PyObjectType(), fd.TensorType((4,)))
    leaf = fd.Vector(2) >> fd.FC(4)
    pair = fd.Record((node(), node())) >> fd.Concat() >> fd.FC(4)
    node.resolve_to(fd.OneOf(lambda t: isinstance(t, tuple), {False: leaf, True: pair}))
    source = fd.visualize(node() >> fd.FC(1)).source
    labels = dict(re.findall(r'(b\d+) \[label="([^"]*)"', source))
    assert labels["b0"] == r"Pipe\nobj → float32[1]"
    (decl,) = [b for b, label in labels.items() if label.startswith("ForwardDeclaration\\n")]
    assert re.search(rf'{decl} \[label="ForwardDeclaration[^"]*" shape=ellipse\]', source)
    recursions = re.findall(rf"(b\d+) -> {decl} \[label=recurses style=dashed\]", source)
    assert len(recursions) == 2  # both uses inside the pair node
    assert r"Concat\n(float32[4], float32[4]) → float32[8]" in labels.values()
    assert "?" not in "".join(labels.values())  # every type known
    plain = fd.visualize(fd.Scalar(), types=False).source
    assert 'b0 [label=Scalar]' in plain or 'b0 [label="Scalar"]' in plain


def test_a_compiler_draws_its_model():
    """``fd.visualize(compiler)`` was a TypeError ("cannot convert Compiler ... to a block")."""
    model = fd.Map(fd.Vector(2) >> fd.FC(3)) >> fd.Sum()
    compiler = fd.Compiler.create(model)
    assert fd.visualize(compiler).source == fd.visualize(model).source


def test_short_types():
    from fold.visualize import short_type

    t = fd.TupleType(fd.TensorType((2, 3), "int32"), fd.SequenceType(fd.TensorType(())), fd.PyObjectType(),
                     fd.VoidType())
    assert short_type(t) == "(int32[2, 3], [float32], obj, void)"
    assert short_type(None) == "?"
