"""Bad examples raise one error of their natural type, with index and block path."""

from __future__ import annotations

import itertools

import jax
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


class _Rejected(Exception):
    """A user's own exception class."""


class _Coded(Exception):
    """One whose message is not its first argument."""

    def __init__(self, message, code):
        super().__init__(message, code)
        self.code = code

    def __str__(self):
        return f"{self.args[0]} (code {self.code})"


@pytest.mark.parametrize("workers", [0, 1])
def test_a_users_own_exception_names_the_example_in_its_message_and_keeps_its_attributes(workers):
    """A user's exception class, or one whose constructor takes more than a message (JSON's
    ``JSONDecodeError``, protobuf's ``DecodeError``), had the example and path only in a note,
    which loggers printing the message drop."""
    import json

    def check(x):
        if x < 0:
            raise _Rejected("negative")
        return x

    compiler = fd.Compiler.create(fd.InputTransform(check) >> fd.Scalar())
    with pytest.raises(_Rejected) as raised:
        list(compiler.batches([1.0, -2.0], 2, num_workers=workers))
    assert str(raised.value) == "example 1 (position 1 in its batch): at InputTransform: negative"
    parse = fd.Compiler.create(fd.InputTransform(json.loads) >> fd.GetItem("a") >> fd.Scalar())
    with pytest.raises(json.JSONDecodeError, match="^example 1: at InputTransform: Expecting property name") as bad:
        parse.build_batch(['{"a": 1}', "{a"])
    assert bad.value.pos == 1

    def coded(x):
        raise _Coded("bad", 3)

    # A message that is not its first argument stays as it is; the note says where.
    with pytest.raises(_Coded) as noted:
        fd.Compiler.create(fd.InputTransform(coded) >> fd.Scalar()).build_batch([1.0])
    assert str(noted.value) == "bad (code 3)"
    assert noted.value.__notes__ == ["example 0: at InputTransform: bad (code 3)"] and noted.value.code == 3


def _recursive_sum() -> fd.Block:
    decl = fd.ForwardDeclaration(fd.PyObjectType(), fd.TensorType(()))
    tree = fd.OneOf(lambda x: isinstance(x, list), {False: fd.Scalar(), True: fd.Map(decl()) >> fd.Sum()})
    decl.resolve_to(tree)
    return tree


def test_a_cyclic_input_is_an_error_not_a_hang():
    compiler = fd.Compiler.create(_recursive_sum())
    cyclic = [1.0, 2.0]
    cyclic.append(cyclic)
    with pytest.raises(ValueError, match=r"example 1: at OneOf > Map\[2\] > .*already processing.*contains itself"):
        compiler.build_batch([[1.0], cyclic])
    # The same object twice, side by side, is no cycle; and the builder is not left in a bad state.
    shared = [2.0, 3.0]
    batch = compiler.build_batch([[shared, shared], [1.0]])
    np.testing.assert_allclose(compiler.apply({}, batch).outputs, [10.0, 1.0])


def test_a_recursion_that_consumes_no_input_is_an_error_not_a_hang():
    decl = fd.ForwardDeclaration(fd.PyObjectType(), fd.TensorType(()))
    decl.resolve_to(decl() >> fd.Function(jnp.sin))
    with pytest.raises(ValueError, match="example 0: at ForwardDeclaration.*recursion consumes no input"):
        fd.Compiler.create(decl()).build_batch([1.0])


def _ever_deeper(**limits: int) -> fd.Compiler:
    """A recursion that wraps a copy of its input in a new list at every level, calling ``sin`` on
    the way back: no object repeats, so only the limits stop it."""
    decl = fd.ForwardDeclaration(fd.PyObjectType(), fd.TensorType(()))
    decl.resolve_to(fd.OneOf(lambda x: isinstance(x, list), {
        False: fd.Scalar(),
        True: fd.InputTransform(lambda x: [list(x)]) >> fd.Map(decl()) >> fd.Sum() >> fd.Function(jnp.sin)}))
    return fd.Compiler.create(decl(), **limits)


def test_a_recursion_that_makes_new_objects_stops_at_the_recursion_limit():
    with pytest.raises(ValueError, match=r"example 1: at OneOf > Map\[0\] > .* blocks \.\.\. > .*"
                                         r"recurses more than 100,000 calls deep.*max_recursion"):
        _ever_deeper().build_batch([1.0, [2.0]])
    with pytest.raises(ValueError, match="more than 300 calls deep") as raised:
        _ever_deeper(max_recursion=300).build_batch([[2.0]])
    assert len(str(raised.value)) < 1000  # the block path of a deep recursion is shortened


def test_a_recursion_limit_below_the_plans_depth_is_kept_too():
    """The host plan recurses up to 200 levels itself; a lower limit holds there as well."""
    deep = fd.ForwardDeclaration(fd.PyObjectType(), fd.TensorType(()))
    deep.resolve_to(fd.OneOf(lambda x: isinstance(x, list), {False: fd.Scalar(), True: fd.GetItem(0) >> deep()}))

    def nested(levels: int) -> object:
        x: object = 1.0
        for _ in range(levels):
            x = [x]
        return x

    compiler = fd.Compiler.create(deep(), max_recursion=20)
    assert compiler.build_batch([nested(19)]).stats.num_nodes == 0
    with pytest.raises(ValueError, match="example 1: at OneOf > OneOf.* recurses more than 20 calls deep"):
        compiler.build_batch([nested(5), nested(50)])


def test_an_example_past_the_node_limit_is_named_by_its_dataset_index():
    compiler = fd.Compiler.create(fd.Map(fd.Scalar() >> fd.Function(jnp.sin)) >> fd.Sum(), max_example_nodes=100)
    assert compiler.build_batch([[1.0] * 40, [1.0] * 40]).stats.num_nodes > 100  # the limit is per example
    with pytest.raises(ValueError, match=r"example 5 \(position 1 in its batch\) makes more than 100 operation "
                                         r"calls.*max_example_nodes"):
        list(compiler.batches([[1.0]] * 5 + [[1.0] * 200], batch_size=4))
    # Recursive calls check as they go: here every level calls sin before it recurses.
    decl = fd.ForwardDeclaration(fd.PyObjectType(), fd.TensorType(()))
    deeper = fd.InputTransform(lambda x: [list(x)]) >> fd.Map(decl()) >> fd.Sum()
    decl.resolve_to(fd.OneOf(lambda x: isinstance(x, list), {
        False: fd.Scalar(),
        True: fd.AllOf(fd.InputTransform(len) >> fd.Scalar() >> fd.Function(jnp.sin), deeper) >> fd.Function(jnp.add)}))
    with pytest.raises(ValueError, match="example 0: at .*makes more than 50 operation calls"):
        fd.Compiler.create(decl(), max_example_nodes=50).build_batch([[1.0]])


def test_an_input_that_shares_sub_objects_stops_at_the_node_limit_as_it_unfolds():
    # Each level holds the level below twice: 2**18 leaves at depth 18, far below the recursion limit.
    # The host plan once counted nodes only after an example, so a depth of 50 ran forever.
    seen = [0]

    def is_pair(x):
        seen[0] += 1
        return isinstance(x, list)

    decl = fd.ForwardDeclaration(fd.PyObjectType(), fd.TensorType(()))
    decl.resolve_to(fd.OneOf(is_pair, {False: fd.Scalar(), True: fd.Map(decl()) >> fd.Sum()}))
    compiler = fd.Compiler.create(decl(), max_example_nodes=1000)
    shared = 1.0
    for _ in range(18):
        shared = [shared, shared]
    with pytest.raises(ValueError, match="example 0: at OneOf > Map.*makes more than 1,000 operation calls"):
        compiler.build_batch([shared])
    assert seen[0] < 10_000  # the plan and then the walk each stopped near 1,000 calls
    pair = [1.0, 2.0]
    batch = compiler.build_batch([[pair, pair]])  # a small shared input is fine
    assert compiler.apply(compiler.init(jax.random.key(0)), batch).outputs.tolist() == [6.0]


@pytest.mark.parametrize("block, expected", [(fd.Map(fd.Scalar()) >> fd.Sum(), [1000.0, 3.0]),
                                             (fd.Length(), [1000.0, 2.0])])
def test_an_endless_iterator_in_an_example_is_an_error_not_a_hang(block, expected):
    # list() of it once ran until memory ran out.
    compiler = fd.Compiler.create(block, max_example_nodes=1000)
    with pytest.raises(ValueError, match=r"example 1: at \w+: \w+ read more than 1,000 items from a count \(an "
                                         r"endless iterator\?\): raise the limit with Compiler.create"):
        compiler.build_batch([iter([1.0, 2.0]), itertools.count()])
    # A finite iterator of up to the limit is read whole.
    outputs = compiler.apply({}, compiler.build_batch([iter([1.0] * 1000), (x for x in [1.0, 2.0])])).outputs
    assert outputs.tolist() == expected


@pytest.mark.parametrize("option", ["max_example_nodes", "max_recursion"])
@pytest.mark.parametrize("value", [0, -1, 2.5, True, "10"])
def test_limits_must_be_positive_ints(option, value):
    with pytest.raises(ValueError, match=f"{option} must be an int >= 1"):
        fd.Compiler.create(fd.Scalar(), **{option: value})


@pytest.mark.parametrize("option, value, minimum", [
    ("batch_size", 3.5, 1), ("batch_size", "2", 1), ("batch_size", True, 1), ("batch_size", 0, 1),
    ("num_workers", 1.5, 0), ("num_workers", -1, 0),
])
def test_batches_options_must_be_ints(option, value, minimum):
    """A float batch size once failed in ``islice`` ("Stop argument for islice() must be None or an
    integer") and a string in a comparison; ``True`` ran as a batch size of 1."""
    compiler = fd.Compiler.create(fd.Scalar())
    options = {"batch_size": 2, "num_workers": 0, option: value}
    with pytest.raises(ValueError, match=f"^{option} must be an int >= {minimum}, got {value!r}$"):
        next(compiler.batches([1.0, 2.0, 3.0], **options))
    assert len(list(compiler.batches([1.0, 2.0, 3.0], np.int64(2)))) == 2  # NumPy ints are ints


def test_a_batch_size_past_sys_maxsize_is_refused():
    """``batch_size=10**30`` leaked ``islice``'s "Stop argument for islice() must be None or an integer"."""
    compiler = fd.Compiler.create(fd.Scalar())
    with pytest.raises(ValueError, match=r"^batch_size must be at most sys.maxsize \(\d+\), got 10{30}$".replace(
            "10{30}", str(10**30))):
        next(compiler.batches([1.0, 2.0], 10**30))
    assert len(list(compiler.batches([1.0, 2.0], 2**40))) == 1
    with pytest.raises(ValueError, match=r"Embedding has 100000000000 buckets, more than its int32 ids can index"):
        fd.Embedding(10**11, 4)


@pytest.mark.parametrize("container, hint", [({"a": 1.0, "b": 2.0}, "got a dict.*items"),
                                             ({1.0, 2.0}, "got a set.*order varies")])
def test_a_dict_or_set_given_to_map_is_an_error_not_its_keys(container, hint):
    compiler = fd.Compiler.create(fd.Map(fd.Scalar()) >> fd.Sum())
    with pytest.raises(TypeError, match=f"example 1: at Map: Map expected a sequence, {hint}"):
        compiler.build_batch([[1.0], container])


@pytest.mark.parametrize("block, good, bad, message", [
    (fd.Scalar(), 1.0, 1e39, r"value 1e\+39 overflows float32"),
    (fd.Vector(2), [1.0, 2.0], [1.0, -1e39], r"overflows float32"),
    (fd.Scalar("float16"), 7, 70000, r"value 70000 overflows float16"),
    # JAX's own float types, whose NumPy kind is "V": bfloat16 overflows to inf, float8_e4m3fn to NaN.
    (fd.Scalar("bfloat16"), 7, 1e39, r"value 1e\+39 overflows bfloat16 \(largest 3.38953e\+38\)"),
    (fd.Vector(2, "bfloat16"), np.ones(2, "bfloat16"), np.array([1.0, -1e39]), r"overflows bfloat16"),
    (fd.Scalar("float8_e4m3fn"), 7, 1000.0, r"value 1000.0 overflows float8_e4m3fn \(largest 448\)"),
    (fd.Vector(2), np.array([1.0, 3.0]), np.array([1 + 2j, 3]), "expected real numbers.*complex"),
    (fd.InputTransform(lambda n: [0] * n) >> fd.Length(dtype="float16"), 7, 70000, "value 70000 overflows float16"),
])
def test_values_a_type_cannot_hold_are_errors_not_inf(block, good, bad, message):
    with pytest.raises(ValueError, match=f"example 1: .*{message}"):
        fd.Compiler.create(block).build_batch([good, bad])


@pytest.mark.parametrize("workers", [0, 1])
def test_errors_from_batches_name_the_index_in_the_dataset(workers):
    """Example 7 of the dataset is example 3 of the second batch of 4; shuffled, it is elsewhere."""
    compiler = fd.Compiler.create(fd.Map(fd.Scalar()) >> fd.Sum())
    data = [[1.0]] * 7 + [["x"]] + [[1.0]] * 4
    with pytest.raises(ValueError, match=r"^example 7 \(position 3 in its batch\): at Map\[0\] > Scalar"):
        list(compiler.batches(data, 4, num_workers=workers))
    order = np.random.default_rng(3).permutation(len(data))
    position = int(np.flatnonzero(order == 7)[0]) % 4
    with pytest.raises(ValueError, match=rf"^example 7 \(position {position} in its batch\)"):
        list(compiler.batches(data, 4, shuffle=True, seed=3, num_workers=workers))


def test_an_overflow_in_a_host_function_names_the_example_in_its_message():
    compiler = fd.Compiler.create(fd.InputTransform(lambda x: float(10 ** x)) >> fd.Scalar())
    with pytest.raises(OverflowError, match=r"^example 1: at InputTransform"):
        compiler.build_batch([1, 400])


def test_building_a_batch_under_jit_says_to_build_it_outside():
    # Examples traced by jit once raised JAX's TracerArrayConversionError, example and path only in a note.
    compiler = fd.Compiler.create(fd.Map(fd.Vector(2)) >> fd.Sum())
    with pytest.raises(TypeError, match=r"^example 0: at Map\[0\] > Vector: the example holds a traced JAX value, "
                                        r"not data: batches are built on the host, so build them outside jax.jit"):
        jax.jit(lambda examples: compiler.build_batch(examples).arrays)([[[1.0, 2.0]], [[3.0, 4.0]]])
    with pytest.raises(TypeError, match=r"^example 1: at Scalar: the example holds a traced JAX value"):
        block = fd.GetItem(0) >> fd.Scalar("int32")
        jax.jit(lambda x: fd.Compiler.create(block).build_batch([(1,), (x,)]).arrays)(jnp.int32(3))
