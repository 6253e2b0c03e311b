"""Loading the Stanford Sentiment Treebank (PTB-style trees, one per line).

A tree is ``(label, word)`` for a leaf or ``(label, left, right)`` for an
inner node; labels are 0-4. Parsing is iterative, so deep trees are fine.

The treebank is not bundled. ``data_dir`` finds it: ``--data-dir`` when
given, else the committed sample for ``--quick`` runs, else the cache
folder (``$FOLD_DATA/sst``, or ``sst`` in the platform's cache folder),
downloading the official release there once (``download``: the PTB-format
trees zip, each split checked against its SHA-256).
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import os
import pathlib
import re
import sys
import tempfile
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

# A few hundred trees per split, committed for quick runs and tests (see its README).
SAMPLE = pathlib.Path(__file__).resolve().parents[1] / "tests" / "data" / "sst_sample"
URL = "https://nlp.stanford.edu/sentiment/trainDevTestTrees_PTB.zip"
SPLITS = ("train", "dev", "test")
# SHA-256 of each split as extracted from the zip (trees/<split>.txt): 8,544, 1,101 and 2,210 trees.
CHECKSUMS = {
    "train": "e2f3f41b0b1e6d4dddc0effe3bfc2d27ed8928079aa9a03d652311614fc5feb7",
    "dev": "0e9336aed6e4730e19f58d00a77b3f0297efdb755f7b5e598c98a05e3f97ea40",
    "test": "6e54806dee95cf80cd918e7dfb3f6770f6df24bf826f289a4d1f709e1c8f6761",
}
# Words may contain non-ASCII spaces (e.g. "8\xa01\\/2"): split on ASCII blanks only.
_TOKEN = re.compile(r"\(|\)|[^ \t\r\n()]+")


def cache_dir() -> pathlib.Path:
    """Where the downloaded treebank lives: ``$FOLD_DATA/sst``, else ``fold/sst`` in the platform's
    cache folder (``$XDG_CACHE_HOME`` or ``~/.cache`` on Linux, ``~/Library/Caches`` on macOS,
    ``%LOCALAPPDATA%`` on Windows)."""
    if os.environ.get("FOLD_DATA"):
        return pathlib.Path(os.environ["FOLD_DATA"]) / "sst"
    if sys.platform == "darwin":
        base = pathlib.Path.home() / "Library" / "Caches"
    elif sys.platform == "win32":
        base = pathlib.Path(os.environ.get("LOCALAPPDATA", pathlib.Path.home() / "AppData" / "Local"))
    else:
        base = pathlib.Path(os.environ.get("XDG_CACHE_HOME", pathlib.Path.home() / ".cache"))
    return base / "fold" / "sst"


def _has_splits(folder: pathlib.Path) -> bool:
    return all((folder / f"{split}.txt").exists() for split in SPLITS)


def data_dir(given: str | pathlib.Path | None, quick: bool = False,
             pointer: str = "pass --data-dir with the folder that holds them") -> pathlib.Path:
    """The SST folder to read: ``given`` (``--data-dir``), else the committed sample for a quick
    run, else ``cache_dir()``, downloading the treebank there first if it is not there yet
    (``pointer`` says, where the download fails, how to give a folder instead: a notebook has no
    flags)."""
    if given is not None:
        return pathlib.Path(given)
    if quick:
        return SAMPLE
    folder = cache_dir()
    if not _has_splits(folder):
        download(folder, pointer=pointer)
    return folder


def download(dest: str | pathlib.Path, url: str = URL, checksums: Mapping[str, str] = CHECKSUMS,
             opener: Callable[[str], Any] = urllib.request.urlopen, progress: bool = True,
             pointer: str = "pass --data-dir with the folder that holds them") -> pathlib.Path:
    """Downloads the treebank zip from ``url`` and writes ``train.txt``, ``dev.txt`` and
    ``test.txt`` into ``dest``, each checked against ``checksums`` (SHA-256) before it is kept.

    Raises:
      RuntimeError: the download failed (the message says what to download and where to put it).
      ValueError: the archive lacks a split, or a split's checksum differs (nothing is kept).
    """
    dest = pathlib.Path(dest)
    manual = (f"download {URL} by hand, unzip it and put trees/train.txt, dev.txt and test.txt in {dest} "
              f"(or {pointer})")
    with tempfile.TemporaryDirectory() as tmp:
        archive = pathlib.Path(tmp) / "sst.zip"
        try:
            with opener(url) as response, open(archive, "wb") as out:
                _copy(response, out, progress)
        except (urllib.error.URLError, OSError) as e:
            raise RuntimeError(f"could not download the Stanford Sentiment Treebank from {url} ({e}): {manual}") from e
        texts = {}
        with zipfile.ZipFile(archive) as z:
            names = {pathlib.PurePosixPath(n).name: n for n in z.namelist()}
            for split in SPLITS:
                if f"{split}.txt" not in names:
                    raise ValueError(f"{url} has no {split}.txt (it holds {sorted(names)}): {manual}")
                texts[split] = z.read(names[f"{split}.txt"])
    for split, data in texts.items():
        digest = hashlib.sha256(data).hexdigest()
        if digest != checksums[split]:
            raise ValueError(f"{split}.txt from {url} has SHA-256 {digest}, expected {checksums[split]}: "
                             f"the file differs from the release these examples were measured on; {manual}")
    dest.mkdir(parents=True, exist_ok=True)
    for split, data in texts.items():
        part = dest / f".{split}.txt.part"
        part.write_bytes(data)
        part.replace(dest / f"{split}.txt")
    return dest


def _copy(response: Any, out: Any, progress: bool) -> None:
    """Copies ``response`` to ``out`` in 1 MiB blocks, with a tqdm bar when ``progress``."""
    total = int(getattr(response, "headers", {}).get("Content-Length") or 0) or None
    from tqdm.auto import tqdm

    with tqdm(total=total, unit="B", unit_scale=True, desc="downloading SST", disable=not progress) as bar:
        while block := response.read(1 << 20):
            out.write(block)
            bar.update(len(block))


def parse_tree(line: str) -> Any:
    """Parses ``(3 (2 The) (4 (3 good) (2 film)))`` into nested tuples."""
    stack: list[list] = []
    root = None
    tokens = _TOKEN.findall(line)
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if tok == "(":
            stack.append([int(tokens[i + 1])])
            i += 2
            continue
        if tok == ")":
            node = tuple(stack.pop())
            if len(node) not in (2, 3):
                raise ValueError(f"not a binary tree node: {node!r} in {line[:60]!r}")
            if stack:
                stack[-1].append(node)
            else:
                root = node
        else:
            stack[-1].append(tok)
        i += 1
    if root is None or stack:
        raise ValueError(f"unbalanced tree: {line[:60]!r}")
    return root


def nodes(tree: Any) -> int:
    """Nodes of a binary SST tree: its n leaves and n - 1 pairs."""
    return 2 * len(words(tree)) - 1


def leaves(tree: Any) -> list[tuple[int, str]]:
    """The leaves ``(label, word)``, left to right."""
    out, stack = [], [tree]
    while stack:
        node = stack.pop()
        if len(node) == 2 and isinstance(node[1], str):
            out.append(node)
        else:
            stack.extend(reversed(node[1:]))
    return out


def words(tree: Any) -> list[str]:
    """The leaves' words, left to right."""
    return [word for _, word in leaves(tree)]


def argument_parser(description: str) -> argparse.ArgumentParser:
    """An SST example's argument parser, defaults shown, with its ``--data-dir`` flag."""
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--data-dir", default=None,
                   help="folder with train.txt, dev.txt, test.txt (default: the sample with --quick, else the "
                        "treebank downloaded once into $FOLD_DATA/sst or the cache folder)")
    return p


def load(split: str, data_dir: str | pathlib.Path, limit: int | None = None) -> list[Any]:
    """The trees of ``train``, ``dev`` or ``test``; ``limit`` takes an evenly spaced subset.

    (The files are not shuffled: their first lines are mostly positive.)
    """
    path = pathlib.Path(data_dir) / f"{split}.txt"
    if not path.exists():
        raise FileNotFoundError(f"SST split not found: {path} (pass --data-dir)")
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if limit is not None and limit < len(lines):
        lines = lines[:: len(lines) // limit][:limit]
    return [parse_tree(line) for line in lines]


def vocabulary(trees: list[Any], min_count: int = 1) -> dict[str, int]:
    """Word -> id for words seen at least ``min_count`` times, most frequent first."""
    counts = collections.Counter(w for t in trees for w in words(t))
    ranked = sorted((w for w, c in counts.items() if c >= min_count), key=lambda w: (-counts[w], w))
    return {w: i for i, w in enumerate(ranked)}


def sentiment_accuracies(logits: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    """Fine-grained (5-class) accuracy, and binary accuracy over non-neutral labels
    (positive when classes 3-4 get more probability than classes 0-1)."""
    z = logits - logits.max(1, keepdims=True)
    probs = np.exp(z) / np.exp(z).sum(1, keepdims=True)
    polar = labels != 2
    positive = probs[:, 3:].sum(1) > probs[:, :2].sum(1)
    return {"fine": float((logits.argmax(1) == labels).mean()),
            "binary": float((positive[polar] == (labels[polar] > 2)).mean())}
