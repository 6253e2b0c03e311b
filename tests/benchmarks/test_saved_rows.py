"""``benchmarks.saved_rows`` times saved buffers at their items' rows against the earlier sizes."""

from __future__ import annotations

import pytest

from benchmarks import saved_rows


def test_earlier_rows_raise_each_saving_region_to_a_quarter_of_the_size_class_and_a_power_of_two():
    layout = saved_rows.fd.BatchLayout(
        size_class=4096, num_examples=16, loop_ops=(1, 2, 3), hoist_ops=(), const_types=(), tail_ops=(),
        tail_sizes=(), hoist_sizes=(), arena_rows=(), chunk=128, saved_rows=(640, 0, 1536), item_rows=())
    assert saved_rows.earlier_rows(layout) == (1024, 0, 2048)


@pytest.mark.slow
def test_quick_run_compares_both_sizes_on_saving_batches(tmp_path):
    result = saved_rows.main(["--quick", "--workload", "sst", "--json", str(tmp_path / "s.json")])
    (run,) = result["runs"]
    assert set(run["ms"]) == set(saved_rows.SIZES) and min(run["ms"].values()) > 0
    earlier, now = (run["saved_rows"][name] for name in saved_rows.SIZES)
    assert any(any(rows) for rows in now)  # the quick SST batches save
    for before, after, items in zip(earlier, now, run["items_save"]):
        assert all(b >= a >= (i if a else 0) for b, a, i in zip(before, after, items))
    assert run["largest_param_gap"] < 1e-5  # the same SGD step, either way
    assert run["epoch"]["layouts"] >= 1 and run["epoch"]["rows_over_need"] >= 1
    assert (tmp_path / "s.json").exists() and (tmp_path / "s.png").exists()
