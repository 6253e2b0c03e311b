"""Counts each functional unit's implementations and writes the table beside the paper's.

Run: ``python -m benchmarks.loc`` (writes ``benchmarks/results/loc.json`` and ``loc.md``).
"""

from __future__ import annotations

import argparse
import json
import pathlib

from benchmarks.common import RESULTS
from benchmarks.loc.count import available_counter, count

HERE = pathlib.Path(__file__).resolve().parent
# Table 3 of Looks et al. (2017): lines with TensorFlow Fold and in the original implementation.
UNITS = (
    ("feed-forward attention", "attention", 26, 71),
    ("Tree-LSTM", "tree_lstm", 119, 219),
    ("weave module", "weave", 32, 44),
)
IMPLEMENTATIONS = ("fold", "jax", "torch")


def table(counter: str) -> list[dict]:
    """One row per unit: each implementation's count, fold's ratios and the paper's counts."""
    rows = []
    for unit, stem, paper_fold, paper_original in UNITS:
        files = {impl: f"{stem}_{impl}.py" for impl in IMPLEMENTATIONS}
        lines = {impl: count(HERE / name, counter).lines for impl, name in files.items()}
        rows.append({"unit": unit, **lines, "fold_to_jax": round(lines["fold"] / lines["jax"], 2),
                     "fold_to_torch": round(lines["fold"] / lines["torch"], 2), "paper_fold": paper_fold,
                     "paper_original": paper_original, "paper_ratio": round(paper_fold / paper_original, 2),
                     "files": files})
    return rows


def markdown(rows: list[dict], counter: str) -> str:
    head = ("| unit | fold | plain JAX | PyTorch | fold / JAX | fold / PyTorch | paper: Fold | paper: original "
            "| paper: ratio |\n" + "|---" * 9 + "|\n")
    body = "".join(f"| {r['unit']} | {r['fold']} | {r['jax']} | {r['torch']} | {r['fold_to_jax']:.2f} | "
                   f"{r['fold_to_torch']:.2f} | {r['paper_fold']} | {r['paper_original']} | {r['paper_ratio']:.2f} |\n"
                   for r in rows)
    return (head + body + f"\nLines of code without imports, docstrings, comments and blank lines "
            f"(counted by {counter}; `python -m benchmarks.loc`).\n")


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--counter", choices=("cloc", "pygount", "tokenize"), default=None,
                   help="what counts the stripped lines (default: cloc if on the PATH, else pygount if "
                        "installed, else the stripped lines themselves)")
    args = p.parse_args(argv)
    counter = args.counter or available_counter()
    rows = table(counter)
    result = {"counter": counter, "rows": rows}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "loc.json").write_text(json.dumps(result, indent=2) + "\n")
    text = markdown(rows, counter)
    (RESULTS / "loc.md").write_text(text)
    print(text, end="")
    print(f"written to {RESULTS / 'loc.json'} and {RESULTS / 'loc.md'}")
    return result


if __name__ == "__main__":
    main()
