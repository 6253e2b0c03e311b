"""Differential fuzzing in the suite: random models over every kind of block, drawn by hypothesis
with random C, backward mode, recorded or walked examples and batch size, against their
independent per-example references (``benchmarks/fuzz.py`` runs the long version)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.fuzz import CHUNKS, MODES, Case, run_case


# derandomize: CI runs the same cases every time (a failure reproduces); the long run draws others.
@settings(max_examples=1, deadline=None, derandomize=True, database=None)
@given(seed=st.integers(0, 2**20), chunk=st.sampled_from(CHUNKS), backward=st.sampled_from(MODES),
       recorded=st.booleans(), batch_size=st.integers(1, 6))
def test_random_models_match_their_reference(seed, chunk, backward, recorded, batch_size):
    """``run_case`` asserts outputs and gradients against the per-example reference batch by batch;
    every example must have been compared."""
    text, compared = run_case(Case(seed, chunk, backward, recorded, batch_size, wide=False, grammar="every"))
    assert compared == 6 and text


def test_metric_values_and_their_count_are_compared_per_example():
    """Seed 4 of the users' grammar (a ``Composition`` with a constant, a value read twice and a
    metric, over a custom ``Gate`` layer, under ``Optional``) matches its reference; a reference
    that records a metric value wrongly, or one value too many, fails the comparison: the check
    that found the references of ``Nth`` and ``Zip`` skipping items their maps run on."""
    import numpy as np

    import fold as fd
    from benchmarks.fuzz import comparer, random_params
    from benchmarks.random_models import random_model

    model = random_model(4, n=6, rich=True, users=True)
    assert all(f"{name}(" in model.text for name in ("Composition", "Gate", "Metric", "Optional"))
    compiler = fd.Compiler.create(model.block)
    params = random_params(compiler, 4)
    examples = [e for e in model.examples if e is not None][:3]
    batch = compiler.build_batch(examples)
    comparer(compiler, model, 4)(params, batch, examples, "right")

    def wrong(by: float, extra: bool):
        def evaluate(p, x):
            out, metrics = model.evaluate(p, x)
            values = [v + by for v in metrics["m0"]] + ([metrics["m0"][0]] if extra and metrics["m0"] else [])
            return out, {"m0": values}
        return model._replace(evaluate=evaluate)

    with pytest.raises(AssertionError, match="metric 'm0' of example 0"):
        comparer(compiler, wrong(1e-3, False), 4)(params, batch, examples, "shifted")
    with pytest.raises(AssertionError, match="metric 'm0' of example 0"):
        comparer(compiler, wrong(0.0, True), 4)(params, batch, examples, "one too many")
    assert np.asarray(compiler.apply(params, batch).metrics["m0"].count()) == len(examples)


@pytest.mark.slow  # a whole fuzz case in six modes; the fuzz run and -m slow replay it
def test_a_case_with_ties_under_init_params_matches():
    """Seed 1021 (``Max`` over ``tanh(b)`` with zero biases and an empty ``Sum``'s zeros) failed
    while cases used ``init``'s parameters: exact ties, where fold's pairwise tree and the
    reference's ``jnp.max`` pick different subgradients. Cases now draw parameters off the kinks."""
    assert run_case(Case.draw(1021))[1] == 6


def test_float32_rounding_of_a_cancelling_output_is_no_mismatch():
    """Seed 1813's one mismatching output under an unscaled ``atol`` of 1e-6: batched 0.0910990,
    reference 0.0910967, float64 truth 0.0910982, in outputs of magnitude up to 1. The tolerance
    scales with the outputs' magnitude; a difference a hundred times larger still fails."""
    import numpy as np

    from benchmarks.fuzz import ATOL, RTOL, assert_close

    expected = np.array([0.5162, -0.9989, 0.0910967], np.float32)
    assert_close(expected + np.array([0, 0, 2.3e-6], np.float32), expected, RTOL, ATOL, "seed 1813")
    with pytest.raises(AssertionError, match="seed 1813"):
        assert_close(expected + np.array([0, 0, 2.3e-4], np.float32), expected, RTOL, ATOL, "seed 1813")
    with pytest.raises(AssertionError):  # atol scaled by 1,000 here: 1e-2, and 0.02 is beyond it
        assert_close(np.float32([1000.0, 0.12]), np.float32([1000.0, 0.1]), RTOL, ATOL, "")


@pytest.mark.slow  # a whole fuzz case in six modes
def test_seed_1813_matches():
    """The case whose output differed from the reference by float32 rounding (above)."""
    assert run_case(Case.draw(1813))[1] == 6


def test_seed_19469_compiles_and_matches():
    """Seed 19469 of the ``every`` grammar (C 8, ``backward="save"``, loop weight cotangents item
    by item) did not compile on the CPU: XLA turned the one-row items' input gathers into
    ``dynamic-slice`` instructions reading their start from JAX's ``dynamic_slice`` of the item's
    indices, a fusion its emitter miscompiles (``take_rows`` now slices one row itself)."""
    case = Case.draw(19469, "every")
    assert (case.chunk, case.backward) == (8, "save")
    assert run_case(case)[1] == 6


def test_a_metric_in_a_void_branch_records_every_example():
    """Seed 5812 of the ``every`` grammar drops a branch with ``Void`` whose ``Composition``
    records a metric: the branch still runs, so every example records its value, and the values
    and their gradients (the loss sums over them) match the reference, which runs the branch too."""
    import numpy as np

    import fold as fd
    from benchmarks.fuzz import random_params
    from benchmarks.random_models import random_model

    model = random_model(5812, n=6, rich=True, users=True, every=True)
    assert model.text.startswith("AllOf(") and "Void(Composition(" in model.text and "Metric(m0)" in model.text
    assert run_case(Case.draw(5812, "every"))[1] == 6
    compiler = fd.Compiler.create(model.block)
    params = random_params(compiler, 5812)
    values = compiler.apply(params, compiler.build_batch(model.examples)).metrics["m0"]
    # Real entries come first, ordered by example: one per example.
    assert np.asarray(values.example)[np.asarray(values.mask)].tolist() == list(range(6))
    expected = [model.evaluate(params, x)[1]["m0"] for x in model.examples]
    assert all(len(v) == 1 for v in expected)
    np.testing.assert_allclose(np.asarray(values.values), np.stack([v[0] for v in expected]), rtol=1e-5)


@pytest.mark.slow  # 30 s; the long fuzz runs themselves resume this way
def test_a_long_run_continues_from_its_results_file(tmp_path, monkeypatch, capsys):
    """``--resume`` runs the recorded failures again (one that passes now moves to the fixed cases),
    then continues the recorded run from its next seed and adds to its counts, here with two cases
    at once in two processes; a run that already holds the cases asked for says so instead of
    running again."""
    import json
    import sys

    from benchmarks import fuzz

    path = tmp_path / "fuzz.json"
    monkeypatch.setattr(sys, "argv", ["fuzz", "--first-seed", "3", "--cases", "1", "--json", str(path)])
    fuzz.main()
    first = json.loads(path.read_text())
    assert (first["first_seed"], first["cases_run"], first["failures"], first["fixed_cases"]) == (3, 1, 0, [])
    # As if case 3 had failed with an earlier version of the code.
    old_failure = {"case": {"seed": 3}, "error": "AssertionError: an earlier mismatch", "traceback": ""}
    path.write_text(json.dumps({**first, "failures": 1, "failed_cases": [old_failure]}))
    monkeypatch.setattr(sys, "argv", ["fuzz", "--resume", "--cases", "3", "--jobs", "2", "--json", str(path)])
    fuzz.main()
    second = json.loads(path.read_text())
    assert (second["first_seed"], second["cases_run"], second["failures"]) == (3, 3, 0)
    assert second["failed_cases"] == [] and second["fixed_cases"] == [old_failure]
    assert 0 < first["case_seconds"] < second["case_seconds"]
    # Each part records the code it ran: this checkout's commit.
    assert [(q["first_seed"], q["cases"]) for q in second["parts"]] == [(3, 1), (4, 2)]
    assert all(q["code"] == fuzz.source_version() for q in second["parts"])
    assert fuzz.source_version() is None or len(fuzz.source_version().split("-")[0]) == 40
    assert sum(second["mode_counts"].get(k, 0) for k in ("recorded", "walked")) == 3
    assert "seeds 3-5" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="already holds 3 cases"):
        fuzz.main()
    monkeypatch.setattr(sys, "argv", ["fuzz", "--resume", "--json", str(tmp_path / "missing.json")])
    with pytest.raises(SystemExit, match="cannot continue"):
        fuzz.main()


def test_the_version_names_the_checkout_the_cases_import_fold_from(tmp_path, monkeypatch):
    from benchmarks import fuzz

    mine = fuzz.source_version()
    # fold imported from elsewhere (an editable install of another tree; here, no checkout at all).
    (tmp_path / "fold").mkdir()
    monkeypatch.setattr(fuzz.fd, "__file__", str(tmp_path / "fold" / "__init__.py"))
    assert fuzz.source_version() == f"None+benchmarks {mine}"


@pytest.mark.slow  # 20 s: one case in a worker process
def test_a_part_whose_code_changes_while_it_runs_says_so(tmp_path, monkeypatch):
    import json
    import sys

    from benchmarks import fuzz

    versions = iter(["a" * 40, "b" * 40])
    monkeypatch.setattr(fuzz, "source_version", lambda: next(versions, "b" * 40))
    path = tmp_path / "fuzz.json"
    monkeypatch.setattr(sys, "argv", ["fuzz", "--first-seed", "3", "--cases", "1", "--json", str(path)])
    fuzz.main()
    [part] = json.loads(path.read_text())["parts"]
    assert (part["code"], part["code_changed"]) == ("a" * 40, "b" * 40)


def test_an_error_in_a_case_is_a_recorded_finding(monkeypatch):
    from benchmarks import fuzz

    def broken(case):
        raise ValueError("schedule out of bounds")

    monkeypatch.setattr(fuzz, "run_case", broken)
    case, text, failure, seconds = fuzz.outcome((12, "users"))
    assert case == fuzz.Case.draw(12, "users") and text == "" and seconds >= 0
    assert failure["case"]["seed"] == 12 and failure["error"] == "ValueError: schedule out of bounds"
    assert "broken" in failure["traceback"]


def test_a_terminated_run_saves_what_it_found(tmp_path):
    """SIGTERM stops a long run like Ctrl-C: the results file keeps the cases done, for --resume."""
    import json
    import signal
    import subprocess
    import sys
    import time

    path = tmp_path / "fuzz.json"
    run = subprocess.Popen([sys.executable, "-m", "benchmarks.fuzz", "--first-seed", "3", "--cases", "200",
                            "--json", str(path)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    time.sleep(12)  # imports and at least the start of the first case
    run.send_signal(signal.SIGTERM)
    out, _ = run.communicate(timeout=120)
    assert run.returncode == 0, out
    assert "continue with --resume" in out
    result = json.loads(path.read_text())
    assert result["first_seed"] == 3 and 0 <= result["cases_run"] < 200 and result["failures"] == 0


def test_a_results_file_from_before_parts_is_one_rich_part_of_unrecorded_code(tmp_path):
    import json

    from benchmarks import fuzz

    path = tmp_path / "fuzz.json"
    path.write_text(json.dumps({"first_seed": 0, "cases_run": 7, "seconds": 1.0, "block_counts": {},
                                "mode_counts": {}, "failed_cases": []}))
    assert fuzz._load(path)["parts"] == [{"first_seed": 0, "cases": 7, "code": None, "grammar": "rich"}]


def test_a_run_records_each_parts_grammar(tmp_path, monkeypatch):
    """A new run draws from the ``every`` grammar; a part resumed without ``--grammar`` keeps the
    last part's; a file from before grammars were recorded was the rich grammar's, and one from
    before ``every`` said ``"users"`` of its parts and cases. A failed case runs again with its own
    grammar whatever the new part's."""
    import json
    import sys

    from benchmarks import fuzz

    ran = []  # the cases run, as (seed, grammar); they run in this process and pass at once
    monkeypatch.setattr(fuzz, "run_case", lambda case: (ran.append((case.seed, case.grammar)), ("Map(Sum)", 6))[1])
    monkeypatch.setattr(fuzz.multiprocessing, "get_context", lambda method: _InProcess)

    def run(*argv: str) -> None:
        monkeypatch.setattr(sys, "argv", ["fuzz", *argv])
        fuzz.main()

    path = tmp_path / "fuzz.json"
    run("--first-seed", "4", "--cases", "1", "--json", str(path))
    assert [q["grammar"] for q in json.loads(path.read_text())["parts"]] == ["every"]
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"first_seed": 4, "cases_run": 1, "seconds": 1.0, "block_counts": {},
                               "mode_counts": {}, "failed_cases": [{"case": {"seed": 4}, "error": "", "traceback": ""}],
                               "parts": [{"first_seed": 4, "cases": 1, "code": None}]}))
    assert fuzz._load(old)["parts"][0]["grammar"] == "rich"
    run("--resume", "--cases", "2", "--json", str(old))
    run("--resume", "--cases", "3", "--grammar", "users", "--json", str(old))
    assert ran == [(4, "every"), (4, "rich"), (5, "rich"), (6, "users")]  # the failed case 4 keeps its grammar
    result = json.loads(old.read_text())
    assert [(q["first_seed"], q["cases"], q["grammar"]) for q in result["parts"]] == [
        (4, 1, "rich"), (5, 1, "rich"), (6, 1, "users")]

    before_every = tmp_path / "users.json"
    before_every.write_text(json.dumps({
        "first_seed": 0, "cases_run": 1, "seconds": 1.0, "block_counts": {}, "mode_counts": {},
        "failed_cases": [{"case": {"seed": 0, "users": True}, "error": "", "traceback": ""}],
        "parts": [{"first_seed": 0, "cases": 1, "code": "abc", "users": True}]}))
    assert fuzz._load(before_every)["parts"] == [{"first_seed": 0, "cases": 1, "code": "abc", "grammar": "users"}]
    ran.clear()
    run("--resume", "--cases", "2", "--json", str(before_every))
    assert ran == [(0, "users"), (1, "users")]


class _InProcess:
    """``multiprocessing``'s context and pool, run in this process (so a test sees what runs)."""

    @staticmethod
    def Pool(jobs, initializer=None, initargs=()):  # noqa: N802 (multiprocessing's name)
        return _InProcess()

    def imap(self, fn, items):
        return map(fn, items)

    def terminate(self):
        pass


@pytest.mark.parametrize("seed", [3, 5])
def test_check_numerics_finds_nothing_in_random_models_on_finite_data(seed):
    """``compiler.check_numerics`` on random models whose values are all finite raises nothing: a
    false alarm would send a user hunting for a bad example that is not there (seeds 0-29 passed by
    hand). With NaN parameters, it names an example."""
    import jax
    import numpy as np

    import fold as fd
    from benchmarks.fuzz import random_params
    from benchmarks.random_models import random_model

    case = Case.draw(seed, "every")
    model = random_model(seed, n=6, rich=True, wide=case.wide, users=True, every=True)
    compiler = fd.Compiler.create(model.block, backward=case.backward, chunk_size=case.chunk)
    params = random_params(compiler, seed)
    compiler.check_numerics(params, list(model.examples))
    nan = jax.tree.map(lambda x: np.full_like(x, np.nan), params)
    with pytest.raises(FloatingPointError, match=r"^example \d+: the output of .* is not finite"):
        compiler.check_numerics(nan, list(model.examples))


def test_shared_models_match_and_a_broken_memo_is_caught(monkeypatch):
    """Seed 14 of the ``shared`` grammar: a ``Shared`` recursion over DAGs whose leaves record a
    metric. It matches its reference (which expands the DAGs); a memo that shares what it must
    not (a key too coarse: all of an example's leaves one node) gives wrong values, and no memo
    at all (every path computed) records the metric once per path, more entries than the
    reference, which records once per node."""
    from fold.blocks.sharing import Shared

    case = Case.draw(14, "shared")
    assert run_case(case)[1] == 6
    key = Shared._memo_key
    coarse = lambda self, x, ctx: key(self, x[0] if x[0] == "leaf" else x, ctx)  # noqa: E731
    monkeypatch.setattr(Shared, "_memo_key", coarse)
    with pytest.raises(AssertionError, match="Mismatched elements: 15 / 15"):
        run_case(case)
    monkeypatch.setattr(Shared, "_memo_key", key)
    monkeypatch.setattr(Shared, "_host", lambda self, x, ctx: (yield self.block, x, "Shared"))
    monkeypatch.setattr(Shared, "_emit", lambda self, em, x: em.emit(self.block, x))
    with pytest.raises(AssertionError, match="m0"):
        run_case(case)


@pytest.mark.slow
def test_decoder_models_match_and_a_wrong_score_is_caught(monkeypatch):
    """The ``decoders`` grammar: every model a sequence or tree decoder scoring a known structure
    (teacher forcing) from a start state drawn from ``every``, and ``fd.Generator`` on the same
    decoder and parameters against the per-example reference. Seeds 1 (a sequence decoder) and 0
    (a tree decoder) match their references; a sequence decoder that leaves out the end token's
    log-probability, a tree decoder that feeds each child its parent's state instead of its
    previous sibling's, or a generator that never samples, is caught."""
    from fold.generation.sequence import SequenceDecoder
    from fold.generation.tree import TreeDecoder

    sequence, tree = Case.draw(1, "decoders"), Case.draw(0, "decoders")
    assert run_case(sequence)[0].startswith("SequenceDecoder") and run_case(tree)[0].startswith("TreeDecoder")
    host = SequenceDecoder._host

    def no_end(self, x, ctx):
        scores = yield from host(self, x, ctx)
        return scores[:-1]

    monkeypatch.setattr(SequenceDecoder, "_host", no_end)
    with pytest.raises(AssertionError, match="SequenceDecoder"):
        run_case(sequence)
    monkeypatch.setattr(SequenceDecoder, "_host", host)
    tree_host = TreeDecoder._host

    def parent_as_sibling(self, x, ctx):
        walk = tree_host(self, x, ctx)
        request = next(walk)
        try:
            while True:
                child, arg, label = request
                if child is self.child:
                    arg = (arg[0], arg[0])
                request = walk.send((yield child, arg, label))
        except StopIteration as stop:
            return stop.value

    monkeypatch.setattr(TreeDecoder, "_host", parent_as_sibling)
    with pytest.raises(AssertionError, match="TreeDecoder"):
        run_case(tree)
    monkeypatch.setattr(TreeDecoder, "_host", tree_host)
    # Generation is checked too: a generator that always decides greedily fails the sampled run.
    from fold.generation import sequence as sequence_module

    choose = sequence_module.choose
    monkeypatch.setattr(sequence_module, "choose", lambda logits, key, *rest: choose(logits, None, *rest))
    with pytest.raises(Exception, match="generation of SequenceDecoder.*key True"):
        run_case(sequence)
