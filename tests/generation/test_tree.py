"""TreeDecoder and Generator: batched tree generation against a per-example plain-JAX decoder,
teacher forcing against generation, bounds and errors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fold as fd

H, LABELS = 4, 5


def _decoder(arities=(0, 2), max_levels: int = 6, max_nodes: int = 40) -> fd.TreeDecoder:
    """``child = tanh([parent; sibling] W + b)``; arity and label logits linear in the state."""
    return fd.TreeDecoder(fd.Concat() >> fd.FC(H, activation=jnp.tanh, name="child"),
                          fd.FC(len(arities), activation=None, name="arity"),
                          fd.FC(LABELS, activation=None, name="label"),
                          arities=arities, max_levels=max_levels, max_nodes=max_nodes)


def _reference(p, start, arities, max_levels, max_nodes, key=None, b=0):
    """One example, one node at a time: the decoder's queue, in plain JAX. Returns (tree,
    truncated, log-probability, number of nodes)."""

    def pick(logits, number, decision):
        if key is None:
            return int(jnp.argmax(logits))
        k = jax.random.fold_in(jax.random.fold_in(jax.random.fold_in(key, b), number), decision)
        return int(jax.random.categorical(k, logits))

    state, depth, arity, label, kids = {}, {}, {}, {}, {}
    queue = [(None, 0, None, 0)]  # (parent, position, previous sibling, number)
    count, refused, truncated, logp = 1, False, False, 0.0
    while queue:
        parent, position, sibling, number = queue.pop(0)
        if parent is None:
            s, depth[number] = jnp.asarray(start), 0
        else:
            prev = state[sibling] if sibling is not None else jnp.zeros(H)
            s = jnp.tanh(jnp.concatenate([state[parent], prev]) @ p["child"]["w"] + p["child"]["b"])
            depth[number] = depth[parent] + 1
            kids[parent].append(number)
        state[number], kids[number] = s, []
        logits = s @ p["arity"]["w"] + p["arity"]["b"]
        chosen = pick(logits, number, 0)
        wants = arities[chosen]
        asks = wants if depth[number] < max_levels and not refused else 0
        granted = asks > 0 and count + asks <= max_nodes
        refused |= asks > 0 and not granted
        truncated |= wants > 0 and not granted
        arity[number] = wants if granted else 0
        logp += float(jax.nn.log_softmax(logits)[chosen if granted else arities.index(0)])
        if not granted:
            label_logits = s @ p["label"]["w"] + p["label"]["b"]
            label[number] = pick(label_logits, number, 1)
            logp += float(jax.nn.log_softmax(label_logits)[label[number]])
        first = count
        count += arity[number]
        if parent is not None and position + 1 < arity[parent]:
            queue.append((parent, position + 1, number, number + 1))
        if granted:
            queue.append((number, 0, None, first))

    def tree(n):
        return label[n] if arity[n] == 0 else tuple(tree(k) for k in kids[n])

    return tree(0), truncated, logp, count


def _starts(n: int, seed: int = 0, scale: float = 1.0) -> np.ndarray:
    return (scale * np.random.default_rng(seed).normal(size=(n, H))).astype(np.float32)


@pytest.mark.parametrize("arities,sampled", [((0, 2), False), ((0, 2), True), ((0, 1, 3), True)])
def test_batched_generation_equals_one_example_at_a_time(arities, sampled):
    generator = fd.Generator(_decoder(arities, max_levels=5, max_nodes=30), state_type=fd.TensorType((H,)))
    params = generator.init(jax.random.key(0))
    params["arity"]["b"] = params["arity"]["b"].at[1:].add(0.8)  # trees of several levels, some cut
    starts = _starts(9, scale=2.0)
    key = jax.random.key(3) if sampled else None
    out = generator.generate(params, starts, key)
    want = [_reference(params, s, arities, 5, 30, key, b) for b, s in enumerate(starts)]
    assert out.trees() == [tree for tree, _, _, _ in want]
    np.testing.assert_array_equal(out.truncated, [t for _, t, _, _ in want])
    np.testing.assert_array_equal(out.num_nodes, [n for _, _, _, n in want])
    np.testing.assert_allclose(out.log_prob, [logp for _, _, logp, _ in want], rtol=1e-5, atol=1e-5)
    assert any(isinstance(tree, tuple) for tree, _, _, _ in want)  # not all single leaves
    # A node's state is kept: the root's is its start state.
    np.testing.assert_allclose(np.asarray(out.states)[:, 0], starts, rtol=1e-6)


def test_kept_scratch_buffers_change_nothing_whatever_they_hold():
    generator = fd.Generator(_decoder(max_levels=5, max_nodes=30), state_type=fd.TensorType((H,)))
    params = generator.init(jax.random.key(0))
    params["arity"]["b"] = params["arity"]["b"].at[1:].add(0.8)
    big, small = _starts(9, seed=1, scale=2.0), _starts(9, seed=2)
    fresh = fd.Generator(_decoder(max_levels=5, max_nodes=30), state_type=fd.TensorType((H,)))
    want = fresh.apply(params, small)
    generator.generate(params, big)  # leaves its trees' states in the kept buffers
    kept = generator._scratch[16]
    after_big = generator.generate(params, small)
    assert kept.is_deleted()  # handed to the call, not copied
    # NaN in every row of the kept buffers: no row the loop reads comes from them unwritten.
    generator._scratch[16] = jnp.full_like(generator._scratch[16], jnp.nan)
    after_nan = generator.generate(params, small)
    for out in (after_big, after_nan):
        assert out.trees() == want.trees()
        np.testing.assert_allclose(out.log_prob, want.log_prob, rtol=1e-6, atol=1e-6)
        # Per-node states as a fresh generation's: zeros in unused slots.
        assert not np.isnan(out.states).any()
        np.testing.assert_allclose(out.states, want.states, rtol=1e-6, atol=1e-6)
    assert generator._generate._cache_size() == 1


def test_generation_without_states_returns_the_same_trees():
    generator = fd.Generator(_decoder(max_levels=5, max_nodes=30), state_type=fd.TensorType((H,)))
    params = generator.init(jax.random.key(0))
    params["arity"]["b"] = params["arity"]["b"].at[1:].add(0.8)
    for n in (9, 16):  # padded to 16 rows, and not
        starts = _starts(n, scale=2.0)
        key = jax.random.key(5)
        with_states = generator.generate(params, starts, key)
        without = generator.generate(params, starts, key, states=False)
        assert without.states is None and without.trees() == with_states.trees()
        for a, b in zip(with_states[:-1], without[:-1]):
            np.testing.assert_array_equal(a, b)
        assert without.trees() == [_reference(params, s, (0, 2), 5, 30, key, b)[0] for b, s in enumerate(starts)]


def test_bounds_turn_expanding_nodes_into_leaves_and_flag_the_example():
    generator = fd.Generator(_decoder(max_levels=3, max_nodes=7), state_type=fd.TensorType((H,)))
    params = generator.init(jax.random.key(1))
    params["arity"]["b"] = jnp.array([-1e3, 1e3])  # every node wants two children
    out = generator.generate(params, _starts(3), None)
    assert out.truncated.all() and out.num_nodes.tolist() == [7, 7, 7]
    want = [_reference(params, s, (0, 2), 3, 7) for s in _starts(3)]
    assert out.trees() == [tree for tree, _, _, _ in want]
    tree = out.trees()[0]  # seven nodes: a full tree of depth 2 (depth 3 would need 15)
    assert isinstance(tree, tuple) and all(isinstance(k, tuple) and len(k) == 2 for k in tree)
    deep = fd.Generator(_decoder(max_levels=2, max_nodes=100), state_type=fd.TensorType((H,)))
    out = deep.generate(params, _starts(2), None)
    assert out.truncated.all() and out.num_nodes.tolist() == [7, 7]  # depth 2: 1 + 2 + 4 nodes


def test_teacher_forcing_scores_what_generation_makes_and_its_gradient_is_exact():
    decoder = _decoder(max_levels=4, max_nodes=20)
    compiler = fd.Compiler.create(fd.Record((fd.Vector(H), fd.Identity())) >> decoder >> fd.Sum())
    params = compiler.init(jax.random.key(2))
    params["arity"]["b"] = params["arity"]["b"].at[1].add(1.5)
    generator = fd.Generator(decoder)
    starts = _starts(7, seed=5, scale=2.0)
    out = generator.generate(params, starts, jax.random.key(9))
    trees = out.trees()
    assert any(isinstance(t, tuple) for t in trees)
    batch = compiler.build_batch([(s.tolist(), t) for s, t in zip(starts, trees)])
    np.testing.assert_allclose(compiler.apply(params, batch).outputs, out.log_prob, rtol=1e-5, atol=1e-5)

    def reference(p, start, tree):
        def score(node, s):
            logits = s @ p["arity"]["w"] + p["arity"]["b"]
            if not isinstance(node, tuple):
                label = jax.nn.log_softmax(s @ p["label"]["w"] + p["label"]["b"])[node]
                return jax.nn.log_softmax(logits)[0] + label
            total, sibling = jax.nn.log_softmax(logits)[1], jnp.zeros(H)
            for kid in node:
                sibling = jnp.tanh(jnp.concatenate([s, sibling]) @ p["child"]["w"] + p["child"]["b"])
                total += score(kid, sibling)
            return total
        return score(tree, jnp.asarray(start))

    got = jax.jit(jax.grad(lambda p: compiler.apply(p, batch).outputs.sum()))(params)
    want = jax.jit(jax.grad(lambda p: sum(reference(p, s, t) for s, t in zip(starts, trees))))(params)
    for layer in want:
        for name in want[layer]:
            np.testing.assert_allclose(got[layer][name], want[layer][name], rtol=1e-4, atol=1e-5)


def test_lstm_states_generate_what_the_static_model_scores():
    # A tuple state (c, h): the child LSTM steps from the sibling's state with the parent's h as input.
    child = fd.Function(lambda parent, sibling: (parent[1], sibling), name="parent_h") \
        >> fd.LSTMCell(H, name="lstm") >> fd.GetItem(1)
    decoder = fd.TreeDecoder(child, fd.GetItem(1) >> fd.FC(2, activation=None, name="arity"),
                             fd.GetItem(1) >> fd.FC(LABELS, activation=None, name="label"), max_levels=4, max_nodes=15)
    compiler = fd.Compiler.create(fd.Record((fd.Record((fd.Vector(H), fd.Vector(H))), fd.Identity())) >> decoder
                                  >> fd.Sum())
    params = compiler.init(jax.random.key(4))
    params["arity"]["b"] = params["arity"]["b"].at[1].add(2.0)
    c, h = _starts(6, 1, 2.0), _starts(6, 2, 2.0)
    out = fd.Generator(decoder).generate(params, (c, h), jax.random.key(1))
    trees = out.trees()
    assert any(isinstance(t, tuple) for t in trees) and out.truncated.any()
    batch = compiler.build_batch([((ci.tolist(), hi.tolist()), t) for ci, hi, t in zip(c, h, trees)])
    np.testing.assert_allclose(compiler.apply(params, batch).outputs, out.log_prob, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out.states[1][:, 0], h, rtol=1e-6)  # the root's state is its start state


def test_bad_trees_and_decoders_are_clear_errors():
    compiler = fd.Compiler.create(fd.Record((fd.Vector(H), fd.Identity())) >> _decoder() >> fd.Sum())
    for tree, match in (((1, 2, 3), r"a node has 3 children, but its arities are \(0, 2\)"),
                        (7, r"a leaf must be a label, an int in \[0, 5\), got 7"),
                        ("x", "a leaf must be a label")):
        with pytest.raises(ValueError, match=match):
            compiler.build_batch([([0.0] * H, tree)])
    for arities in ((1, 2), (0, 0, 2), (0, -1), ()):
        with pytest.raises(ValueError, match="arities must be distinct ints >= 0 with 0 among them"):
            fd.TreeDecoder(fd.Concat() >> fd.FC(H), fd.FC(2), fd.FC(LABELS), arities=arities)
    with pytest.raises(ValueError, match="max_nodes must be a positive int"):
        _decoder(max_nodes=0)
    three = fd.TreeDecoder(fd.Concat() >> fd.FC(H), fd.FC(3), fd.FC(LABELS), arities=(0, 2))
    with pytest.raises(TypeError, match=r"returns 3 logits, one per arity of \(0, 2\)"):
        fd.Generator(three, state_type=fd.TensorType((H,)))
    wide = fd.TreeDecoder(fd.Concat() >> fd.FC(H + 1), fd.FC(2), fd.FC(LABELS))
    with pytest.raises(TypeError, match="a child's state"):
        fd.Generator(wide, state_type=fd.TensorType((H,)))
