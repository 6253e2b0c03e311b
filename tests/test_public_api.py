"""The public names: ``fold.__all__`` is pinned, each name is importable, and documented."""

from __future__ import annotations

import inspect
import pathlib

import fold

PUBLIC = [
    "AllOf", "Batch", "BatchLayout", "BatchStats", "BinaryTreeLSTMCell", "Block", "Broadcast",
    "BroadcastSequenceType", "Compiler", "CompilerStats", "Composition", "Concat", "Dropout", "Embedding", "FC",
    "FitResult", "Fold", "ForwardDeclaration", "FromTensor", "Function", "GRUCell", "Generated", "GeneratedTrees",
    "Generator", "GetItem", "Identity",
    "InputTransform", "LSTMCell", "Layer", "Length", "Map", "Max", "Mean", "Metric", "MetricValues", "Min",
    "NGrams", "Nth", "OneHot", "OneHotFromList", "OneOf", "Optional", "Pipe", "ProtoMessageToTree", "PyObjectType",
    "RNN", "Record", "RecordedExamples", "Reduce", "Result", "Scalar", "SequenceDecoder", "SequenceType",
    "SerializedMessageToTree",
    "ShardedBatch", "Shared", "Slice", "Softmax", "Sum", "Tensor", "TensorType", "TrainState", "Trainer", "TreeDecoder",
    "TupleType", "Type",
    "Vector", "Void", "VoidType", "Zeros", "Zip", "ZipWith", "convert_to_block", "convert_to_type",
    "checkpoint_metadata", "keep_host_memory", "load_checkpoint", "plot_schedule", "reserve_host_cores",
    "schedule_profile", "save_checkpoint", "visualize",
]


def test_all_is_pinned():
    """Adding or dropping a public name is a decision: update this list (and docs/api.md) with it."""
    assert sorted(fold.__all__) == sorted(PUBLIC)
    assert len(set(fold.__all__)) == len(fold.__all__)


def test_every_public_name_exists_and_has_a_docstring():
    for name in fold.__all__:
        obj = getattr(fold, name)
        assert inspect.getdoc(obj), f"fold.{name} has no docstring"


def test_public_compiler_methods_have_docstrings():
    for name in ("create", "for_eval", "init", "build_batch", "record", "batches", "apply", "stats", "max_depth"):
        assert inspect.getdoc(getattr(fold.Compiler, name)), name


def test_the_package_is_typed():
    assert (pathlib.Path(fold.__file__).parent / "py.typed").exists()


def test_the_public_named_tuples_document_their_fields():
    """``help(fd.FitResult)`` showed "Alias for field number 0" for every field."""
    for cls in (fold.FitResult, fold.TrainState, fold.BatchStats, fold.BatchLayout, fold.CompilerStats, fold.Generated,
                fold.GeneratedTrees):
        for field in cls._fields:
            doc = getattr(cls, field).__doc__
            assert doc and not doc.startswith("Alias for field"), f"{cls.__name__}.{field}"
    assert fold.FitResult.stopped.__doc__.startswith('Why it stopped: ``"epochs"``')
    assert fold.TrainState.step.__doc__ == "optimizer steps taken"
