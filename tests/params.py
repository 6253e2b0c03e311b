"""Parametrizations that keep CI within its time: a diagonal of a product runs by default, the
rest of it under ``-m slow``.

The suite has to finish in 15 minutes on 2 cores; a product of models x chunk sizes x backward
modes compiles a program per case. Every value of every axis still runs in CI (on the
diagonal); the full product runs with ``pytest -m slow`` and its pairings are what the
differential fuzz draws at random.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import pytest


def diagonal(*axes: Sequence[object]) -> list:
    """``pytest.param``s of the product of ``axes``: the cases ``(a[k % len(a)] for a in axes)``
    for ``k`` up to the longest axis's length run in CI, every other case is marked ``slow``.

    So each value of every axis appears in an unmarked case.

    Examples:
        >>> [p.values for p in diagonal("abc", [1, 2]) if not p.marks]
        [('a', 1), ('b', 2), ('c', 1)]
    """
    period = max(len(a) for a in axes)
    kept = {tuple(k % len(a) for a in axes) for k in range(period)}
    return [pytest.param(*(a[i] for a, i in zip(axes, index)),
                         marks=() if index in kept else (pytest.mark.slow,))
            for index in itertools.product(*(range(len(a)) for a in axes))]
