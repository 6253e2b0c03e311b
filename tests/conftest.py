"""Suite-wide setup: one persistent XLA compilation cache per test session, and XLA's backend
optimizations off.

Many tests compile the same programs (the models of ``tests/models.py`` in the same layouts, a
jitted function rebuilt per call): with a cache shared by the xdist workers, each is compiled
once per session. The cache lives in a fresh temporary folder, removed at the end, so a run
never reads what an earlier run (or another version of fold) compiled. A cache folder set by
the caller (``JAX_COMPILATION_CACHE_DIR``) is used as it is.

The suite compiles hundreds of small programs and runs each a few times, so compiling is most of
its time, and LLVM's optimizations (``--xla_backend_optimization_level``) are most of compiling:
without them the suite takes about a fifth less time (README). XLA's own passes (fusion,
buffer assignment) still run: a Tree-LSTM training step's optimized HLO is the same at both
levels, only its machine code is slower. The benchmarks and the long fuzz run keep the default level. A level set by the
caller in ``XLA_FLAGS`` is used as it is.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

_CACHE = "JAX_COMPILATION_CACHE_DIR"
_LEVEL = "--xla_backend_optimization_level"
# The session's own folder, when this process made one (the xdist controller, or a serial run).
_made: list[str] = []


def pytest_configure(config: pytest.Config) -> None:
    # Before any test initialises JAX's backend, which reads XLA_FLAGS once; subprocesses inherit it.
    flags = os.environ.get("XLA_FLAGS", "")
    if _LEVEL not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} {_LEVEL}=0".strip()
    # Workers inherit the controller's environment: only the first process makes the folder.
    if _CACHE in os.environ or hasattr(config, "workerinput"):
        return
    folder = tempfile.mkdtemp(prefix="fold-test-xla-cache-")
    _made.append(folder)
    os.environ[_CACHE] = folder
    # JAX caches only programs that took a second to compile by default; most of the suite's take less.
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.3")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")


def pytest_unconfigure(config: pytest.Config) -> None:
    for folder in _made:
        shutil.rmtree(folder, ignore_errors=True)
        os.environ.pop(_CACHE, None)
