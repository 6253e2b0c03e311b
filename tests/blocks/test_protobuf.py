"""Protocol buffer inputs, as in Fold: messages become dicts and lists, enums {name, index, number}."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fold as fd

descriptor_pb2 = pytest.importorskip("google.protobuf.descriptor_pb2")


def _file() -> object:
    """A FileDescriptorProto: nested messages, repeated fields, enums and an unset submessage."""
    f = descriptor_pb2.FileDescriptorProto(name="tree.proto", package="p")
    tree = f.message_type.add(name="Tree")
    tree.field.add(name="value", number=1, type=2, label=1)
    tree.field.add(name="kids", number=2, type=11, label=3, type_name=".p.Tree")
    leaf = f.message_type.add(name="Leaf")
    leaf.field.add(name="word", number=1, type=9, label=1)
    return f


def test_a_message_becomes_dicts_and_lists():
    tree = fd.ProtoMessageToTree().eval(_file())
    assert tree["name"] == "tree.proto" and tree["package"] == "p"
    assert tree["options"] is None  # an unset submessage
    assert tree["dependency"] == []  # an empty repeated field
    fields = tree["message_type"][0]["field"]
    assert [f["name"] for f in fields] == ["value", "kids"]
    assert fields[0]["type"] == {"name": "TYPE_FLOAT", "index": 1, "number": 2}
    assert fields[1]["label"] == {"name": "LABEL_REPEATED", "index": 1, "number": 3}  # declared second
    assert fields[0]["json_name"] == ""  # unset scalars have their default


def test_serialized_messages_by_class_or_name_feed_a_model():
    """Per message type of the file, its fields' types embedded and summed: a model over protos."""
    embed = fd.Embedding(20, 3, name="types")
    data = _file().SerializeToString()
    for source in (descriptor_pb2.FileDescriptorProto, "google.protobuf.FileDescriptorProto"):
        per_field = fd.GetItem("type") >> fd.GetItem("number") >> fd.Scalar("int32") >> embed
        model = fd.Map(fd.GetItem("field") >> fd.Map(per_field) >> fd.Sum()) >> fd.Sum()
        block = fd.SerializedMessageToTree(source) >> fd.GetItem("message_type") >> model
        compiler = fd.Compiler.create(block)
        params = compiler.init(jax.random.key(0))
        out = compiler.apply(params, compiler.build_batch([data, data])).outputs
        table = params["types"]["table"]
        np.testing.assert_allclose(out, jnp.stack([table[2] + table[11] + table[9]] * 2), rtol=1e-6)
    assert repr(fd.SerializedMessageToTree("google.protobuf.FileDescriptorProto")) == \
        "SerializedMessageToTree(google.protobuf.FileDescriptorProto)"


def test_bad_message_types_and_inputs():
    with pytest.raises(KeyError, match="no message type 'no.such.Message' is known"):
        fd.SerializedMessageToTree("no.such.Message")
    with pytest.raises(TypeError, match="needs a message class or name"):
        fd.SerializedMessageToTree(42)
    compiler = fd.Compiler.create(fd.ProtoMessageToTree() >> fd.GetItem("number") >> fd.Scalar())
    with pytest.raises(TypeError, match="example 0: at ProtoMessageToTree: expected a protocol buffer message"):
        compiler.build_batch([{"number": 3}])
