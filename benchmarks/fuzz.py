"""Differential fuzzing: random models against their independent per-example references.

Each case draws a random well-typed model over every kind of block (``random_model(..., rich=True,
users=True, every=True)``: pooling, folds, RNN cells, reductions, recursion over trees, ``OneOf``,
zips, broadcasts, n-grams, slices, ``Optional``, host transforms, ``Composition``, ``Metric``,
constants, a custom layer, ``Softmax``, ``Void``, ...), six examples for it, a chunk size ``C`` (or
candidates), a backward mode, recorded or walked examples and a batch size, builds the examples'
batches with ``compiler.batches`` and compares every batch's outputs, metric values and gradients
with the reference, which evaluates one example at a time in plain ``jax.numpy`` and shares nothing
with the scheduler or the executor. An exception is a failure too. A results file records each
part's grammar (``GRAMMARS``: ``rich`` lacks ``Composition``, ``Metric``, constants and custom
layers, ``users`` lacks ``Softmax``, ``OneHotFromList``, rank-2 ``Tensor`` and ``Void``, ``every``
lacks ``Shared`` recursions over DAG inputs and generation blocks, which ``shared`` and
``decoders`` add; parts from before grammars were recorded are ``rich``)
and its failed cases theirs: ``--resume`` keeps the last part's unless ``--grammar`` says
otherwise, and a failed case runs again with its own, so that a seed always draws the model it drew.

Run: ``python -m benchmarks.fuzz --cases 10000`` (results in ``benchmarks/results/fuzz.json``,
saved every ``SAVE_EVERY`` cases and on Ctrl-C or SIGTERM, every mismatch with the seed and grammar
that reproduce it: ``python -m benchmarks.fuzz --case SEED --grammar GRAMMAR``). A long run may be
done in parts: ``--resume`` first runs the cases the results file records as failed again (those
that pass move to ``fixed_cases``, with the error they had), then continues the run from its next
seed until it holds ``--cases`` cases; ``--jobs N`` runs N cases at once in worker processes
(results stay in seed order).
``tests/test_fuzz.py`` runs a few cases drawn by ``hypothesis`` in the suite.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import multiprocessing
import pathlib
import re
import signal
import subprocess
import time
import traceback
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

import fold as fd
from benchmarks.common import RESULTS, add_device_flag, clear_caches_after, machine
from benchmarks.random_models import RandomModel, random_model
from examples.common import COUNT, NATURAL

MODES = ("save", "auto", "recompute")
# The grammars of ``random_model`` a run may draw from: each of the first three adds productions to
# the one before, ``shared`` and ``decoders`` each add theirs to ``every``.
GRAMMARS = ("rich", "users", "every", "shared", "decoders")
# What a new run draws from: ``shared`` models all recurse over DAGs, so the broadest is ``every``.
DEFAULT_GRAMMAR = "every"
CHUNKS: tuple[int | tuple[int, ...], ...] = (8, 16, 32, 128, 512, (32, 128, 512))
# Cases between saves of the results file during a run.
SAVE_EVERY = 20
# Tolerances of float32 batched against per-example evaluation (sums in another order). The absolute
# ones scale with the largest magnitude of the array compared (at least 1): an entry that comes out
# of cancellation carries the rounding of the terms it came from (seed 1813, docs/design.md: there the
# float32 reference was further from float64 than the batch).
RTOL, ATOL, GRAD_RTOL, GRAD_ATOL = 1e-5, 1e-5, 1e-4, 2e-5


class Case(NamedTuple):
    """One fuzz case: everything that decides it, so that it reruns exactly."""

    seed: int
    chunk: int | tuple[int, ...]
    backward: str
    recorded: bool
    batch_size: int
    wide: bool
    grammar: str = "rich"  # one of GRAMMARS

    @classmethod
    def draw(cls, seed: int, grammar: str = "rich") -> Case:
        rng = np.random.default_rng([seed, 1])
        return cls(seed, CHUNKS[int(rng.integers(len(CHUNKS)))], MODES[int(rng.integers(len(MODES)))],
                   bool(rng.random() < 0.5), int(rng.integers(1, 7)), bool(rng.random() < 0.15), grammar)


def random_params(compiler: fd.Compiler, seed: int) -> dict:
    """``compiler.init``'s parameters moved off the kinks: each float entry plus noise of scale 0.1.

    Where ``init`` gives zero biases, distinct paths compute exactly equal values (``tanh(W·0 + 0)``
    and an empty ``Sum``'s zeros, say), so ``Max`` and ``Min`` meet exact ties, where the gradient
    is not unique: fold's pairwise tree and ``jnp.max``'s equal split then give different, equally
    valid, subgradients (seed 1021). Random parameters make such ties improbable. The noise comes
    from NumPy: ``jax.random`` compiled once per new shape, a tenth of a case's time."""
    rng = np.random.default_rng([seed, 3])

    def move(x: jax.Array) -> jax.Array:
        if not jnp.issubdtype(x.dtype, jnp.floating):
            return x
        return jnp.asarray(np.asarray(x, np.float64) + 0.1 * rng.standard_normal(x.shape), x.dtype)

    return jax.tree_util.tree_map(move, compiler.init(jax.random.key(seed)))


def assert_close(actual: Any, expected: Any, rtol: float, atol: float, where: str) -> None:
    """``assert_allclose`` with ``atol`` scaled by ``expected``'s largest magnitude (at least 1)."""
    expected = np.asarray(expected)
    scale = max(1.0, float(np.abs(expected).max())) if expected.size else 1.0
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol * scale, err_msg=where)


def comparer(compiler: fd.Compiler, model: RandomModel, seed: int = 0) -> Callable[..., None]:
    """``compare(params, batch, examples, where)`` asserts that ``batch``'s outputs and metric
    values, and the gradients of a loss on both, equal ``model``'s reference, evaluated on
    ``examples`` (the batch's examples, in order) one at a time. The batched step is jitted once
    per compiler, so batches that share a layout share its compilation, as in training.

    The loss sums over the metrics' values, so it does not depend on their order; the values are
    compared per example, each example's sorted (fold orders them by the walk, the reference by
    its own recursion)."""
    rng = np.random.default_rng(seed)
    weights = jnp.asarray(rng.normal(size=compiler.program.output_type.shape), jnp.float32)
    metric_weights = {name: jnp.asarray(rng.normal(size=width), jnp.float32) for name, width in model.metrics.items()}

    def loss(out: jax.Array, metrics: dict) -> jax.Array:
        return jnp.sum(jnp.sin(out * weights)) + sum(jnp.sum(jnp.sin(v * metric_weights[name]))
                                                     for name, v in metrics.items())

    def batched(p: dict, b: fd.Batch) -> tuple:
        result = compiler.apply(p, b)
        padded = {name: result.metrics[name].padded for name in model.metrics}  # padded entries are zeros
        examples = {name: result.metrics[name].example for name in model.metrics}
        return loss(result.outputs, padded), (result.outputs, padded, examples)

    def unbatched(p: dict, examples: list) -> tuple:
        out, tapes = zip(*(model.reference_and_metrics(p, e) for e in examples)) if examples else ((), ())
        values = {name: [jnp.stack(tape[name]) if tape[name] else jnp.zeros((0, width)) for tape in tapes]
                  for name, width in model.metrics.items()}
        return sum(loss(o, {n: v[i] for n, v in values.items()}) for i, o in enumerate(out)), (jnp.stack(out), values)

    step = jax.jit(jax.grad(batched, has_aux=True))

    def compare(params: dict, batch: fd.Batch, examples: list, where: str) -> None:
        grads, (out, padded, owners) = step(params, batch)
        expected_grads, (expected, values) = jax.grad(unbatched, has_aux=True)(params, examples)
        assert_close(out, expected, RTOL, ATOL, where)
        for name, per_example in values.items():
            owner = np.asarray(owners[name])
            for i, want in enumerate(per_example):
                got = np.asarray(padded[name])[owner == i]
                assert_close(_sorted_rows(got), _sorted_rows(np.asarray(want)), RTOL, ATOL,
                             f"{where}: metric {name!r} of example {i}")
        assert jax.tree_util.tree_structure(grads) == jax.tree_util.tree_structure(expected_grads), where
        for (path, g), ref in zip(jax.tree_util.tree_leaves_with_path(grads),
                                  jax.tree_util.tree_leaves(expected_grads)):
            assert_close(g, ref, GRAD_RTOL, GRAD_ATOL, f"{where}: {jax.tree_util.keystr(path)}")

    return compare


def _sorted_rows(rows: np.ndarray) -> np.ndarray:
    """``rows`` ([n, width]) sorted by their first column, then their second, ..."""
    return rows[np.lexsort(rows.T[::-1])] if rows.size else rows.reshape(0, *rows.shape[1:])


def run_case(case: Case) -> tuple[str, int]:
    """Runs ``case``; returns the model's description and how many examples were compared with the
    reference. Raises on any mismatch or error."""
    level = GRAMMARS.index(case.grammar)
    # ``shared`` and ``decoders`` each add to ``every``, not to each other.
    model = random_model(case.seed, n=6, rich=True, wide=case.wide, users=level >= 1, every=level >= 2,
                         shared=case.grammar == "shared", decoders=case.grammar == "decoders")
    where = f"{model.text} ({case})"
    compiler = fd.Compiler.create(model.block, backward=case.backward, chunk_size=case.chunk)
    params = random_params(compiler, case.seed)
    order = np.random.default_rng([case.seed, 2]).permutation(len(model.examples))
    examples = [model.examples[i] for i in order]
    source = compiler.record(examples) if case.recorded else examples
    compare = comparer(compiler, model, case.seed)
    compared = 0
    for k, batch in enumerate(compiler.batches(source, case.batch_size)):
        part = [examples[i] for i in batch.example_indices]
        compare(params, batch, part, f"{where}, batch {k}")
        compared += len(part)
    for check in model.checks:  # the decoders' generation, with the same parameters
        check(params)
    return model.text, compared


_cases_in_process = itertools.count(1)


def outcome(drawn: tuple[int, str]) -> tuple[Case, str, dict | None, float]:
    """The case of ``drawn`` (a seed and a grammar), run:
    its model's description and None, or its failure (a mismatch or any error is a finding), and
    the seconds it took. Clears JAX's caches every ``CLEAR_EVERY`` cases of this process
    (``benchmarks.common.clear_caches_after``)."""
    case, start = Case.draw(*drawn), time.perf_counter()
    try:
        text, failure = run_case(case)[0], None
    except Exception as e:
        text, failure = "", {"case": case._asdict(), "error": f"{type(e).__name__}: {e}"[:2000],
                             "traceback": traceback.format_exc()[-3000:]}
    clear_caches_after(next(_cases_in_process))
    return case, text, failure, time.perf_counter() - start


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _blocks(text: str) -> list[str]:
    """The block names a model's description mentions."""
    return sorted(set(re.findall(r"[A-Z][A-Za-z]+", text)))


def _checkout_version(root: pathlib.Path) -> str | None:
    """The git commit of the checkout at ``root``, ``-modified`` appended when its ``fold/`` or
    ``benchmarks/`` (but its results) differ from it; None outside a git checkout."""
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                                check=True).stdout.strip()
        # Results files (this run's own among them) are not code.
        changed = subprocess.run(["git", "status", "--porcelain", "--", "fold", "benchmarks",
                                  ":(exclude)benchmarks/results"], cwd=root,
                                 capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return commit + ("-modified" if changed else "")


def source_version() -> str | None:
    """The git commit of the code a run tests, ``-modified`` appended when ``fold/`` or
    ``benchmarks/`` (but its results) differ from it; None outside a git checkout. Where the
    ``fold`` package the cases import is another checkout's than this file's (an editable install
    of another working tree), the version is that checkout's, then ``+benchmarks`` and this
    one's. A long run done in parts records one per part: a claim over many cases holds for the
    code each part ran."""
    here = pathlib.Path(__file__).resolve().parents[1]
    there = pathlib.Path(fd.__file__).resolve().parents[1]
    if there == here:
        return _checkout_version(here)
    return f"{_checkout_version(there)}+benchmarks {_checkout_version(here)}"


def _load(path: pathlib.Path) -> dict:
    """A results file's state, to continue the run it records from its next seed."""
    try:
        result = json.loads(path.read_text())
        return {"first_seed": int(result["first_seed"]), "cases_run": int(result["cases_run"]),
                "seconds": float(result["seconds"]),
                "case_seconds": float(result.get("case_seconds", result["seconds"])),
                "block_counts": dict(result["block_counts"]), "mode_counts": dict(result["mode_counts"]),
                "failed_cases": list(result["failed_cases"]), "fixed_cases": list(result.get("fixed_cases", [])),
                # Files from before parts were recorded: one part of unrecorded code.
                "parts": [{**{k: v for k, v in part.items() if k != "users"}, "grammar": _grammar(part)}
                          for part in result.get("parts", [{"first_seed": int(result["first_seed"]),
                                                            "cases": int(result["cases_run"]), "code": None}])]}
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SystemExit(f"--resume: cannot continue from {path}: {type(e).__name__}: {e}") from None


def _grammar(recorded: dict) -> str:
    """The grammar of a part or a case in a results file: from before the ``every`` grammar, they
    said whether they had the users' productions; from before that, nothing (``rich``)."""
    return recorded.get("grammar") or ("users" if recorded.get("users") else "rich")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_device_flag(p)
    p.add_argument("--cases", type=COUNT, default=200, help="cases the run should reach in total")
    p.add_argument("--first-seed", type=NATURAL, default=0,
                   help="seed of the first case (cases take consecutive seeds)")
    p.add_argument("--case", type=NATURAL, default=None, help="rerun the case of this seed only, printing its error")
    p.add_argument("--json", default=None, help="results file (default benchmarks/results/fuzz.json)")
    p.add_argument("--jobs", type=COUNT, default=1,
                   help="cases run at once, each in a process of its own (a case compiles on one core)")
    p.add_argument("--resume", action="store_true",
                   help="run the results file's failed cases again, then continue its run from its next seed, "
                        "adding to its counts")
    p.add_argument("--grammar", choices=GRAMMARS, default=None,
                   help="'users' adds Composition, Metric, FromTensor and a custom layer to 'rich', 'every' "
                        "Softmax, OneHotFromList, Tensor and Void to 'users'; 'shared' makes every model a Shared "
                        "recursion over DAG inputs, leaves from 'every'; 'decoders' makes every model a sequence or "
                        "tree decoder scoring a known structure, start states from 'every' (default: the resumed "
                        "file's last part's, else 'every')")
    args = p.parse_args()
    if args.case is not None:
        case = Case.draw(args.case, args.grammar or DEFAULT_GRAMMAR)
        print(case)
        text, compared = run_case(case)
        print(f"{text}\nok: {compared} examples match the reference")
        return
    path = pathlib.Path(args.json) if args.json else RESULTS / "fuzz.json"
    state = _load(path) if args.resume else {"first_seed": args.first_seed, "cases_run": 0, "seconds": 0.0,
                                             "case_seconds": 0.0, "block_counts": {}, "mode_counts": {},
                                             "failed_cases": [], "fixed_cases": [], "parts": []}
    grammar = args.grammar or (state["parts"][-1]["grammar"] if state["parts"] else DEFAULT_GRAMMAR)
    first, earlier = state["first_seed"], state["cases_run"]
    if earlier >= args.cases:
        raise SystemExit(f"{path} already holds {earlier} cases (seeds {first}-{first + earlier - 1}); "
                         "ask for more with --cases")
    failures: list[dict] = state["failed_cases"]
    fixed: list[dict] = state["fixed_cases"]
    blocks = collections.Counter(state["block_counts"])
    modes = collections.Counter(state["mode_counts"])
    path.parent.mkdir(parents=True, exist_ok=True)
    start, done, case_seconds = time.perf_counter(), earlier, state["case_seconds"]
    progress = tqdm(desc="fuzz", unit="case", initial=earlier, total=args.cases)
    part = {"first_seed": first + earlier, "code": source_version()}

    def save() -> None:
        # Each case's worker imports the code afresh: an edit or checkout during the part is on record.
        if (now := source_version()) != part["code"] and part.get("code_changed") != now:
            progress.write(f"the code changed during this part: {part['code']} -> {now}")
            part["code_changed"] = now
        seconds = state["seconds"] + time.perf_counter() - start
        result = {
            "first_seed": first, "cases_run": done, "cases_asked": args.cases, "failures": len(failures),
            # seconds: the run's wall time; case_seconds: the cases' own, summed over jobs (a paused
            # run's pause counts in the first only).
            "seconds": round(seconds, 1), "case_seconds": round(case_seconds, 1),
            "seconds_per_case": round(case_seconds / max(done, 1), 2),
            "block_counts": dict(sorted(blocks.items())), "mode_counts": dict(sorted(modes.items())),
            "failed_cases": failures, "fixed_cases": fixed,
            # parts: the run's parts, each with the code it tested (source_version) and its grammar.
            # A part whose code changed while it ran has ``code_changed``: the last code seen.
            "parts": state["parts"] + [{"first_seed": part["first_seed"], "cases": done - earlier,
                                        "code": part["code"], "grammar": grammar,
                                        **({"code_changed": part["code_changed"]} if "code_changed" in part
                                           else {})}], "machine": machine(),
        }
        path.write_text(json.dumps(result, indent=2) + "\n")

    seeds = range(first + earlier, first + args.cases)
    # SIGTERM (kill, or a job scheduler's stop) saves like Ctrl-C; a run started in the background
    # by a shell ignores SIGINT.
    signal.signal(signal.SIGTERM, _interrupt)
    # Cases run in worker processes even with --jobs 1: a stop then never interrupts JAX inside this
    # process (an interrupt in the middle of a compilation could crash the interpreter's exit, after
    # the results were saved), and the workers, which ignore Ctrl-C, are terminated with the pool.
    pool = multiprocessing.get_context("spawn").Pool(args.jobs, initializer=signal.signal,
                                                     initargs=(signal.SIGINT, signal.SIG_IGN))
    try:
        # The cases that failed are run again first: one that passes with the current code moves to
        # the fixed cases, with the error it had; one that still fails keeps its place.
        recorded, failures[:] = list(failures), []
        again = pool.imap(outcome, [(f["case"]["seed"], _grammar(f["case"])) for f in recorded])
        for old, (case, _, failure, _) in zip(recorded, again):
            if failure is None:
                fixed.append(old)
                progress.write(f"case {case.seed}: passes now (moved to fixed_cases)")
            else:
                failures.append(failure)
        # Pool.imap hands results back in seed order, so the cases done are always a prefix.
        for case, text, failure, took in pool.imap(outcome, [(seed, grammar) for seed in seeds]):
            if failure is None:
                blocks.update(_blocks(text))
            else:
                failures.append(failure)
                progress.write(f"case {case.seed}: {failure['error'].split(':')[0]}")
            case_seconds += took
            modes[f"backward={case.backward}"] += 1
            modes["recorded" if case.recorded else "walked"] += 1
            done += 1
            progress.update()
            progress.set_postfix(failures=len(failures))
            if done % SAVE_EVERY == 0:
                save()  # a long run that is stopped keeps what it found
    except KeyboardInterrupt:
        print(f"\nstopped after {done} cases; continue with --resume")
    finally:
        pool.terminate()
        progress.close()
    save()
    print(f"{done} cases (seeds {first}-{first + done - 1}), {len(failures)} failures, "
          f"{state['seconds'] + time.perf_counter() - start:.0f} s in all; results written to {path}")


if __name__ == "__main__":
    main()
