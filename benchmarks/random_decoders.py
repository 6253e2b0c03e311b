"""Random decoders, each checked against a per-example plain-JAX decoder: the generation fuzz.

``random_decoder(seed)`` draws a ``fd.SequenceDecoder`` or a ``fd.TreeDecoder``: a state that is
a vector or an LSTM's ``(c, h)``, parts drawn from small productions (a dense tanh step, an LSTM
or GRU step, an element-wise function after it, a scaled readout), bounds (lengths, levels,
nodes) and arities drawn small enough that the bounds bite, and parameters pushed so that
structures vary. ``check(seed)`` then generates from random start states, greedy and sampled,
and compares with a reference that grows one example at a time in plain ``jax.numpy``, sharing
nothing with ``fd.Generator`` but the layers' ``apply`` on one row (as ``random_models`` does):
the structures must be equal and the log-probabilities within 1e-5 (relative). It also scores the
generated structures with the static model built from the same decoder (teacher forcing) and
checks those log-probabilities, and their gradient against ``jax.grad`` of the reference.

Run: ``python -m benchmarks.random_decoders --cases N`` (seeds from ``--first-seed``); writes
``benchmarks/results/random_decoders.json``. A case that fails or raises is recorded (its seed and
error) and the run goes on; JAX's caches are cleared every ``CLEAR_EVERY`` cases
(``benchmarks.common``), so a long run's memory stays flat.
"""

from __future__ import annotations

import argparse
import collections
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

import fold as fd
from benchmarks.common import add_device_flag, clear_caches_after, figure, save_results


class RandomDecoder(NamedTuple):
    decoder: fd.SequenceDecoder | fd.TreeDecoder
    state_type: fd.Type
    #: ``(params, state) -> next state or child state``, ``(params, state) -> logits`` per head, one row each.
    step: Callable[..., Any]
    heads: dict[str, Callable[[dict, Any], jax.Array]]
    tuple_state: bool
    width: int
    text: str
    #: Parameter pushes: per layer name and leaf, an amount added so structures vary.
    push: dict[str, dict[str, np.ndarray]]


def _fc(name: str, units: int, activation: Any = None) -> fd.FC:
    return fd.FC(units, activation=activation, name=name)


def random_decoder(seed: int) -> RandomDecoder:
    """A random decoder (see the module docstring)."""
    rng = np.random.default_rng(seed)
    width = int(rng.integers(2, 6))
    tuple_state = bool(rng.integers(2))
    post = [("none", lambda x: x), ("sin", jnp.sin), ("half", lambda x: 0.5 * x)][int(rng.integers(3))]
    tree = bool(rng.integers(2))
    state_type = (fd.TupleType(fd.TensorType((width,)), fd.TensorType((width,))) if tuple_state
                  else fd.TensorType((width,)))

    def hidden(s: Any) -> Any:
        return s[1] if tuple_state else s

    read = (lambda: fd.GetItem(1)) if tuple_state else (lambda: fd.Identity())
    if tree:
        arities = tuple(sorted({0, *rng.choice([1, 2, 3], size=int(rng.integers(1, 3)), replace=False).tolist()}))
        labels = int(rng.integers(2, 6))
        if tuple_state:
            cell = fd.LSTMCell(width, name="cell")
            child = fd.Function(lambda parent, sibling: (parent[1], sibling), name="parent_h") >> cell >> fd.GetItem(1)

            def step(p: dict, parent: Any, sibling: Any) -> Any:
                return cell.apply(p["cell"], parent[1][None], tuple(x[None] for x in sibling))[1]
        else:
            child = fd.Concat() >> _fc("cell", width, jnp.tanh) >> fd.Function(post[1], name=post[0])

            def step(p: dict, parent: Any, sibling: Any) -> Any:
                z = jnp.tanh(jnp.concatenate([parent, sibling]) @ p["cell"]["w"] + p["cell"]["b"])
                return post[1](z)[None]
        decoder = fd.TreeDecoder(child, read() >> _fc("arity", len(arities)), read() >> _fc("label", labels),
                                 arities=arities, max_levels=int(rng.integers(1, 5)),
                                 max_nodes=int(rng.integers(1, 25)))
        heads = {"arity": lambda p, s: hidden(s) @ p["arity"]["w"] + p["arity"]["b"],
                 "label": lambda p, s: hidden(s) @ p["label"]["w"] + p["label"]["b"]}
        push = {"arity": {"b": np.linspace(-0.5, 1.5, len(arities)).astype(np.float32)}}
        text = (f"TreeDecoder(arities={arities}, labels={labels}, levels={decoder.max_levels}, "
                f"nodes={decoder.max_nodes})")
    else:
        vocab = int(rng.integers(3, 7))
        emb = fd.Embedding(vocab, int(rng.integers(1, 4)), name="emb")
        if tuple_state:
            cell = fd.GRUCell(width, name="cell") if rng.integers(2) else fd.LSTMCell(width, name="cell")
            is_gru = isinstance(cell, fd.GRUCell)
            swap = fd.Function(lambda s, e: (e, s[1] if is_gru else s), name="token_first")
            body = fd.Record((fd.Identity(), emb)) >> swap >> cell >> fd.GetItem(1)
            seq_step = (fd.AllOf(fd.GetItem(0) >> fd.GetItem(0), body) >> fd.Function(
                lambda c, h: (c, h), name="keep_c")) if is_gru else body

            def step(p: dict, s: Any, token: int) -> Any:
                e = p["emb"]["table"][token][None]
                if is_gru:
                    return s[0][None], cell.apply(p["cell"], e, s[1][None])[1]
                return cell.apply(p["cell"], e, tuple(x[None] for x in s))[1]
        else:
            seq_step = (fd.Record((fd.Identity(), emb)) >> fd.Concat() >> _fc("cell", width, jnp.tanh)
                        >> fd.Function(post[1], name=post[0]))

            def step(p: dict, s: Any, token: int) -> Any:
                z = jnp.concatenate([s, p["emb"]["table"][token]]) @ p["cell"]["w"] + p["cell"]["b"]
                return post[1](jnp.tanh(z))[None]
        end = int(rng.integers(vocab))
        decoder = fd.SequenceDecoder(seq_step, read() >> _fc("out", vocab), end_token=end,
                                     max_length=int(rng.integers(1, 9)))
        heads = {"out": lambda p, s: hidden(s) @ p["out"]["w"] + p["out"]["b"]}
        push = {"out": {"b": np.where(np.arange(vocab) == end, -0.7, 0.0).astype(np.float32)}}
        text = f"SequenceDecoder(vocab={vocab}, end={end}, max_length={decoder.max_length})"
    kind = ("LSTM/GRU (c, h)" if tuple_state else f"dense>>{post[0]}") + f" state {width}"
    return RandomDecoder(decoder, state_type, step, heads, tuple_state, width, f"{text}, {kind}", push)


def _row(s: Any, b: int) -> Any:
    return jax.tree_util.tree_map(lambda a: a[b], s)


def _pick(logits: jax.Array, key: jax.Array | None, b: int, n: int, d: int) -> int:
    if key is None:
        return int(jnp.argmax(logits))
    return int(jax.random.categorical(jax.random.fold_in(jax.random.fold_in(jax.random.fold_in(key, b), n), d),
                                      logits))


def reference_sequence(m: RandomDecoder, p: dict, start: Any, key: jax.Array | None, b: int) -> tuple:
    """One example's sequence, token by token: (tokens, cut at max_length, log-probability)."""
    d = m.decoder
    assert isinstance(d, fd.SequenceDecoder)
    s, tokens, logp = start, [], 0.0
    for t in range(d.max_length):
        logits = m.heads["out"](p, s)
        y = _pick(logits, key, b, t, 0)
        logp += float(jax.nn.log_softmax(logits)[y])
        if y == d.end_token:
            return tokens, False, logp
        tokens.append(y)
        s = _row(m.step(p, s, y), 0)
    return tokens, True, logp


def reference_tree(m: RandomDecoder, p: dict, start: Any, key: jax.Array | None, b: int) -> tuple:
    """One example's tree, node by node with the decoder's queue: (tree, truncated, log-probability)."""
    d = m.decoder
    assert isinstance(d, fd.TreeDecoder)
    zeros = jax.tree_util.tree_map(jnp.zeros_like, start)
    state, depth, arity, label, kids = {0: start}, {0: 0}, {}, {}, collections.defaultdict(list)
    queue = collections.deque([(None, 0, None, 0)])
    count, refused, truncated, logp = 1, False, False, 0.0
    while queue:
        parent, position, sibling, n = queue.popleft()
        if parent is not None:
            state[n] = _row(m.step(p, state[parent], state[sibling] if sibling is not None else zeros), 0)
            depth[n] = depth[parent] + 1
            kids[parent].append(n)
        logits = m.heads["arity"](p, state[n])
        chosen = _pick(logits, key, b, n, 0)
        wants = d.arities[chosen]
        asks = wants if depth[n] < d.max_levels and not refused else 0
        granted = asks > 0 and count + asks <= d.max_nodes
        refused |= asks > 0 and not granted
        truncated |= wants > 0 and not granted
        arity[n] = wants if granted else 0
        logp += float(jax.nn.log_softmax(logits)[chosen if granted else d.arities.index(0)])
        if not granted:
            label_logits = m.heads["label"](p, state[n])
            label[n] = _pick(label_logits, key, b, n, 1)
            logp += float(jax.nn.log_softmax(label_logits)[label[n]])
        first = count
        count += arity[n]
        if parent is not None and position + 1 < arity[parent]:
            queue.append((parent, position + 1, n, n + 1))
        if granted:
            queue.append((n, 0, None, first))
    built: dict[int, Any] = {}
    for n in range(count - 1, -1, -1):
        built[n] = label[n] if arity[n] == 0 else tuple(built.pop(k) for k in kids[n])
    return built[0], truncated, logp


def check_generation(m: RandomDecoder, generator: fd.Generator, params: dict, starts: Any, key: jax.Array | None,
                     where: str) -> tuple[Any, list, np.ndarray]:
    """Generates from ``starts`` and compares every example with the reference (structure, flag,
    log-probability); raises ``Failure`` naming ``where``. Returns what ``generate`` returned,
    the structures and the flags (cut sequences, truncated trees)."""
    is_tree = isinstance(m.decoder, fd.TreeDecoder)
    reference = reference_tree if is_tree else reference_sequence
    out = generator.generate(params, starts, key)
    got = out.trees() if is_tree else out.sequences()
    flags = np.asarray(out.truncated) if is_tree else ~np.asarray(out.ended)
    for b in range(len(got)):
        want, flag, logp = reference(m, params, _row(starts, b), key, b)
        if got[b] != want or bool(flags[b]) != flag:
            raise Failure(f"{where}, {m.text}, key {key is not None}, example {b}: generated {got[b]!r} "
                          f"(flag {bool(flags[b])}), reference {want!r} (flag {flag})")
        if not np.isclose(float(out.log_prob[b]), logp, rtol=1e-5, atol=1e-5):
            raise Failure(f"{where}, {m.text}: log-probability {float(out.log_prob[b])} != {logp}")
    return out, got, flags


def _static_model(m: RandomDecoder) -> fd.Block:
    """The static model scoring ``(start state, structure)``: one vector per example, its
    decisions' log-probabilities summed."""
    vector = fd.Vector(m.width)
    start = fd.Record((vector, fd.Vector(m.width))) if m.tuple_state else vector
    structure = fd.Identity() if isinstance(m.decoder, fd.TreeDecoder) else fd.Map(fd.Scalar("int32"))
    return fd.Record((start, structure)) >> m.decoder >> fd.Sum()


class Failure(Exception):
    """A random decoder disagreed with its reference."""


def check(seed: int, examples: int = 5) -> dict[str, Any]:
    """Checks ``random_decoder(seed)`` (see the module docstring); raises ``Failure`` on a mismatch."""
    m = random_decoder(seed)
    compiler = fd.Compiler.create(_static_model(m))
    generator = fd.Generator(m.decoder)
    params = compiler.init(jax.random.key(seed))
    for layer, leaves in m.push.items():
        for leaf, amount in leaves.items():
            params[layer][leaf] = params[layer][leaf] + amount
    rng = np.random.default_rng(seed)
    starts_np = [(1.5 * rng.normal(size=(examples, m.width))).astype(np.float32)
                 for _ in range(2 if m.tuple_state else 1)]
    starts = tuple(starts_np) if m.tuple_state else starts_np[0]
    is_tree = isinstance(m.decoder, fd.TreeDecoder)
    flagged = 0
    for key in (None, jax.random.key(seed + 1)):
        out, got, flags = check_generation(m, generator, params, starts, key, f"seed {seed}")
        flagged += int(flags.sum())
        # Teacher forcing: the static model scores what was generated as generation did (a cut
        # sequence has no end: only complete ones are scored), with its gradient.
        keep = [b for b in range(examples) if is_tree or not flags[b]]
        if not keep:
            continue

        def row_values(b: int) -> Any:
            s = _row(starts, b)
            return tuple(np.asarray(x).tolist() for x in s) if m.tuple_state else np.asarray(s).tolist()

        batch = compiler.build_batch([(row_values(b), got[b]) for b in keep])
        scores = compiler.apply(params, batch).outputs
        if not np.allclose(np.asarray(scores), np.asarray(out.log_prob)[keep], rtol=1e-5, atol=1e-5):
            raise Failure(f"seed {seed}, {m.text}: static scores {np.asarray(scores)} != generated "
                          f"{np.asarray(out.log_prob)[keep]}")
        grads = jax.grad(lambda p: compiler.apply(p, batch).outputs.sum())(params)
        want_grads = jax.grad(lambda p: sum(score(m, p, _row(starts, b), got[b]) for b in keep))(params)
        for layer in want_grads:
            for leaf in want_grads[layer]:
                if not np.allclose(grads[layer][leaf], want_grads[layer][leaf], rtol=1e-4, atol=1e-5):
                    raise Failure(f"seed {seed}, {m.text}: gradient of {layer}/{leaf} differs from the reference's")
    return {"seed": seed, "decoder": m.text, "flagged": flagged}


def score(m: RandomDecoder, p: dict, start: Any, structure: Any) -> jax.Array:
    """The reference log-probability of a known structure (differentiable in ``p``)."""
    if isinstance(m.decoder, fd.SequenceDecoder):
        s, total = start, 0.0
        for i, y in enumerate([*structure, m.decoder.end_token]):
            total += jax.nn.log_softmax(m.heads["out"](p, s))[y]
            if i < len(structure):  # every given token steps, whatever its value (teacher forcing)
                s = _row(m.step(p, s, y), 0)
        return total
    arities = m.decoder.arities
    zeros = jax.tree_util.tree_map(jnp.zeros_like, start)

    def node(tree: Any, s: Any) -> jax.Array:
        kids = tree if isinstance(tree, tuple) else ()
        total = jax.nn.log_softmax(m.heads["arity"](p, s))[arities.index(len(kids))]
        if not kids:
            return total + jax.nn.log_softmax(m.heads["label"](p, s))[tree]
        sibling = zeros
        for kid in kids:
            sibling = _row(m.step(p, s, sibling), 0)
            total += node(kid, sibling)
        return total

    return node(structure, start)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", type=int, default=200)
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--json", default=None, help="results path (default benchmarks/results/random_decoders.json)")
    add_device_flag(p)
    args = p.parse_args(argv)
    args.quick = False
    start, results, failures = time.perf_counter(), [], []
    for done, seed in enumerate(range(args.first_seed, args.first_seed + args.cases), 1):
        try:
            results.append(check(seed))
        except Exception as e:  # a mismatch or any error is a finding; the run goes on
            failures.append(str(e) if isinstance(e, Failure) else f"seed {seed}: {type(e).__name__}: {e}")
            print(f"FAILURE {failures[-1]}", flush=True)
        clear_caches_after(done)
        if done % 20 == 0:
            print(f"{done}/{args.cases} decoders, {len(failures)} failures", flush=True)
    kinds = collections.Counter(r["decoder"].split("(")[0] for r in results)
    result = {"first_seed": args.first_seed, "cases": args.cases, "failures": failures, "kinds": dict(kinds),
              "flagged_examples": sum(r["flagged"] for r in results), "seconds": time.perf_counter() - start}
    print(f"{args.cases} random decoders ({dict(kinds)}), {len(failures)} failures, "
          f"{result['flagged_examples']} examples cut by a bound")

    def plot(path: Any) -> None:
        with figure(path) as ax:
            ax.bar(list(kinds), list(kinds.values()))
            ax.set_title(f"random decoders checked: {len(failures)} failures")

    save_results("random_decoders", result, args, plot)
    return result


if __name__ == "__main__":
    main()
