"""Saving and restoring pytrees of arrays (parameters, optimizer states) as ``.npz`` files.

Each leaf is stored under its key path (``['fc']['w']``), so a file is readable with NumPy
alone and a restore can say exactly which entry is missing or has the wrong shape. Restoring
takes a template of the same structure (``compiler.init(key)``, ``optimizer.init(params)``),
which gives the containers back their types (optax states are named tuples, Equinox and Flax
parameters are modules); layer names are the keys, so a model rebuilt with the same names in
another process loads the file. A checkpoint can also carry JSON metadata (a run's history and
settings, say), read back with ``checkpoint_metadata``.

Examples:
    >>> import fold as fd, jax, tempfile, os
    >>> compiler = fd.Compiler.create(fd.Vector(2) >> fd.FC(3, name="dense"))
    >>> params = compiler.init(jax.random.key(0))
    >>> path = os.path.join(tempfile.mkdtemp(), "params.npz")
    >>> fd.save_checkpoint(path, {"params": params, "step": 7})
    >>> restored = fd.load_checkpoint(path, {"params": compiler.init(jax.random.key(1)), "step": 0})
    >>> bool((restored["params"]["dense"]["w"] == params["dense"]["w"]).all()), int(restored["step"])
    (True, 7)
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import secrets
import zipfile
from collections.abc import Callable, Mapping
from typing import BinaryIO

import jax
import numpy as np

from fold.typing import PyTree

__all__ = ["save_checkpoint", "load_checkpoint", "checkpoint_metadata"]

_KEY_PREFIX = "__prng_key__:"  # typed PRNG keys are stored as their raw key data
# JAX's own dtypes (bfloat16, the float8 types), which the .npy format stores as nameless bytes
# ("|V2"), are stored as unsigned ints of their width under "__dtype__:NAME:" and the key.
_DTYPE_PREFIX = "__dtype__:"
_METADATA = "__metadata__"  # JSON as UTF-8 bytes (a uint8 array), so it is written with the arrays, atomically


def _entries(tree: PyTree) -> list[tuple[str, object]]:
    return [(jax.tree_util.keystr(path), leaf) for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]]


def save_checkpoint(path: str | os.PathLike[str], tree: PyTree, metadata: Mapping[str, object] | None = None) -> None:
    """Writes the arrays of ``tree`` (any pytree of arrays and numbers) to ``path`` (``.npz``).

    The file is written next to ``path`` (as ``NAME.<random hex>.tmp``) and renamed over it, so an
    interrupted save leaves the previous checkpoint intact.

    Args:
      path: the ``.npz`` file.
      tree: the arrays.
      metadata: JSON-serialisable values saved in the same file (so they always match its
        arrays), read back with ``checkpoint_metadata``.

    Raises:
      TypeError: a leaf is not an array or a number, or ``metadata`` is not JSON-serialisable.
    """
    arrays: dict[str, np.ndarray] = {}
    if metadata is not None:
        try:
            text = json.dumps(dict(metadata), allow_nan=True)
        except (TypeError, ValueError) as e:
            raise TypeError(f"cannot save the metadata of {path}: {e}") from None
        arrays[_METADATA] = np.frombuffer(text.encode(), np.uint8)
    for key, leaf in _entries(tree):
        if isinstance(leaf, jax.Array) and jax.numpy.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            arrays[_KEY_PREFIX + key] = np.asarray(jax.random.key_data(leaf))
            continue
        value = np.asarray(leaf)
        if value.dtype == object:
            raise TypeError(f"cannot save {key} of type {type(leaf).__name__}: leaves must be arrays or numbers")
        if value.dtype.kind == "V":
            arrays[f"{_DTYPE_PREFIX}{value.dtype.name}:{key}"] = value.view(f"u{value.dtype.itemsize}")
        else:
            arrays[key] = value
    write_whole(path, lambda f: np.savez(f, **arrays))  # type: ignore[arg-type]  # numpy's **kwds typing


def write_whole(path: str | os.PathLike[str], write: Callable[[BinaryIO], object]) -> None:
    """Runs ``write`` on a file next to ``path`` (``NAME.<16 hex digits>.tmp``) and renames it over
    ``path``: a reader sees the old file or the new one whole, never a torn one."""
    target = pathlib.Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    # Created as open() would (mode 0o666 less the umask, as np.savez's files are), not mkstemp's 0o600.
    tmp = target.parent / f"{target.name}.{secrets.token_hex(8)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.replace(tmp, target)
    except BaseException:
        os.unlink(tmp)
        raise


def is_left_by(name: str, file_name: str) -> bool:
    """Whether ``name`` is a temporary file that a ``write_whole`` of ``file_name`` killed halfway left."""
    return re.fullmatch(rf"{re.escape(file_name)}\.[0-9a-f]{{16}}\.tmp", name) is not None


def load_checkpoint(path: str | os.PathLike[str], like: PyTree) -> PyTree:
    """Reads ``path`` (written by ``save_checkpoint``) into the structure of ``like``.

    Args:
      path: the ``.npz`` file.
      like: a pytree of the same structure (its values are not used), e.g.
        ``compiler.init(key)`` or ``{"params": ..., "opt_state": ...}``.

    Returns:
      ``like`` with the file's arrays (as JAX arrays) in place of its leaves.

    Raises:
      KeyError: the file lacks an entry ``like`` has, or has one ``like`` lacks.
      ValueError: an entry's shape or dtype differs from ``like``'s, or ``path`` is not a
        checkpoint (another format, or a truncated file).
      FileNotFoundError: there is no file at ``path``.
    """
    files = dict(_stored_entry(k, v) for k, v in _read(path).items() if k != _METADATA)
    entries = _entries(like)
    missing = [k for k, _ in entries if k not in files]
    extra = sorted(set(files) - {k for k, _ in entries})
    if missing or extra:
        raise KeyError(f"{path} does not match the template: missing {', '.join(missing) or 'nothing'}; "
                       f"unexpected {', '.join(extra) or 'nothing'} (saved from a model with other layer names, or "
                       "with another optimizer?)")
    leaves = []
    for key, template in entries:
        is_key, value = files[key]
        template_is_key = isinstance(template, jax.Array) and jax.numpy.issubdtype(template.dtype,
                                                                                      jax.dtypes.prng_key)
        if is_key != template_is_key:
            raise ValueError(f"{path}: {key} is {'a' if is_key else 'not a'} PRNG key, the template's "
                             f"{'is' if template_is_key else 'is not'}")
        if is_key:
            assert isinstance(template, jax.Array)  # template_is_key
            leaves.append(jax.random.wrap_key_data(jax.numpy.asarray(value), impl=jax.random.key_impl(template)))
            continue
        want = np.asarray(template)
        if value.shape != want.shape or value.dtype != want.dtype:
            raise ValueError(f"{path}: {key} has shape {value.shape} and dtype {value.dtype}, the template "
                             f"{want.shape} and {want.dtype}")
        leaves.append(jax.numpy.asarray(value) if isinstance(template, jax.Array) else value)
    return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(like), leaves)


def checkpoint_metadata(path: str | os.PathLike[str]) -> dict[str, object]:
    """The metadata ``save_checkpoint`` wrote to ``path`` (empty if it wrote none).

    Raises:
      ValueError: ``path`` is not a checkpoint (another format, or a truncated file).
      FileNotFoundError: there is no file at ``path``.
    """
    stored = _read(path).get(_METADATA)
    if stored is None:
        return {}
    out = json.loads(stored.tobytes().decode())
    assert isinstance(out, dict)
    return out


def _read(path: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """Every entry of the ``.npz`` file at ``path``."""
    try:
        with np.load(path, allow_pickle=False) as stored:
            return {k: stored[k] for k in stored.files}
    except (ValueError, zipfile.BadZipFile, EOFError) as e:  # OSErrors (no file) name the path already
        raise ValueError(f"{path} is not a checkpoint that save_checkpoint wrote (truncated, or another "
                         f"format): {e}") from None


def _stored_entry(name: str, value: np.ndarray) -> tuple[str, tuple[bool, np.ndarray]]:
    """A file entry as ``(key, (is a PRNG key, value))``, the value in its saved dtype."""
    if name.startswith(_KEY_PREFIX):
        return name.removeprefix(_KEY_PREFIX), (True, value)
    if name.startswith(_DTYPE_PREFIX):
        dtype, _, key = name.removeprefix(_DTYPE_PREFIX).partition(":")
        return key, (False, value.view(np.dtype(dtype)))
    return name, (False, value)
