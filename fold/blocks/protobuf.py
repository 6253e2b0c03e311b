"""Protocol buffer inputs: messages become the nested dicts and lists the other blocks take.

As in TensorFlow Fold (``ProtoMessageToTree``, ``SerializedMessageToTree``): scalar fields become
Python numbers, strings and bytes (their default when unset), repeated fields lists, map fields
dicts, submessages dicts (None when unset), and enum values dicts ``{"name", "index",
"number"}``. Needs the ``protobuf`` package (``pip install "fold-jax[protobuf]"``), imported when used.

Examples:
    >>> import fold as fd
    >>> from google.protobuf import descriptor_pb2
    >>> field = descriptor_pb2.FieldDescriptorProto(name="x", number=3, type=2)
    >>> tree = fd.ProtoMessageToTree().eval(field)
    >>> tree["name"], tree["number"], tree["type"]
    ('x', 3, {'name': 'TYPE_FLOAT', 'index': 1, 'number': 2})
"""

from __future__ import annotations

from typing import Any, TypeAlias

from fold.blocks.inputs import InputTransform
from fold.typing import PyObject

__all__ = ["ProtoMessageToTree", "SerializedMessageToTree", "message_to_tree"]

Proto: TypeAlias = Any
"""A protocol buffer message, message class or field descriptor (``google.protobuf``, optional)."""


def message_to_tree(message: Proto) -> dict[str, PyObject]:
    """The fields of a protocol buffer ``message`` as nested dicts and lists (see the module)."""
    if not hasattr(message, "DESCRIPTOR") or not hasattr(message, "ListFields"):
        raise TypeError(f"expected a protocol buffer message, got {type(message).__name__}")
    out: dict[str, PyObject] = {}
    for field in message.DESCRIPTOR.fields:
        value = getattr(message, field.name)
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            value_field = field.message_type.fields_by_name["value"]
            out[field.name] = {k: _value(value_field, v) for k, v in value.items()}
        elif _repeated(field):
            out[field.name] = [_value(field, v) for v in value]
        elif field.message_type is not None:
            out[field.name] = message_to_tree(value) if message.HasField(field.name) else None
        else:
            out[field.name] = _value(field, value)
    return out


def _repeated(field: Proto) -> bool:
    # ``is_repeated`` in newer protobuf releases, where ``label`` is gone; ``label`` in older ones.
    flag = getattr(field, "is_repeated", None)
    return bool(flag) if flag is not None else field.label == field.LABEL_REPEATED


def _value(field: Proto, value: PyObject) -> PyObject:
    if field.message_type is not None:
        return message_to_tree(value)
    if field.enum_type is not None:
        enum = field.enum_type.values_by_number[value]
        return {"name": enum.name, "index": enum.index, "number": enum.number}
    return value


class ProtoMessageToTree(InputTransform):
    """A protocol buffer message → nested dicts and lists (see ``fold/blocks/protobuf.py``)."""

    def __init__(self, name: str | None = None):
        super().__init__(message_to_tree, name=name)

    def __repr__(self) -> str:
        return "ProtoMessageToTree"


class SerializedMessageToTree(InputTransform):
    """Serialized bytes of a ``message_type`` message → nested dicts and lists.

    ``message_type`` is the message class, or its full name (``"my.package.Tree"``) as the
    default symbol database knows it (import the generated ``_pb2`` module first).
    """

    def __init__(self, message_type: Proto | str, name: str | None = None):
        if isinstance(message_type, str):
            from google.protobuf import symbol_database

            try:
                message_type = symbol_database.Default().GetSymbol(message_type)
            except KeyError:
                raise KeyError(f"SerializedMessageToTree: no message type {message_type!r} is known; "
                               "import its generated _pb2 module, or pass the message class") from None
        if not hasattr(message_type, "FromString"):
            raise TypeError(f"SerializedMessageToTree needs a message class or name, got {message_type!r}")
        self.message_type = message_type
        super().__init__(lambda data: message_to_tree(message_type.FromString(data)), name=name)

    def __repr__(self) -> str:
        return f"SerializedMessageToTree({self.message_type.DESCRIPTOR.full_name})"
