"""fold: dynamic batching and typed block combinators for JAX.

Examples:
    >>> import fold as fd, jax
    >>> model = fd.Map(fd.Scalar()) >> fd.Sum()
    >>> compiler = fd.Compiler.create(model)
    >>> params = compiler.init(jax.random.key(0))
    >>> compiler.apply(params, compiler.build_batch([[1, 2, 3], [4]])).outputs.tolist()
    [6.0, 4.0]
"""

from fold.blocks.base import Block, convert_to_block
from fold.blocks.cells import BinaryTreeLSTMCell, GRUCell, LSTMCell
from fold.blocks.composition import Composition
from fold.blocks.control import ForwardDeclaration, Metric, OneOf
from fold.blocks.inputs import (
    FromTensor,
    Identity,
    InputTransform,
    OneHot,
    OneHotFromList,
    Optional,
    Scalar,
    Tensor,
    Vector,
    Void,
    Zeros,
)
from fold.blocks.layers import FC, Dropout, Embedding, Layer
from fold.blocks.plumbing import AllOf, GetItem, Pipe, Record, Slice
from fold.blocks.protobuf import ProtoMessageToTree, SerializedMessageToTree
from fold.blocks.sequences import (
    RNN,
    Broadcast,
    Fold,
    Length,
    Map,
    Max,
    Mean,
    Min,
    NGrams,
    Nth,
    Reduce,
    Softmax,
    Sum,
    Zip,
    ZipWith,
)
from fold.blocks.sharing import Shared
from fold.blocks.tensors import Concat, Function
from fold.blocks.types import (
    BroadcastSequenceType,
    PyObjectType,
    SequenceType,
    TensorType,
    TupleType,
    Type,
    VoidType,
    convert_to_type,
)
from fold.checkpoint import checkpoint_metadata, load_checkpoint, save_checkpoint
from fold.compiler.compiler import Compiler
from fold.compiler.result import MetricValues, Result
from fold.compiler.sharding import ShardedBatch
from fold.compiler.stats import CompilerStats
from fold.cores import reserve_host_cores
from fold.generation.generator import Generator
from fold.generation.sequence import Generated, SequenceDecoder
from fold.generation.tree import GeneratedTrees, TreeDecoder
from fold.host_memory import keep_host_memory
from fold.schedule_plot import plot_schedule, schedule_profile
from fold.scheduler.batch import Batch, BatchLayout, BatchStats
from fold.scheduler.records import RecordedExamples
from fold.trainer import FitResult, Trainer, TrainState
from fold.visualize import visualize

__version__ = "0.1.0"

__all__ = [
    "AllOf", "Batch", "BatchLayout", "BatchStats", "BinaryTreeLSTMCell", "Block", "Broadcast",
    "BroadcastSequenceType", "Compiler", "CompilerStats", "Composition", "Concat", "Dropout", "Embedding", "FC",
    "FitResult", "Fold", "ForwardDeclaration", "FromTensor", "Function", "GRUCell", "Generated", "GeneratedTrees",
    "Generator", "GetItem", "Identity", "InputTransform", "LSTMCell", "Layer", "Length", "Map", "Max", "Mean",
    "Metric", "MetricValues", "Min", "NGrams", "Nth", "OneHot", "OneHotFromList", "OneOf", "Optional", "Pipe",
    "ProtoMessageToTree", "PyObjectType", "RNN", "Record", "RecordedExamples", "Reduce", "Result", "Scalar",
    "SequenceDecoder", "SequenceType", "SerializedMessageToTree", "ShardedBatch", "Shared", "Slice", "Softmax", "Sum",
    "Tensor", "TensorType", "TrainState", "Trainer", "TreeDecoder", "TupleType", "Type", "Vector", "Void", "VoidType",
    "Zeros",
    "Zip", "ZipWith", "checkpoint_metadata", "convert_to_block", "convert_to_type", "keep_host_memory",
    "load_checkpoint", "plot_schedule", "reserve_host_cores", "save_checkpoint", "schedule_profile", "visualize",
]
