"""Progress bars (tqdm): a notebook's widget where ipywidgets is installed, else text.

``tqdm.auto`` picks the notebook bar in Jupyter and, without ipywidgets, warns ("IProgress not
found") and falls back to text, once per bar, also for bars that are disabled. fold asks for the
widget only where it can be drawn.
"""

from __future__ import annotations

import importlib.util
from typing import cast

__all__ = ["tqdm_class"]


def tqdm_class() -> type:
    """tqdm's class for this environment: ``tqdm.auto``'s where ipywidgets can be imported, else
    the text bar (``tqdm.std``)."""
    if importlib.util.find_spec("ipywidgets") is None:
        from tqdm.std import tqdm

        return cast(type, tqdm)
    from tqdm.auto import tqdm as auto

    return cast(type, auto)
