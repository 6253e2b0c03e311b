"""Data parallelism (``fold/compiler/sharding.py``): a step's examples split over devices, balanced
by node count, in one layout, run under ``shard_map``; outputs, metrics, gradients and trained
parameters equal a single-device run. Several devices need their own process (the device count
is fixed when JAX starts): ``tests/compiler/sharding_worker.py`` runs each check and prints its
differences; two such processes form a ``jax.distributed`` run over the loopback address."""

from __future__ import annotations

import json
import os
import random
import re
import socket
import subprocess
import sys
import textwrap
import time

import jax
import numpy as np
import pytest

import fold as fd
from benchmarks.models import random_tree
from fold.compiler.sharding import device_mesh, partition
from tests.compiler.sharding_worker import tree_model

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TIMEOUT = 240  # seconds a worker may take before the test fails instead of hanging
TOLERANCE = 1e-5
# Fuzz seeds whose models the sharded check runs: a Composition with a metric and constants, and a
# OneOf (seeds 0-59 all passed by hand; these two take about 16 s).
SHARDED_SEEDS = (0, 8)


def _worker(*args: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    return subprocess.Popen([sys.executable, "-m", "tests.compiler.sharding_worker", *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _report(process: subprocess.Popen) -> dict:
    out, err = process.communicate(timeout=TIMEOUT)
    assert process.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def _on_two_devices(code: str) -> subprocess.CompletedProcess:
    """``code`` run by a Python process with two simulated devices; fails the test if it fails."""
    env = {**{k: v for k, v in os.environ.items() if k != "XLA_FLAGS"},
           "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=TIMEOUT)
    assert run.returncode == 0, run.stderr[-3000:]
    return run


def _check(report: dict) -> None:
    for what, diff in report["diffs"].items():
        assert diff <= TOLERANCE, f"{what} differs from one device by {diff}"
    # Step 2 holds its largest trees first; balanced by nodes, no device has much more than the mean
    # (step 4 has fewer examples than devices: some run a padding copy).
    assert all(ratio <= 1.1 for ratio, _ in report["balance"][:3]), report["balance"]
    assert report["layouts"] <= 3, report


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_four_devices_train_as_one():
    report = _report(_worker("4"))
    assert report["devices"] == 4
    _check(report)


@pytest.mark.slow
def test_two_processes_train_as_one_device():
    """Each process builds its own examples' share on its two devices; they agree on one layout."""
    port = str(_free_port())
    workers = [_worker("2", str(i), "2", port) for i in range(2)]
    try:
        reports = [_report(w) for w in workers]
    finally:
        for w in workers:
            w.kill()
    assert sorted(r["process"] for r in reports) == [0, 1]
    for report in reports:
        assert report["devices"] == 4
        _check(report)


@pytest.mark.slow  # 15-30 s of two processes; test_two_processes_train_as_one_device runs them in CI
def test_a_dying_process_is_an_error_not_a_hang():
    port = str(_free_port())
    start = time.monotonic()
    workers = [_worker("2", str(i), "2", port, "--die") for i in range(2)]
    try:
        for w in workers:
            w.wait(timeout=TIMEOUT)
    finally:
        for w in workers:
            w.kill()
    assert workers[1].returncode == 3  # the one that died
    assert workers[0].returncode != 0
    assert "heartbeat timeout" in workers[0].stderr.read()
    assert time.monotonic() - start < TIMEOUT


def test_the_scaling_page_runs_on_two_devices():
    """docs/scaling.md's example, as written, on two simulated devices."""
    code = "\n".join(re.findall(r"^```python\n(.*?)^```", open(os.path.join(ROOT, "docs", "scaling.md")).read(),
                                re.S | re.M))
    run = _on_two_devices(code)
    assert "on 2 devices" in run.stdout


def test_parts_that_would_pick_different_chunk_sizes_share_the_largest():
    """Two devices' parts of 10 short sequences picked C = 32 (a part of few examples) and C = 128,
    and every step failed: "layouts of different examples, C or saving have no join"."""
    code = textwrap.dedent("""
        import jax, numpy as np, fold as fd
        model = fd.Map(fd.Vector(2) >> fd.FC(3)) >> fd.Sum()
        data = [[[1.0, float(i)]] * (i % 4 + 1) for i in range(10)]
        compiler = fd.Compiler.create(model)
        params = compiler.init(jax.random.key(0))
        want = np.asarray(compiler.apply(params, compiler.build_batch(data)).outputs)
        for devices in (2, jax.devices()[:2], 1):
            got = np.asarray(compiler.apply(params, compiler.build_batch(data, devices=devices)).outputs)
            print(devices if isinstance(devices, int) else len(devices), float(np.abs(got - want).max()))
    """)
    run = _on_two_devices(code)
    lines = [line.split() for line in run.stdout.strip().splitlines()]
    assert [n for n, _ in lines] == ["2", "2", "1"]
    assert all(float(diff) <= TOLERANCE for _, diff in lines), lines



@pytest.mark.slow  # 20-40 s; the named models' sharded tests run in CI
def test_random_models_sharded_over_two_devices_equal_their_reference():
    """The fuzz's random models (every grammar production: OneOf, recursion, metrics, Void, ...) on
    batches split over two devices: outputs, metric values and gradients against the per-example
    reference, as ``benchmarks.fuzz`` checks single-device batches."""
    code = textwrap.dedent("""
        import fold as fd
        from benchmarks.fuzz import Case, comparer, random_params
        from benchmarks.random_models import random_model
        for seed in SEEDS:
            case = Case.draw(seed, "every")
            model = random_model(seed, n=6, rich=True, wide=case.wide, users=True, every=True)
            compiler = fd.Compiler.create(model.block, backward=case.backward, chunk_size=case.chunk)
            compare, examples = comparer(compiler, model, seed), list(model.examples)
            for k, batch in enumerate(compiler.batches(examples, max(2, case.batch_size), devices=2)):
                compare(random_params(compiler, seed), batch, [examples[i] for i in batch.example_indices],
                        f"seed {seed}, batch {k}")
            print(seed, "metrics" if model.metrics else "no metrics", "OneOf" in model.text)
    """).replace("SEEDS", repr(SHARDED_SEEDS))
    run = _on_two_devices(code)
    assert [line.split()[0] for line in run.stdout.strip().splitlines()] == [str(s) for s in SHARDED_SEEDS]
    words = run.stdout.split()
    assert "metrics" in words and "True" in words  # a model with metrics, one with a OneOf

# --- in this process (one device) ------------------------------------------------------------------

def test_partition_balances_by_cost():
    rng = np.random.default_rng(0)
    costs = rng.integers(1, 200, 256)
    parts = partition(costs, 8)
    assert sorted(np.concatenate(parts).tolist()) == list(range(256))
    loads = np.asarray([costs[p].sum() for p in parts])
    assert loads.max() / loads.mean() <= 1.05
    assert all(np.all(np.diff(p) > 0) for p in parts)
    # Sorted by size, an even split by count would give the first part most of the work.
    ordered = np.sort(costs)[::-1]
    by_count = [ordered[i * 32:(i + 1) * 32].sum() for i in range(8)]
    assert max(by_count) / np.mean(by_count) > 1.8
    assert max(ordered[p].sum() for p in partition(ordered, 8)) / np.mean(by_count) <= 1.05
    assert [len(p) for p in partition(np.asarray([5, 1]), 3)] == [1, 1, 0]


def _tree_model() -> fd.Compiler:
    return fd.Compiler.create(tree_model(4))


def test_one_device_sharded_batch_equals_a_batch():
    compiler = _tree_model()
    params = compiler.init(jax.random.key(0))
    data = [1.0, (2.0, 3.0), ((1.0, 2.0), (3.0, 4.0)), (5.0, (6.0, 7.0))]
    for source in (data, compiler.record(data)):
        sharded = compiler.build_batch(source, devices=1)
        assert isinstance(sharded, fd.ShardedBatch) and sharded.num_devices == 1
        expected = compiler.apply(params, compiler.build_batch(data))
        got = compiler.apply(params, sharded)
        np.testing.assert_allclose(got.outputs, expected.outputs, rtol=1e-6)
        np.testing.assert_allclose(got.metrics["loss"].mean(), expected.metrics["loss"].mean(), rtol=1e-6)
    batches = list(compiler.batches(data, 3, devices=1))
    assert [b.example_indices.tolist() for b in batches] == [[0, 1, 2], [3]]
    assert len(compiler.apply(params, batches[1]).outputs) == 1


def test_sharding_misuse():
    compiler, other = _tree_model(), _tree_model()
    params = compiler.init(jax.random.key(0))
    with pytest.raises(ValueError, match="devices must be a device count >= 1, got 0"):
        compiler.build_batch([1.0], devices=0)
    with pytest.raises(ValueError, match="devices=99, but there are"):
        compiler.build_batch([1.0], devices=99)
    with pytest.raises(ValueError, match="not 'model'"):
        compiler.build_batch([1.0], devices=device_mesh(1), axis="model")
    with pytest.raises(TypeError, match="not a bool"):
        compiler.build_batch([1.0], devices=True)
    d0 = jax.devices()[0]  # listed twice: a safe_zip error from JAX's Mesh
    with pytest.raises(ValueError, match="devices lists .* more than once"):
        compiler.build_batch([1.0, 2.0], devices=[d0, d0])
    with pytest.raises(TypeError, match="a list of jax devices"):
        compiler.build_batch([1.0], devices=["cpu:0"])
    with pytest.raises(ValueError, match="exact_layout and devices"):
        compiler.build_batch([1.0], exact_layout=True, devices=1)
    with pytest.raises(ValueError, match="num_workers=0"):
        next(compiler.batches([1.0], 1, num_workers=1, devices=1))
    with pytest.raises(ValueError, match="at least one example"):
        compiler.build_batch([], devices=1)
    with pytest.raises(ValueError, match="another compiler"):
        compiler.apply(params, other.build_batch([1.0], devices=1))
    with pytest.raises(ValueError, match="recorded by another compiler"):
        compiler.build_batch(other.record([1.0]), devices=1)


def test_a_bad_example_is_named_by_its_dataset_index():
    compiler = _tree_model()
    data = [1.0, 2.0, (3.0, 4.0), 5.0, 6.0, "seven", 8.0]
    with pytest.raises(ValueError, match=r"example 5 \(position 1 in its batch\): at OneOf > Scalar"):
        list(compiler.batches(data, 4, devices=1))


def test_when_another_process_recomputes_every_part_recomputes():
    """Processes agree on one layout: if another process's parts do not save for the backward pass,
    this process's parts recompute too (instead of failing)."""
    from fold.compiler.sharding import SharedLayouts

    compiler = fd.Compiler.create(tree_model(4), backward="save")
    rng = random.Random(0)
    parts = [compiler.build_batch([random_tree(rng, 12) for _ in range(n)], exact_layout=True) for n in (2, 3)]
    assert all(p.layout.saved_rows for p in parts)
    shared = SharedLayouts([(t.shape, t.dtype) for t in compiler.program.types])
    padded = shared.pad(parts, lambda need: [need, need._replace(saved_rows=())])
    assert len({p.layout for p in padded}) == 1 and padded[0].layout.saved_rows == ()
    assert shared.pad(parts, lambda need: [need])[0].layout.saved_rows
