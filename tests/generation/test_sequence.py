"""SequenceDecoder and Generator: batched generation against a per-example plain-JAX decoder,
teacher forcing against generation, bounds, compilations and errors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fold as fd

V, H, END = 6, 5, 0


def _step() -> fd.Block:
    return fd.Record((fd.Identity(), fd.Embedding(V, 3, name="emb"))) >> fd.Concat() \
        >> fd.FC(H, activation=jnp.tanh, name="cell")


def _decoder(max_length: int = 12, end_token: int = END) -> fd.SequenceDecoder:
    """A tanh RNN decoder: ``s' = tanh([s; emb(y)] W + b)``, logits ``s U + c``."""
    return fd.SequenceDecoder(_step(), fd.FC(V, activation=None, name="out"), end_token=end_token,
                              max_length=max_length)


def _reference(p, start: np.ndarray, max_length: int, key=None, b: int = 0):
    """One example, one token at a time, in plain JAX: (tokens, ended, log-probability)."""
    s, tokens, logp = jnp.asarray(start), [], 0.0
    for t in range(max_length):
        logits = s @ p["out"]["w"] + p["out"]["b"]
        if key is None:
            y = int(jnp.argmax(logits))
        else:
            k = jax.random.fold_in(jax.random.fold_in(jax.random.fold_in(key, b), t), 0)
            y = int(jax.random.categorical(k, logits))
        logp += float(jax.nn.log_softmax(logits)[y])
        if y == END:
            return tokens, True, logp
        tokens.append(y)
        s = jnp.tanh(jnp.concatenate([s, p["emb"]["table"][y]]) @ p["cell"]["w"] + p["cell"]["b"])
    return tokens, False, logp


def _starts(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, H)).astype(np.float32)


@pytest.mark.parametrize("sampled", [False, True])
def test_batched_generation_equals_one_example_at_a_time(sampled):
    generator = fd.Generator(_decoder(), state_type=fd.TensorType((H,)))
    params = generator.init(jax.random.key(0))
    params["out"]["b"] = params["out"]["b"].at[END].add(-1.0)  # sequences of a few tokens, some cut
    starts = 2.0 * _starts(11)
    key = jax.random.key(7) if sampled else None
    out = generator.generate(params, starts, key)
    want = [_reference(params, s, 12, key, b) for b, s in enumerate(starts)]
    assert out.sequences() == [tokens for tokens, _, _ in want]
    np.testing.assert_array_equal(out.ended, [ended for _, ended, _ in want])
    np.testing.assert_allclose(out.log_prob, [logp for _, _, logp in want], rtol=1e-5, atol=1e-5)
    tokens = np.asarray(out.tokens)
    assert tokens.shape == (11, 12) and all((row[n:] == -1).all() for row, n in zip(tokens, out.lengths))
    # Each step's state: the start, then one per token, the last repeated to max_length + 1.
    assert out.states.shape == (11, 13, H)
    for b, (start, (seq, _, _)) in enumerate(zip(starts, want)):
        states = [jnp.asarray(start)]
        for y in seq:
            states.append(jnp.tanh(jnp.concatenate([states[-1], params["emb"]["table"][y]]) @ params["cell"]["w"]
                                   + params["cell"]["b"]))
        states += [states[-1]] * (13 - len(states))
        np.testing.assert_allclose(out.states[b], np.stack(states), rtol=1e-5, atol=1e-5)
    if not sampled:  # greedy decoding is deterministic; sampling is not: both ran and differ somewhere
        assert out.sequences() != generator.generate(params, starts, jax.random.key(7)).sequences()


def test_teacher_forcing_scores_what_generation_emits_and_its_gradient_is_exact():
    decoder = _decoder()
    model = fd.Record((fd.Vector(H), fd.Map(fd.Scalar("int32")))) >> decoder >> fd.Sum()
    compiler = fd.Compiler.create(model)
    params = compiler.init(jax.random.key(3))
    params["out"]["b"] = params["out"]["b"].at[END].add(3.0)  # every sequence ends within max_length
    generator = fd.Generator(decoder)
    assert sorted(generator.init(jax.random.key(0))) == sorted(params)  # one set of parameters for both
    starts = _starts(6, seed=1)
    out = generator.generate(params, starts, jax.random.key(2))
    assert out.ended.all()
    examples = [(s.tolist(), seq) for s, seq in zip(starts, out.sequences())]
    batch = compiler.build_batch(examples)
    np.testing.assert_allclose(compiler.apply(params, batch).outputs, out.log_prob, rtol=1e-5, atol=1e-5)

    # REINFORCE's gradient: of the sampled sequences' log-probability, through the static model.
    def static(p):
        return compiler.apply(p, batch).outputs.sum()

    def reference(p):
        total = 0.0
        for s, seq in zip(starts, out.sequences()):
            s = jnp.asarray(s)
            for y in [*seq, END]:
                total += jax.nn.log_softmax(s @ p["out"]["w"] + p["out"]["b"])[y]
                s = jnp.tanh(jnp.concatenate([s, p["emb"]["table"][y]]) @ p["cell"]["w"] + p["cell"]["b"])
        return total

    got, want = jax.jit(jax.grad(static))(params), jax.jit(jax.grad(reference))(params)
    for layer in want:
        for name in want[layer]:
            np.testing.assert_allclose(got[layer][name], want[layer][name], rtol=1e-4, atol=1e-5)


def test_tuple_states_and_lstm_cells_generate_what_the_static_model_scores():
    emb, lstm = fd.Embedding(V, 4, name="emb"), fd.LSTMCell(H, name="lstm")
    step = (fd.Record((fd.Identity(), emb)) >> fd.Function(lambda s, e: (e, s), name="swap") >> lstm
            >> fd.GetItem(1))
    decoder = fd.SequenceDecoder(step, fd.GetItem(1) >> fd.FC(V, activation=None, name="out"), END, max_length=9)
    compiler = fd.Compiler.create(fd.Record((fd.Record((fd.Vector(H), fd.Vector(H))), fd.Map(fd.Scalar("int32"))))
                                  >> decoder >> fd.Sum())
    params = compiler.init(jax.random.key(1))
    c, h = _starts(5, 3), _starts(5, 4)
    out = fd.Generator(decoder).generate(params, (c, h), jax.random.key(5))
    examples = [((ci.tolist(), hi.tolist()), seq) for ci, hi, seq, ended in zip(c, h, out.sequences(), out.ended)
                if ended]
    assert examples
    scores = compiler.apply(params, compiler.build_batch(examples)).outputs
    np.testing.assert_allclose(scores, np.asarray(out.log_prob)[np.asarray(out.ended)], rtol=1e-5, atol=1e-5)


def test_max_length_cuts_a_sequence_and_flags_it():
    generator = fd.Generator(_decoder(max_length=4), state_type=fd.TensorType((H,)))
    params = generator.init(jax.random.key(0))
    params["out"]["b"] = params["out"]["b"].at[END].set(-1e4)  # the end is never chosen
    out = generator.generate(params, _starts(3), None)
    assert not out.ended.any() and out.lengths.tolist() == [4, 4, 4]
    assert all(len(s) == 4 and END not in s for s in out.sequences())
    want = [_reference(params, s, 4) for s in _starts(3)]
    np.testing.assert_allclose(out.log_prob, [logp for _, _, logp in want], rtol=1e-5, atol=1e-5)


def test_batches_of_any_size_compile_a_few_times():
    generator = fd.Generator(_decoder(max_length=5), state_type=fd.TensorType((H,)))
    params = generator.init(jax.random.key(0))
    for n in (1, 3, 8, 9, 16, 17, 30, 2, 32):
        out = generator.generate(params, _starts(n, seed=n), None)
        assert out.tokens.shape == (n, 5)
        assert out.sequences() == [_reference(params, s, 5)[0] for s in _starts(n, seed=n)]
    # 8 rows, then 32 for 9 (a new count is at least 4 times the largest below it), which serves
    # 9 to 32 (a count serves batches down to a quarter of it), and 1 to 8 on 8.
    assert generator._row_counts == [8, 32] and generator._generate._cache_size() == 2
    # A stream of random sizes from 1 to 256, as a last partial batch or a varying one makes.
    sizes = np.random.default_rng(0).integers(1, 257, 40)
    assert [generator._row_count(int(n)) >= n for n in sizes] == [True] * 40
    assert generator._row_counts == [8, 32, 256]
    # The worst order, every size from 1 to 512 growing: 4 counts, each 4 times the one before.
    growing = fd.Generator(_decoder(max_length=5), state_type=fd.TensorType((H,)))
    assert [growing._row_count(n) >= n for n in range(1, 513)] == [True] * 512
    assert growing._row_counts == [8, 32, 128, 512]
    # A fixed batch size and its smaller last batch: one count.
    fixed = fd.Generator(_decoder(max_length=5), state_type=fd.TensorType((H,)))
    assert {fixed._row_count(n) for n in (64, 64, 64, 17)} == {64}
    # Padding rows generate nothing: they start as ended.
    padded, _ = generator._decode(params, _starts(8), None, 3, None, states=True)
    assert padded.lengths[3:].tolist() == [0] * 5 and padded.ended[3:].all()


def test_numpy_and_device_starts_share_one_compilation():
    generator = fd.Generator(_decoder(max_length=5), state_type=fd.TensorType((H,)))
    params = generator.init(jax.random.key(0))
    for n in (8, 3):  # 8 rows as they are, 3 padded to 8 and cut back
        on_host = generator.generate(params, _starts(n, seed=n), jax.random.key(1))
        on_device = generator.generate(params, jnp.asarray(_starts(n, seed=n)), jax.random.key(1))
        assert on_host.tokens.shape == on_device.tokens.shape == (n, 5)
        assert on_host.states.shape == (n, 6, H)
        for a, b in zip(on_host, on_device):
            np.testing.assert_array_equal(a, b)
        assert on_host.sequences() == [_reference(params, s, 5, jax.random.key(1), b)[0]
                                       for b, s in enumerate(_starts(n, seed=n))]
    assert generator._generate._cache_size() == 1


def test_generation_without_states_returns_the_same_sequences():
    generator = fd.Generator(_decoder(max_length=5), state_type=fd.TensorType((H,)))
    params = generator.init(jax.random.key(0))
    for n in (3, 8):
        with_states = generator.generate(params, _starts(n, seed=n), jax.random.key(2))
        without = generator.generate(params, _starts(n, seed=n), jax.random.key(2), states=False)
        assert without.states is None and without.tokens.shape == (n, 5)
        for a, b in zip(with_states[:-1], without[:-1]):
            np.testing.assert_array_equal(a, b)
    assert generator.apply(params, _starts(3), states=False).states is None


def test_bad_decoders_are_clear_errors():
    with pytest.raises(ValueError, match="max_length must be a positive int, got 0"):
        _decoder(max_length=0)
    with pytest.raises(ValueError, match="end_token must be a non-negative int"):
        _decoder(end_token=-1)
    with pytest.raises(TypeError, match="end_token 9 is not among its readout's 6 logits"):
        fd.Generator(_decoder(end_token=9), state_type=fd.TensorType((H,)))
    bad_readout = fd.SequenceDecoder(_step(), fd.Function(lambda s: s.sum(-1)), END, 4)
    with pytest.raises(TypeError, match="readout Function.* must return a float vector of logits"):
        fd.Generator(bad_readout, state_type=fd.TensorType((H,)))
    wrong_state = fd.SequenceDecoder(fd.Function(lambda s, y: s[:, :2]), fd.FC(V), END, 4)
    with pytest.raises(TypeError, match="next state"):
        fd.Generator(wrong_state, state_type=fd.TensorType((H,)))
    with pytest.raises(TypeError, match="tokens must be int scalars"):
        fd.Compiler.create(fd.Record((fd.Vector(H), fd.Map(fd.Scalar()))) >> _decoder() >> fd.Sum())


def test_blocks_that_choose_on_the_host_cannot_run_in_a_generation_step():
    chooses = fd.Record((fd.Identity(), fd.OneOf(lambda y: y, [fd.Embedding(V, 3), fd.Embedding(V, 3)]))) \
        >> fd.Concat() >> fd.FC(H)
    with pytest.raises(TypeError, match="OneOf.* decides on the host, but .* runs on the device"):
        fd.Generator(fd.SequenceDecoder(chooses, fd.FC(V), END, 4), state_type=fd.TensorType((H,)))
    # A constant is fine: it is the same for every row.
    constant = fd.AllOf(fd.Function(lambda s, y: s), fd.Void() >> fd.FromTensor(np.float32(0.5))) \
        >> fd.Function(lambda s, c: s * c[:, None])
    generator = fd.Generator(fd.SequenceDecoder(constant, fd.FC(V, activation=None, name="out"), END, 3),
                             state_type=fd.TensorType((H,)))
    params = generator.init(jax.random.key(0))
    params["out"]["b"] = params["out"]["b"].at[END].set(-1e4)
    np.testing.assert_allclose(generator.generate(params, _starts(2)).log_prob,
                               [sum(float(jax.nn.log_softmax((0.5 ** t * s) @ params["out"]["w"] + params["out"]["b"])
                                          .max()) for t in range(3)) for s in _starts(2)], rtol=1e-5)
    total = fd.Function(lambda s: s.sum(-1)) >> fd.Metric("m")
    metric = fd.Function(lambda s, y: s) >> fd.AllOf(fd.Identity(), total) >> fd.GetItem(0)
    with pytest.raises(TypeError, match="Metric.* cannot record inside .*, which runs on the device"):
        fd.Generator(fd.SequenceDecoder(metric, fd.FC(V), END, 4), state_type=fd.TensorType((H,)))
    shared = fd.Shared(fd.Function(lambda s, y: s))
    with pytest.raises(TypeError, match="Shared.* shares nodes by their input objects on the host"):
        fd.Generator(fd.SequenceDecoder(shared, fd.FC(V), END, 4), state_type=fd.TensorType((H,)))


def test_bad_start_states_and_keys_are_clear_errors():
    generator = fd.Generator(_decoder(), state_type=fd.TensorType((H,)))
    params = generator.init(jax.random.key(0))
    with pytest.raises(TypeError, match=r"start states of type TensorType\(\(3,\).*whose start state is"):
        generator.generate(params, np.zeros((2, 3), np.float32))
    with pytest.raises(ValueError, match="same, non-zero number of rows"):
        generator.generate(params, np.zeros((0, H), np.float32))
    with pytest.raises(TypeError, match="key must be a PRNG key"):
        generator.generate(params, _starts(2), key=3)
    with pytest.raises(TypeError, match="start state type of .* is not known"):
        fd.Generator(_decoder()).init(jax.random.key(0))
