"""Composition: DAG wiring, tuple picking, and wiring errors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fold as fd


def test_fold_readme_example():
    c = fd.Composition()
    with c.scope():
        x = fd.Vector(3).reads(c.input)
        x_squared = fd.Function(jnp.multiply).reads(x, x)
        ten = fd.FromTensor(10 * np.ones(3, dtype="float32"))
        ten_x = fd.Function(jnp.multiply).reads(ten, x)
        c.output.reads(fd.Function(jnp.add).reads(x_squared, ten_x))
    assert c.input_type == fd.PyObjectType() and c.output_type == fd.TensorType((3,))
    np.testing.assert_allclose(c.eval([1, 2, 3]), [11, 24, 39])


def test_tuple_input_indexing_and_metrics():
    c = fd.Composition()
    with c.scope():
        diff = fd.Function(lambda a, b: (a - b) ** 2).reads(c.input[0], c.input[1])
        fd.Metric("loss").reads(diff)
        c.output.reads(c.input[1])
    block = (fd.Scalar(), fd.Scalar()) >> c
    out, metrics = block.eval((3.0, 1.0))
    assert float(out) == 1.0 and [float(v) for v in metrics["loss"]] == [4.0]


def test_block_getitem_on_tuple_output():
    c = fd.Composition()
    with c.scope():
        pair = fd.Record((fd.Scalar(), fd.Scalar())).reads(c.input)
        c.output.reads(fd.Function(jnp.subtract).reads(pair[1], pair[0]))
    assert float(c.eval((1, 5))) == 4.0


def test_lstm_as_composition_matches_cell_shape():
    c = fd.Composition()
    with c.scope():
        in_state = fd.Identity().reads(c.input[1])
        bx = fd.Concat().reads(c.input[0], in_state[1])
        bi = fd.Function(fd.FC(4, jnp.tanh)).reads(bx)
        bc = fd.Function(lambda c_, i: c_ + i).reads(in_state[0], bi)
        out_state = fd.Identity().reads(bc, bi)
        c.output.reads(bi, out_state)
    block = fd.Map(fd.Vector(2)) >> fd.RNN(c, initial_state=fd.Zeros(((4,), (4,))))
    outs, (cell, h) = block.eval([[1, 2], [3, 4]])
    assert len(outs) == 2 and cell.shape == (4,)


def test_cycle_is_value_error():
    c = fd.Composition()
    with c.scope():
        a = fd.Function(jnp.negative)
        b = fd.Function(jnp.negative).reads(a)
        a.reads(b)
        c.output.reads(b)
    with pytest.raises(ValueError, match="cycle"):
        fd.Compiler.create(fd.Scalar() >> c)


def test_unused_block_is_type_error():
    c = fd.Composition()
    with c.scope():
        x = fd.Scalar().reads(c.input)
        fd.Function(jnp.negative).reads(x)
        c.output.reads(x)
    with pytest.raises(TypeError, match="never read"):
        fd.Compiler.create(c)


def test_an_unread_map_of_metrics_is_told_to_end_with_void():
    def model(metrics: fd.Block) -> fd.Composition:
        c = fd.Composition()
        with c.scope():
            xs = fd.Map(fd.Scalar()).reads(c.input)
            metrics.reads(xs)
            c.output.reads(fd.Sum().reads(xs))
        return c

    with pytest.raises(TypeError, match=r"output \(SequenceType\(VoidType\(\)\)\) is unused; it holds only voids "
                                        r"\(metrics, say\): end it with >> fd.Void\(\)"):
        fd.Compiler.create(model(fd.Map(fd.Metric("m"))))
    compiler = fd.Compiler.create(model(fd.Map(fd.Metric("m")) >> fd.Void()))
    result = compiler.apply(compiler.init(jax.random.key(0)), compiler.build_batch([[1.0, 2.0], [3.0]]))
    np.testing.assert_array_equal(np.asarray(result.metrics["m"].padded)[np.asarray(result.metrics["m"].mask)],
                                  [1.0, 2.0, 3.0])


def test_a_block_that_needs_an_input_but_reads_nothing_is_type_error():
    # It once compiled, and every example then failed "at Scalar: expected a value ..., got None",
    # blaming the data for the wiring.
    for reader in (fd.Scalar(), fd.Map(fd.Scalar()) >> fd.Sum()):
        c = fd.Composition()
        with c.scope():
            c.output.reads(fd.Function(jnp.add).reads(reader, c.input))
        with pytest.raises(TypeError, match=r"in Composition reads nothing, but it takes PyObjectType\(\): wire its "
                                            r"input with \.reads\(\)"):
            fd.Compiler.create(fd.Scalar() >> c)
    # A block that takes no input may read nothing.
    c = fd.Composition()
    with c.scope():
        c.output.reads(fd.Function(jnp.add).reads(fd.FromTensor(np.float32(1.0)), c.input))
    assert float((fd.Scalar() >> c).eval(2.0)) == 3.0


def test_double_connection_is_value_error():
    c = fd.Composition()
    with c.scope():
        x = fd.Scalar().reads(c.input)
        with pytest.raises(ValueError, match="wired once"):
            x.reads(c.input)


def test_writing_composition_input_is_value_error():
    c = fd.Composition()
    with c.scope():
        with pytest.raises(ValueError, match="input"):
            c.input.reads(fd.Scalar())


def test_unwired_output_is_value_error():
    c = fd.Composition()
    with c.scope():
        fd.Metric("m").reads(fd.Scalar().reads(c.input))
    with pytest.raises(TypeError, match="not wired"):
        fd.Compiler.create(c)


def test_reads_outside_scope_is_value_error():
    with pytest.raises(ValueError, match="scope"):
        fd.Scalar().reads(fd.Scalar())


def test_mismatched_wiring_names_both_blocks():
    c = fd.Composition()
    with c.scope():
        x = fd.Vector(3).reads(c.input)
        with pytest.raises(TypeError) as info:
            fd.Map(fd.Scalar()).reads(x)
    assert "Vector" in str(info.value) and "Map" in str(info.value)
