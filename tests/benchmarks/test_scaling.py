"""``benchmarks.scaling --quick``: two simulated devices (a process of its own, as the device count
is fixed when JAX starts) balance their nodes, pad little and compile few layouts."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow
def test_scaling_quick(tmp_path):
    out = tmp_path / "scaling.json"
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    run = subprocess.run([sys.executable, "-m", "benchmarks.scaling", "--quick", "--json", str(out)], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "re-running with 2 simulated CPU devices" in run.stdout
    result = json.loads(out.read_text())
    assert result["simulated"] and [r["devices"] for r in result["runs"]] == [1, 2]
    one, two = result["runs"]
    assert one["balance_max"] == 1.0 and two["balance_max"] <= 1.1
    assert 1.8 <= two["projected_speedup"] <= 2.0
    assert all(len(step["nodes"]) == 2 and len(step["iterations"]) == 2 for step in two["steps"])
    assert one["allreduce_bytes_per_step"] == two["allreduce_bytes_per_step"] > 0
    assert two["ring_bytes_per_device_per_step"] == two["allreduce_bytes_per_step"]  # 2 (D - 1) / D = 1
    assert 1.0 <= two["shared_layout_padding_mean"] < 2.0
    assert two["compilations"] <= 2 and two["trees_per_s"] > 0
    assert out.with_suffix(".png").exists()
