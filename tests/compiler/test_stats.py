"""``compiler.stats()``: batches, layouts (compilations), traces, bucket occupancy and saving batches."""

from __future__ import annotations

import logging
import re

import jax
import pytest

import fold as fd


def _compiler() -> fd.Compiler:
    return fd.Compiler.create(fd.Map(fd.Scalar() >> fd.Function(lambda x: x + 1.0)) >> fd.Sum())


def test_counts_batches_layouts_nodes_and_occupancy():
    compiler = _compiler()
    small, big = compiler.build_batch([[1.0, 2.0]]), compiler.build_batch([[1.0] * 40])
    compiler.build_batch([[3.0, 4.0]])
    s = compiler.stats()
    assert (s.batches, s.layouts, s.traces) == (3, 2, 0)
    assert s.size_classes == {small.layout.size_class: 2, big.layout.size_class: 1}
    assert s.nodes == 2 * small.stats.num_nodes + big.stats.num_nodes
    occupancies = [b.stats.rows / b.layout.size_class for b in (small, big, small)]
    assert s.occupancy == pytest.approx(sum(occupancies) / 3) and s.min_occupancy == min(occupancies)
    assert s.saving == 0  # nothing to save: no matmuls
    assert compiler.stats(reset=True) == s
    assert compiler.stats().batches == 0


@pytest.mark.parametrize("num_workers", [0, 2])
def test_batches_are_counted_once_with_or_without_workers(num_workers):
    compiler = _compiler()
    list(compiler.batches([[1.0] * (i % 5) for i in range(30)], 4, num_workers=num_workers))
    assert compiler.stats().batches == 8


def test_counts_batches_that_save_matmul_outputs():
    # A 256 -> 128 matmul is worth saving under backward="auto" (512 saved bytes per row).
    w = 128
    compiler = fd.Compiler.create(fd.Map(fd.Vector(w)) >> fd.Fold(fd.Concat() >> fd.Function(fd.FC(w)),
                                                                  fd.FromTensor(jax.numpy.zeros(w))),
                                  save_limit=2**16)
    row = [1.0] * w
    small, big = compiler.build_batch([[row] * 6]), compiler.build_batch([[row] * 300])
    assert small.layout.saved_rows and not big.layout.saved_rows  # 300 loop rows: over 64 KiB
    assert compiler.stats().saving == 1


def test_traces_count_compilations_of_a_jitted_step(caplog):
    compiler = _compiler()
    params = compiler.init(jax.random.key(0))
    step = jax.jit(lambda p, b: compiler.apply(p, b).outputs.sum())
    with caplog.at_level(logging.INFO, logger="fold"):
        for data in ([[1.0]], [[2.0]], [[1.0] * 50], [[3.0]]):
            step(params, compiler.build_batch(data))
    s = compiler.stats()
    assert s.layouts == 2 and s.traces == 2  # one trace per layout, none for repeats
    compiled = [r.getMessage() for r in caplog.records if "compiled a function that calls apply" in r.getMessage()]
    assert len(compiled) == 2 and all(re.search(r"in \d+\.\d s .* layout of A=\d+, B=1, C=", m) for m in compiled)
    assert s.compile_seconds > 0
    for _ in range(3):  # eager: the compiler's own jitted apply, traced once per layout
        compiler.apply(params, compiler.build_batch([[1.0]]))
    assert compiler.stats().traces == 3


def test_inline_jit_of_apply_reuses_the_cache():
    """``jax.jit(compiler.apply)`` written in a loop traces once per layout: ``compiler.apply`` is
    one object, not a new bound method per access."""
    compiler = _compiler()
    params = compiler.init(jax.random.key(0))
    batch = compiler.build_batch([[1.0, 2.0]])
    assert compiler.apply is compiler.apply
    outs = [float(jax.jit(compiler.apply)(params, batch).outputs.sum()) for _ in range(3)]
    assert compiler.stats().traces == 1 and outs == [outs[0]] * 3
