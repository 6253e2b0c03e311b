"""The SST model styles of ``benchmarks.sst_styles`` compute the same loss and gradients."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import fold as fd
from benchmarks import sst_peers, sst_styles


@pytest.mark.slow
@pytest.mark.parametrize("style", ["layers", "function loss"])
def test_custom_styles_match_the_examples_model(sst_reference, style):
    """Custom layers, with the loss as a layer or as a Function, from the same parameters: the
    blocks model's mean loss and gradients (unknown words embed to zeros in both)."""
    trees, word_idx, params, loss, grads = sst_reference
    plain = sst_peers.plain_params(params)
    compiler = fd.Compiler.create(sst_styles.style_model(style, word_idx, hidden=6, embed=4))
    mine = jax.tree_util.tree_map(jnp.asarray, sst_styles.style_params(style, plain))
    assert jax.tree_util.tree_structure(mine) == jax.tree_util.tree_structure(compiler.init(jax.random.key(1)))
    batch = compiler.build_batch(trees)
    value, g = jax.value_and_grad(lambda p: compiler.apply(p, batch).metrics["loss"].mean())(mine)
    assert float(value) == pytest.approx(loss, rel=1e-5)
    expected = sst_styles.style_params(style, grads)
    for (path, got), want in zip(jax.tree_util.tree_leaves_with_path(g), jax.tree_util.tree_leaves(expected)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6, err_msg=jax.tree_util.keystr(path))


@pytest.mark.slow
def test_quick_run_times_every_style_and_loop(tmp_path):
    result = sst_styles.main(["--quick", "--json", str(tmp_path / "styles.json")])
    loops = {f"{s}, {loop}" for s in sst_styles.STYLES for loop in ("blocking", "prefetched", "stream")}
    assert loops <= set(result["trees_per_s"]) and all(r > 0 for r in result["trees_per_s"].values())
    assert (tmp_path / "styles.png").exists()
