"""Bad examples raise one error of their natural type, with index and block path."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

import fold as fd


def _model():
    expr = fd.OneOf(lambda x: x["kind"], {
        "seq": fd.GetItem("items") >> fd.Map(fd.Scalar()) >> fd.Sum(),
        "num": fd.GetItem("value") >> fd.Scalar(),
    })
    return fd.Record({"left": expr, "right": fd.Vector(2) >> fd.Function(lambda v: v.sum(-1))}) \
        >> fd.Function(jnp.add)


GOOD = {"left": {"kind": "seq", "items": [1, 2, 3, 4]}, "right": [1, 1]}


@pytest.mark.parametrize("bad, exc, fragments", [
    ({"left": {"kind": "seq", "items": [1, 2, 3, "x"]}, "right": [1, 1]}, ValueError,
     ["example 1", "Record['left'] > OneOf > Map[3] > Scalar", "string 'x'"]),
    ({"left": {"kind": "seq", "items": [1, None]}, "right": [1, 1]}, TypeError,
     ["example 1", "Map[1] > Scalar", "None"]),
    ({"left": {"kind": "tree", "items": []}, "right": [1, 1]}, KeyError,
     ["example 1", "Record['left'] > OneOf", "no case for key 'tree'"]),
    ({"left": {"kind": "num", "value": 1.0}}, KeyError, ["example 1", "Record", "'right'"]),
    ({"left": {"kind": "num", "value": 1.0}, "right": [1, 2, 3]}, ValueError,
     ["example 1", "Record['right'] > Vector", "shape (2,)"]),
    ({"left": {"kind": "num", "value": [1.0, 2.0]}, "right": [1, 2]}, ValueError,
     ["example 1", "Record['left'] > OneOf > Scalar", "shape ()"]),
    (("not", "a dict"), TypeError, ["example 1", "Record", "'left'"]),
    ({"left": {"kind": "seq", "items": 5}, "right": [1, 1]}, TypeError,
     ["example 1", "Record['left'] > OneOf > Map", "sequence"]),
])
def test_bad_example_names_index_path_and_expectation(bad, exc, fragments):
    compiler = fd.Compiler.create(_model())
    with pytest.raises(exc) as info:
        compiler.build_batch([GOOD, bad, GOOD])
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    # The compiler is not left in a broken state.
    out = compiler.apply({}, compiler.build_batch([GOOD, GOOD])).outputs
    np.testing.assert_allclose(np.asarray(out), [12.0, 12.0])


def test_onehot_and_embedding_errors():
    with pytest.raises(KeyError, match="example 0.*OneHot"):
        fd.Compiler.create(fd.OneHot(3)).build_batch([5])
    with pytest.raises(KeyError, match="not one of"):
        fd.Compiler.create(fd.OneHotFromList(["a", "b"])).build_batch(["c"])
    embed = fd.Embedding(4, 2, mod_inputs=False)
    compiler = fd.Compiler.create(fd.Scalar("int32") >> fd.Function(embed))
    with pytest.raises(ValueError, match="example 1.*outside \\[0, 4\\)"):
        compiler.build_batch([1, 4])
    assert compiler.build_batch([0, 3]).layout.num_examples == 2


def test_int_block_rejects_fractions_and_overflow():
    compiler = fd.Compiler.create(fd.Scalar("int32"))
    with pytest.raises(ValueError, match="integers"):
        compiler.build_batch([1.5])
    with pytest.raises(ValueError, match="does not fit"):
        compiler.build_batch([2**40])


def test_none_needs_optional():
    compiler = fd.Compiler.create(fd.Map(fd.Optional(fd.Scalar())) >> fd.Sum())
    out = compiler.apply({}, compiler.build_batch([[1.0, None, 2.0]])).outputs
    np.testing.assert_allclose(np.asarray(out), [3.0])
    with pytest.raises(TypeError, match="example 0.*Map\\[1\\] > Scalar.*None"):
        fd.Compiler.create(fd.Map(fd.Scalar()) >> fd.Sum()).build_batch([[1.0, None]])


def test_user_function_errors_keep_their_type_and_gain_context():
    def parse(x):
        return int(x)

    compiler = fd.Compiler.create(fd.InputTransform(parse) >> fd.Scalar())
    with pytest.raises(ValueError, match="example 2: at InputTransform"):
        compiler.build_batch(["1", "2", "three"])
