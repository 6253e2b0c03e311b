"""``Shared``: DAG inputs computed once per distinct node, against a tree expansion in plain JAX."""

from __future__ import annotations

import random
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fold as fd

DIM = 4


def make_dag_model(across_examples: bool = False, key=None):
    """Nodes ``{"kids": [...]}`` (any arity, summed, then a layer) and leaves ``{"val": [4 floats]}``,
    every node shared; each node also records its value in metric ``"node"``."""
    decl = fd.ForwardDeclaration(fd.PyObjectType(), fd.TensorType((DIM,)))
    layer = fd.FC(DIM, activation=jnp.tanh, name="node_fc")
    leaf = fd.GetItem("val") >> fd.Vector(DIM)
    inner = fd.GetItem("kids") >> fd.Map(decl()) >> fd.Reduce(fd.Function(jnp.add)) >> fd.Function(layer)
    node = fd.OneOf(lambda x: "kids" in x, {False: leaf, True: inner}) >> fd.AllOf(fd.Identity(), fd.Metric("node"))
    decl.resolve_to(fd.Shared(node >> fd.GetItem(0), key=key, across_examples=across_examples))
    return decl(), layer


def reference(params: dict, x: dict) -> jax.Array:
    """The DAG expanded into a tree: every path computed again."""
    if "kids" not in x:
        return jnp.asarray(x["val"], jnp.float32)
    total = reference(params, x["kids"][0])
    for kid in x["kids"][1:]:
        total = total + reference(params, kid)
    p = params["node_fc"]
    return jnp.tanh(total @ p["w"] + p["b"])


def random_dag(rng: random.Random, nodes: int) -> dict:
    """A rooted DAG whose inner nodes read 1-3 earlier nodes, often the same ones."""
    pool = [{"val": [rng.uniform(-1, 1) for _ in range(DIM)]} for _ in range(3)]
    for _ in range(nodes):
        pool.append({"kids": [rng.choice(pool[-4:]) for _ in range(rng.randint(1, 3))]})
    return pool[-1]


def distinct(x: dict, seen: set[int] | None = None) -> set[int]:
    """Ids of the inner nodes reachable from ``x``."""
    seen = set() if seen is None else seen
    if "kids" in x and id(x) not in seen:
        seen.add(id(x))
        for kid in x["kids"]:
            distinct(kid, seen)
    return seen


def paths(x: dict) -> int:
    """Inner nodes of the tree expansion (exponential in the DAG's depth)."""
    return 1 + sum(paths(k) for k in x["kids"]) if "kids" in x else 0


def loss_and_grads(compiler: fd.Compiler, params: dict, batch: fd.Batch):
    return jax.jit(jax.value_and_grad(lambda p: jnp.sum(jnp.sin(compiler.apply(p, batch).outputs))))(params)


def test_a_dag_is_computed_once_per_distinct_node_with_the_tree_expansions_values_and_gradients():
    rng = random.Random(0)
    examples = [random_dag(rng, rng.randint(1, 12)) for _ in range(8)]
    assert sum(paths(x) for x in examples) > 2 * sum(len(distinct(x)) for x in examples)  # real sharing
    model, _ = make_dag_model()
    compiler = fd.Compiler.create(model)
    params = compiler.init(jax.random.key(1))
    batch = compiler.build_batch(examples)
    # One addition per extra kid and one layer call per distinct inner node.
    adds = sum(len(x["kids"]) - 1 for e in examples for x in _inner(e))
    assert batch.stats.num_nodes == adds + sum(len(distinct(x)) for x in examples)
    result = compiler.apply(params, batch)
    want = jnp.stack([reference(params, x) for x in examples])
    np.testing.assert_allclose(result.outputs, want, rtol=1e-5, atol=1e-6)
    # The metric has one entry per distinct node (leaves included), not per path.
    assert len(result.metrics["node"].values) == sum(len(_all(x)) for x in examples)

    loss, grads = loss_and_grads(compiler, params, batch)
    want_loss, want_grads = jax.value_and_grad(
        lambda p: jnp.sum(jnp.sin(jnp.stack([reference(p, x) for x in examples]))))(params)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
    for name in ("w", "b"):
        np.testing.assert_allclose(grads["node_fc"][name], want_grads["node_fc"][name], rtol=1e-4, atol=1e-6)


def _all(x: dict) -> dict[int, dict]:
    """Every node reachable from ``x`` (leaves too), by id."""
    found: dict[int, dict] = {}
    stack = [x]
    while stack:
        y = stack.pop()
        if id(y) not in found:
            found[id(y)] = y
            stack.extend(y.get("kids", []))
    return found


def _inner(x: dict) -> list[dict]:
    return [y for y in _all(x).values() if "kids" in y]


def test_the_gradient_of_a_shared_input_is_the_sum_over_its_uses_checked_numerically():
    # A leaf tensor read by three parents: the gradient with respect to it reaches it three times.
    leaf = {"val": [0.3, -0.2, 0.5, 0.1]}
    mid = {"kids": [leaf, leaf]}
    root = {"kids": [mid, leaf, mid]}
    model, _ = make_dag_model()
    compiler = fd.Compiler.create(model)
    params = compiler.init(jax.random.key(2))
    batch = compiler.build_batch([root])
    g = jax.jit(jax.grad(lambda p: jnp.sum(compiler.apply(p, batch).outputs ** 2)))(params)["node_fc"]["b"]
    eps = 1e-3
    for i in range(DIM):
        step = {"node_fc": {"w": params["node_fc"]["w"], "b": params["node_fc"]["b"].at[i].add(eps)}}
        down = {"node_fc": {"w": params["node_fc"]["w"], "b": params["node_fc"]["b"].at[i].add(-eps)}}
        num = (jnp.sum(compiler.apply(step, batch).outputs ** 2) - jnp.sum(compiler.apply(down, batch).outputs ** 2))
        np.testing.assert_allclose(g[i], num / (2 * eps), rtol=2e-2, atol=1e-4)
    np.testing.assert_allclose(compiler.apply(params, batch).outputs[0], reference(params, root), rtol=1e-5)


def test_a_chain_of_diamonds_with_two_to_the_2000_paths_builds_in_linear_work():
    # Deeper than the host plan recurses: the plan gives up part way, its memo entries are rolled
    # back (or the walk would meet them and report a cycle), and the walk goes on.
    x: dict = {"val": [0.1, 0.2, 0.3, 0.4]}
    for _ in range(2000):
        x = {"kids": [x, x]}
    model, _ = make_dag_model()
    compiler = fd.Compiler.create(model)
    params = compiler.init(jax.random.key(3))
    batch = compiler.build_batch([x])
    assert batch.stats.num_nodes == 2 * 2000  # an addition and a layer call per node
    assert batch.stats.max_depth == 2 * 2000
    want = jnp.asarray([0.1, 0.2, 0.3, 0.4])
    p = params["node_fc"]
    for _ in range(2000):
        want = jnp.tanh((want + want) @ p["w"] + p["b"])
    np.testing.assert_allclose(compiler.apply(params, batch).outputs[0], want, rtol=1e-4, atol=1e-6)


def test_sharing_across_examples_only_when_asked():
    common = {"kids": [{"val": [1.0, 0.0, 0.0, 0.0]}, {"val": [0.0, 1.0, 0.0, 0.0]}]}
    examples = [{"kids": [common, {"val": [0.5] * DIM}]}, {"kids": [common]}, common]
    # Calls (additions and layer calls): ``common`` 2, the first root 2, the second 1.
    for across, calls in ((False, 2 * 3 + 2 + 1), (True, 2 + 2 + 1)):
        model, _ = make_dag_model(across_examples=across)
        compiler = fd.Compiler.create(model)
        params = compiler.init(jax.random.key(4))
        batch = compiler.build_batch(examples)
        assert batch.stats.num_nodes == calls
        want = jnp.stack([reference(params, x) for x in examples])
        np.testing.assert_allclose(compiler.apply(params, batch).outputs, want, rtol=1e-5, atol=1e-6)
        # Recorded apart, examples share only within themselves (a warning says so when the model
        # asks for more); the values are the same.
        if across:
            with pytest.warns(UserWarning, match="shares nodes across examples, but examples recorded apart"):
                recorded = compiler.record(examples)
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                recorded = compiler.record(examples)
        merged = compiler.build_batch(recorded)
        np.testing.assert_allclose(compiler.apply(params, merged).outputs, want, rtol=1e-5, atol=1e-6)


def test_a_key_function_names_nodes_across_distinct_objects():
    # Two equal dicts are distinct objects: shared by identity only when keyed by content.
    def leaf(i: int) -> dict:
        return {"id": f"leaf{i}", "val": [float(i)] * DIM}

    twin = lambda: {"id": "a", "kids": [leaf(1), leaf(2)]}  # noqa: E731
    examples = [{"id": "root", "kids": [twin(), twin()]}]
    nodes = {}
    for key in (None, lambda x: x["id"]):
        model, _ = make_dag_model(key=key)
        compiler = fd.Compiler.create(model)
        params = compiler.init(jax.random.key(5))
        batch = compiler.build_batch(examples)
        nodes[key is None] = batch.stats.num_nodes
        np.testing.assert_allclose(compiler.apply(params, batch).outputs[0], reference(params, examples[0]),
                                   rtol=1e-5, atol=1e-6)
    assert nodes == {True: 3 + 3, False: 2 + 2}


def test_dropout_draws_once_per_shared_node():
    decl = fd.ForwardDeclaration(fd.PyObjectType(), fd.TensorType((64,)))
    decl.resolve_to(fd.Shared(fd.Vector(64) >> fd.Dropout(0.5)))
    model = fd.Record((decl(), decl())) >> fd.Concat()
    unshared = fd.Record((fd.Vector(64) >> fd.Dropout(0.5), fd.Vector(64) >> fd.Dropout(0.5))) >> fd.Concat()
    v = [1.0] * 64
    for block, same in ((model, True), (unshared, False)):
        compiler = fd.Compiler.create(block)
        params = compiler.init(jax.random.key(0))
        out = np.asarray(compiler.apply(params, compiler.build_batch([(v, v)]), jax.random.key(6)).outputs[0])
        assert set(np.unique(out)) <= {0.0, 2.0} and 0 < (out == 0).sum() < 128
        assert np.array_equal(out[:64], out[64:]) == same


@pytest.mark.parametrize("key", [None, lambda x: x["id"]])
def test_a_cycle_is_an_error_naming_the_example_and_key(key):
    leaf = {"id": "leaf", "val": [0.0] * DIM}
    if key is None:  # an object inside itself
        loop: dict = {"id": "n1", "kids": [leaf]}
        loop["kids"].append({"id": "n2", "kids": [loop]})
    else:  # distinct objects, but the keys say node n1 reads itself
        loop = {"id": "n1", "kids": [leaf, {"id": "n2", "kids": [{"id": "n1", "kids": [leaf]}]}]}
    fine = {"id": "n0", "kids": [{"id": "leaf", "val": [1.0] * DIM}]}
    model, _ = make_dag_model(key=key)
    compiler = fd.Compiler.create(model)
    # By identity, the declaration's own check (an object inside itself) meets the cycle first.
    cycle = "already processing" if key is None else "key 'n1' is reached again while it is being computed.*cycle"
    with pytest.raises(ValueError, match=rf"example 1: at Shared > OneOf > Map\[1\] > .*{cycle}"):
        compiler.build_batch([fine, loop])


def test_bad_arguments_and_unhashable_keys_are_clear_errors():
    with pytest.raises(TypeError, match="key must be a function"):
        fd.Shared(fd.Scalar(), key="id")
    with pytest.raises(TypeError, match="across_examples must be a bool"):
        fd.Shared(fd.Scalar(), across_examples=1)
    compiler = fd.Compiler.create(fd.Shared(fd.Scalar(), key=lambda x: [x]))
    with pytest.raises(TypeError, match=r"example 0: .*key \[1\] is unhashable"):
        compiler.build_batch([1])


def test_shared_blocks_take_their_childs_types():
    block = fd.Shared(fd.Vector(3) >> fd.FC(2))
    assert block.input_type == fd.PyObjectType() and block.output_type == fd.TensorType((2,))
    with pytest.raises(TypeError):
        fd.Compiler.create(fd.Shared(fd.Scalar()) >> fd.Map(fd.Identity()))
