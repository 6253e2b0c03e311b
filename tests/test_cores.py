"""``reserve_host_cores``: JAX's threads on all but the reserved cores, later threads anywhere.

Each check runs in a fresh interpreter: the reservation acts when JAX starts its backends, which
this test process has long done.
"""

import os
import subprocess
import sys
import textwrap

import pytest

import fold as fd

CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1


def _run(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.mark.skipif(CORES < 2, reason="needs a process that may use at least 2 cores")
def test_jax_threads_keep_off_the_reserved_core_and_later_threads_may_use_it():
    out = _run("""
        import os, threading
        import fold as fd
        before = set(os.listdir("/proc/self/task"))  # importing starts no backend
        cores = sorted(os.sched_getaffinity(0))
        kept = fd.reserve_host_cores(1)
        import jax.numpy as jnp
        assert float(jnp.arange(4.0).sum()) == 6.0
        started = [int(t) for t in os.listdir("/proc/self/task") if t not in before]
        print("kept", list(kept) == cores[:-1])
        print("jax threads", len(started) > 0 and all(os.sched_getaffinity(t) <= set(kept) for t in started))
        print("main", sorted(os.sched_getaffinity(0)) == cores)
        seen = []
        thread = threading.Thread(target=lambda: seen.append(sorted(os.sched_getaffinity(0)) == cores))
        thread.start()
        thread.join()
        print("later thread", seen[0])
    """)
    assert out.split("\n")[:4] == ["kept True", "jax threads True", "main True", "later thread True"], out


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="Linux only")
def test_too_few_cores_warns_and_keeps_them_all():
    out = _run("""
        import os, warnings
        only = sorted(os.sched_getaffinity(0))[:1]
        os.sched_setaffinity(0, only)
        import fold as fd
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            kept = fd.reserve_host_cores(1)
        print(list(kept) == only, [str(w.message) for w in caught])
    """)
    assert out.startswith("True") and "too few to reserve 1" in out, out


def test_after_the_backends_started_it_raises():
    import jax

    jax.devices()
    with pytest.raises(RuntimeError, match="before JAX starts its backends"):
        fd.reserve_host_cores(1)


@pytest.mark.parametrize("bad", [0, -1, 1.5, "1", True])
def test_bad_counts(bad):
    with pytest.raises(ValueError, match="n must be an int >= 1"):
        fd.reserve_host_cores(bad)
