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


def test_layers_by_name_case_keys_and_one_node_per_chain(monkeypatch):
    """Every layer was drawn as ``Function(FC)``, ``OneOf`` edges had no case keys, and each ``>>``
    was one more nested ``Pipe`` node."""
    import shutil

    monkeypatch.setattr(shutil, "which", lambda name: "/usr/bin/dot")
    chain = fd.Vector(2) >> fd.FC(3, name="encoder") >> fd.FC(3, name="hidden") >> fd.FC(1, name="out")
    model = fd.OneOf(lambda x: x["kind"], {"short": fd.GetItem("v") >> chain, "none": fd.Zeros(fd.TensorType((1,)))})
    source = fd.visualize(model).source
    labels = dict(re.findall(r'^\s*(b\d+) \[label="([^"]*)"', source, re.M))
    assert [lab.split("\\n")[0] for lab in labels.values()] == [
        "OneOf", "Pipe", "GetItem", "Vector", "FC 'encoder'", "FC 'hidden'", "FC 'out'", "Zeros"]
    by_label = {lab.split("\\n")[0]: b for b, lab in labels.items()}
    assert f"b0 -> {by_label['Pipe']} [label=\"'short'\"]" in source
    assert f"b0 -> {by_label['Zeros']} [label=\"'none'\"]" in source
    for stage in ("GetItem", "Vector", "FC 'encoder'", "FC 'hidden'", "FC 'out'"):
        assert f"{by_label['Pipe']} -> {by_label[stage]}" in source  # one pipe holds the whole chain


def test_without_graphviz_dot_a_warning_says_what_to_install(monkeypatch):
    import shutil

    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.warns(RuntimeWarning, match=r"Graphviz's dot program is not installed.*apt install graphviz"):
        graph = fd.visualize(fd.Scalar())
    assert "Scalar" in graph.source
