"""TensorFlow Fold's block_compiler_test.py, case by case, in this library's terms (written anew).

Skipped, with the reason: ``test_init_loom_loom_input_tensor``, ``test_compiler_input_tensor``,
``test_loom_input_tensor`` (the Loom input tensor: batches here are ``Batch`` pytrees built on the
host), and ``InitUninitializedTest`` (TensorFlow variable initialisation: ``compiler.init`` makes
the parameters).
"""

from __future__ import annotations

import numpy as np
import pytest

import fold as fd


def test_init_raises():
    with pytest.raises(TypeError, match="must output tensors, tuples of tensors or void"):
        fd.Compiler.create(fd.Record([]))
    with pytest.raises(TypeError, match="must output tensors"):
        fd.Compiler.create(fd.GetItem("foo"))
    with pytest.raises(TypeError, match="must output tensors"):
        fd.Compiler.create(fd.Map(fd.Scalar()))


def test_register_tensor_types():
    b = fd.Composition()
    with b.scope():
        b.output.reads(b.input[0])
    compiler = fd.Compiler.create(fd.Record((fd.Scalar("int32"), fd.Scalar("float32"))) >> b)
    out = compiler.apply({}, compiler.build_batch([(42, 0.0)])).outputs
    assert out.dtype == np.int32 and out.tolist() == [42]


@pytest.mark.parametrize("workers", [0, 1, 2])
def test_batches_in_order_with_or_without_workers(workers):
    """Fold's test_multiprocessing: every way of building gives every example once, in order unless
    shuffled."""
    compiler = fd.Compiler.create(fd.Scalar())
    assert compiler.apply({}, compiler.build_batch(range(5))).outputs.tolist() == list(range(5))
    batches = list(compiler.batches(range(5), 2, num_workers=workers))
    assert [compiler.apply({}, b).outputs.tolist() for b in batches] == [[0, 1], [2, 3], [4]]
    shuffled = list(compiler.batches(range(5), 2, shuffle=True, seed=0, num_workers=workers))
    values = [v for b in shuffled for v in compiler.apply({}, b).outputs.tolist()]
    assert sorted(values) == list(range(5))
    singles = list(compiler.batches(range(5), 1, num_workers=workers))
    assert [compiler.apply({}, b).outputs.tolist() for b in singles] == [[i] for i in range(5)]
    assert all(b.metric_labels == {} for b in batches)
