"""Fixtures shared by the benchmark tests."""

from __future__ import annotations

import pathlib

import jax
import pytest

import fold as fd
from benchmarks import models, sst_peers
from examples import sst

SAMPLE = pathlib.Path(__file__).resolve().parents[1] / "data" / "sst_sample"


@pytest.fixture(scope="module")
def sst_reference():
    """Six small SST trees, their vocabulary, fold's parameters, and fold's mean loss and gradients
    (in ``plain_params``'s layout) on them: what every peer must reproduce."""
    # Small trees keep JaxPerTree's per-shape compilations short.
    trees = sorted(sst.load("train", SAMPLE), key=lambda t: len(sst.words(t)))[:6]
    word_idx = sst.vocabulary(trees[:4])  # trees 4 and 5 have unknown words (zeros as input)
    compiler = fd.Compiler.create(models.sst_model(word_idx, state_size=6, embed_size=4))
    params = compiler.init(jax.random.key(0))
    batch = compiler.build_batch(trees)

    def loss(p):
        return compiler.apply(p, batch).metrics["loss"].mean()

    value, grads = jax.value_and_grad(loss)(params)
    return trees, word_idx, params, float(value), sst_peers.plain_params(grads)
