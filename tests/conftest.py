"""Suite-wide setup: one persistent XLA compilation cache per test session.

Many tests compile the same programs (the models of ``tests/models.py`` in the same layouts, a
jitted function rebuilt per call): with a cache shared by the xdist workers, each is compiled
once per session. The cache lives in a fresh temporary folder, removed at the end, so a run
never reads what an earlier run (or another version of fold) compiled. A cache folder set by
the caller (``JAX_COMPILATION_CACHE_DIR``) is used as it is.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

_CACHE = "JAX_COMPILATION_CACHE_DIR"
# The session's own folder, when this process made one (the xdist controller, or a serial run).
_made: list[str] = []


def pytest_configure(config: pytest.Config) -> None:
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
