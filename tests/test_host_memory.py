"""``keep_host_memory``: freed blocks stay in the heap, so the next allocation touches no fresh pages.

The thresholds are process-wide and glibc's adaptive defaults cannot be restored once set, so
every check of the effect runs in a fresh interpreter, counting the page faults of allocations
larger than glibc's largest adaptive threshold (32 MiB).
"""

import os
import platform
import subprocess
import sys
import textwrap

import pytest

import fold as fd
from fold import host_memory

GLIBC = platform.libc_ver()[0] == "glibc"

# A 40 MiB block malloc'd, filled and freed 5 times: the faults of the last 4 (each fresh 4 KiB
# page faults once; 40 MiB is 10,240 pages). ``malloc`` itself, as XLA calls it: NumPy asks for
# huge pages on large arrays, which fault 512 times less.
_FAULTS = """
    import ctypes, ctypes.util, resource
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    def fill():
        p = libc.malloc(40 * 2**20)
        ctypes.memset(p, 1, 40 * 2**20)
        libc.free(p)
    def faults():
        fill()  # the first allocation may grow the heap
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(4):
            fill()
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
"""


def _process(code: str, **env: str) -> subprocess.CompletedProcess:
    """``code`` run after ``_FAULTS`` in a fresh interpreter whose allocator variables are ``env``'s only."""
    environ = {k: v for k, v in os.environ.items()
               if k not in (host_memory.ENV, "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES")}
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(_FAULTS) + textwrap.dedent(code)],
                         capture_output=True, text=True, timeout=300, env={**environ, **env})
    assert out.returncode == 0, out.stderr
    return out


def _run(code: str, **env: str) -> str:
    return _process(code, **env).stdout


_CREATE = """
    import logging
    import fold as fd
    logging.basicConfig(level=logging.INFO)
    fd.Compiler.create(fd.Scalar() >> fd.Function(lambda x: x + 1.0))
    print(faults())
"""


@pytest.mark.skipif(not GLIBC, reason="glibc's thresholds")
def test_kept_blocks_are_reused_without_page_faults():
    out = _run("""
        import fold as fd
        print(faults())
        print(fd.keep_host_memory())
        print(faults())
    """).split()
    default, kept, after = int(out[0]), out[1], int(out[2])
    assert default > 4 * 10_000  # glibc maps a fresh 40 MiB block every time
    assert kept == "True"
    assert after < 1_000


@pytest.mark.skipif(not GLIBC, reason="glibc's thresholds")
def test_a_compiler_keeps_host_memory_by_default_and_says_so():
    out = _process(_CREATE)
    assert int(out.stdout) < 1_000
    assert "freed host memory is kept" in out.stderr


@pytest.mark.skipif(not GLIBC, reason="glibc's thresholds")
@pytest.mark.parametrize("env", [{host_memory.ENV: "0"}, {"MALLOC_MMAP_THRESHOLD_": "1048576"},
                                 {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1048576"}])
def test_the_default_leaves_a_program_that_chose_its_allocator_alone(env):
    assert int(_run(_CREATE, **env)) > 4 * 10_000  # 40 MiB blocks mapped fresh, as glibc does


@pytest.mark.skipif(not GLIBC, reason="glibc's thresholds")
def test_a_programs_own_call_wins_over_the_default():
    out = _run("""
        import fold as fd
        fd.keep_host_memory(largest_block=2**20, kept_free=2**20)  # 40 MiB blocks: mapped fresh
        from fold import host_memory
        print(host_memory.keep_by_default())
        fd.Compiler.create(fd.Scalar() >> fd.Function(lambda x: x + 1.0))
        print(faults())
    """).split()
    assert out[0] == "False"
    assert int(out[1]) > 4 * 10_000


def test_a_bad_setting_is_a_clear_error(monkeypatch):
    monkeypatch.setenv(host_memory.ENV, "yes")
    with pytest.raises(ValueError, match="FOLD_KEEP_HOST_MEMORY must be 0 .* or 1 .*'yes'"):
        host_memory.keep_by_default()


@pytest.mark.parametrize("kwargs", [{"largest_block": 0}, {"kept_free": -1}, {"largest_block": True},
                                    {"kept_free": 1.5}, {"largest_block": 2**31}])
def test_bad_sizes_are_refused(kwargs):
    with pytest.raises(ValueError, match="largest_block|kept_free"):
        fd.keep_host_memory(**kwargs)


def test_without_glibc_nothing_changes(monkeypatch):
    monkeypatch.setattr(host_memory, "_chosen", host_memory._chosen)
    host_memory._glibc.cache_clear()
    monkeypatch.setattr(platform, "libc_ver", lambda: ("", ""))
    try:
        assert fd.keep_host_memory() is False
    finally:
        host_memory._glibc.cache_clear()


def test_the_three_glibc_settings_are_made(monkeypatch):
    calls = []

    class FakeLibc:
        def mallopt(self, param, value):
            calls.append((param, value))
            return 1

    monkeypatch.setattr(host_memory, "_chosen", host_memory._chosen)
    monkeypatch.setattr(host_memory, "_glibc", lambda: FakeLibc())
    assert fd.keep_host_memory(largest_block=3 * 2**20, kept_free=5 * 2**20) is True
    # M_MMAP_THRESHOLD and M_TOP_PAD at the largest block, M_TRIM_THRESHOLD at what stays free.
    assert calls == [(-3, 3 * 2**20), (-2, 3 * 2**20), (-1, 5 * 2**20)]
