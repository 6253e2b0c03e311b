"""Loading the Stanford Sentiment Treebank (PTB-style trees, one per line).

A tree is ``(label, word)`` for a leaf or ``(label, left, right)`` for an
inner node; labels are 0-4. Parsing is iterative, so deep trees are fine.
"""

from __future__ import annotations

import collections
import pathlib
import re
from typing import Any

import numpy as np

# A few hundred trees per split, committed for quick runs and tests (see its README).
SAMPLE = pathlib.Path(__file__).resolve().parents[1] / "tests" / "data" / "sst_sample"
URL = "https://nlp.stanford.edu/sentiment/trainDevTestTrees_PTB.zip"
# Words may contain non-ASCII spaces (e.g. "8\xa01\\/2"): split on ASCII blanks only.
_TOKEN = re.compile(r"\(|\)|[^ \t\r\n()]+")


def data_dir(given: str | pathlib.Path | None, quick: bool = False) -> pathlib.Path:
    """The SST folder to read: ``given`` (``--data-dir``), else the committed sample for a quick
    run. The full treebank is not bundled: without ``given`` a full run raises, saying where to
    get it."""
    if given is not None:
        return pathlib.Path(given)
    if quick:
        return SAMPLE
    raise FileNotFoundError(f"the Stanford Sentiment Treebank is not bundled: download {URL}, unzip it and pass "
                            "--data-dir path/to/trees (the folder with train.txt, dev.txt and test.txt); "
                            "--quick runs on the committed sample")


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


def words(tree: Any) -> list[str]:
    """The leaves' words, left to right."""
    out, stack = [], [tree]
    while stack:
        node = stack.pop()
        if len(node) == 2 and isinstance(node[1], str):
            out.append(node[1])
        else:
            stack.extend(reversed(node[1:]))
    return out


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
