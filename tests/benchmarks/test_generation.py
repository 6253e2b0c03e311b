"""``benchmarks.generation``: its per-example loops grow the trees fold's Generator grows."""

from __future__ import annotations

import argparse
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fold as fd
from benchmarks import generation


def test_the_per_example_loop_grows_what_the_generator_grows():
    args = argparse.Namespace(hidden=6, labels=7, max_levels=4, max_nodes=13)
    generator = fd.Generator(generation.decoder(args.hidden, args.labels, args.max_levels, args.max_nodes),
                             state_type=fd.TupleType(fd.TensorType((6,)), fd.TensorType((6,))))
    params = generator.init(jax.random.key(0))
    params["arity"]["b"] = jnp.array([0.0, 1.0])
    rng = np.random.default_rng(1)
    starts = tuple((2 * rng.normal(size=(10, 6))).astype(np.float32) for _ in range(2))
    trees = generator.generate(params, starts).trees()
    assert any(isinstance(t, tuple) for t in trees) and sum(map(generation.size, trees)) > 20
    assert generation.JaxPerExample(generator, params, args).trees(starts) == trees
    pytest.importorskip("torch")
    assert generation.TorchPerExample(params, args).trees(starts) == trees


@pytest.mark.slow
def test_quick_run_writes_its_results(tmp_path):
    out = tmp_path / "generation.json"
    result = generation.main(["--quick", "--json", str(out)])
    saved = json.loads(out.read_text())
    assert [r["batch_size"] for r in saved["runs"]] == [1, 8]
    for run in result["runs"]:
        assert all(share == 1.0 for share in run["same_trees"].values())
        assert run["trees_per_s"]["fold"] > 0
