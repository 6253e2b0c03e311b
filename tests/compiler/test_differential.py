"""Batched ``apply`` == each example alone == an independent NumPy reference."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import fold as fd
from tests.models import MODELS


@pytest.fixture(scope="module", params=sorted(MODELS))
def model(request):
    block, reference, examples = MODELS[request.param]()
    compiler = fd.Compiler.create(block)
    params = compiler.init(jax.random.key(1))
    return request.param, block, compiler, params, reference, examples


def test_batch_matches_reference_and_single_examples(model):
    name, block, compiler, params, reference, examples = model
    out = np.asarray(compiler.apply(params, compiler.build_batch(examples)).outputs)
    assert out.shape[0] == len(examples)
    depths = {block.max_depth(e) for e in examples}
    assert len(depths) > 2, f"{name}: examples should have different shapes"
    for i, e in enumerate(examples):
        expected = reference(params, e)
        np.testing.assert_allclose(out[i], expected, rtol=1e-5, atol=1e-6, err_msg=f"{name} example {i}")
        alone = block.eval(e, params)
        np.testing.assert_allclose(alone, out[i], rtol=1e-5, atol=1e-6, err_msg=f"{name} example {i} alone")


def test_output_independent_of_batch_partners(model):
    name, _, compiler, params, _, examples = model
    target = examples[3]
    rng = np.random.default_rng(7)
    rows = []
    for k in (1, 5, len(examples)):
        partners = [examples[j] for j in rng.permutation(len(examples))[:k]]
        pos = int(rng.integers(0, len(partners) + 1))
        batch = partners[:pos] + [target] + partners[pos:]
        rows.append(np.asarray(compiler.apply(params, compiler.build_batch(batch)).outputs)[pos])
    for r in rows[1:]:
        np.testing.assert_allclose(r, rows[0], rtol=1e-6, atol=1e-7)


def test_jit_matches_eager(model):
    _, _, compiler, params, _, examples = model
    batch = compiler.build_batch(examples)
    eager = np.asarray(compiler.apply(params, batch).outputs)
    jitted = np.asarray(jax.jit(compiler.apply)(params, batch).outputs)
    np.testing.assert_allclose(jitted, eager, rtol=1e-6, atol=1e-7)
