"""The calculator's model on expressions that are DAGs: common sub-expressions computed once.

Each expression is a straight-line program: starting from two digits, every
step applies ``+ - *`` to the value before it and one of the last four, so a value is read by
several later steps and the expression, as a tree, repeats it once per path
(a 16-step program unfolds into about 1,900 tree nodes on average). The
calculator's Tree-RNN (``examples/calculator.py``) with its recursion wrapped
in ``fd.Shared`` computes every distinct sub-expression once per example, its
gradient summed over its uses. The report gives the held-out mean absolute
error by program length against predicting the training mean, and what
sharing saves: operation calls and host time of the test set's batches,
shared against the same model walking the expressions as trees.

Run: ``python -m examples.expression_dag`` (``--quick`` for a few-second run).
"""

from __future__ import annotations

import argparse
import random
import time
from typing import Any

import numpy as np
import optax

import fold as fd
from examples import common
from examples.calculator import LIMIT, OPS, build_model
from examples.common import COUNT, add_training_flags, print_table, write_report

WINDOW = 4  # a step reads two of the last WINDOW values


def random_program(rng: random.Random, steps: int) -> tuple[Any, float]:
    """A random expression DAG of ``steps`` operations (every value within [-LIMIT, LIMIT]) and its value."""
    nodes: list[Any] = [rng.randint(0, 9), rng.randint(0, 9)]
    values = [float(n) for n in nodes]
    for _ in range(steps):
        while True:
            # Every step reads the one before, so the program is one expression of all its steps.
            i, j = len(nodes) - 1, rng.randrange(max(0, len(nodes) - WINDOW), len(nodes))
            if rng.random() < 0.5:
                i, j = j, i
            op = rng.choice(list(OPS))
            v = OPS[op](values[i], values[j])
            if abs(v) <= LIMIT:
                break
        nodes.append((op, nodes[i], nodes[j]))
        values.append(v)
    return nodes[-1], values[-1]


def sizes(expr: Any) -> tuple[int, int]:
    """``(distinct operations, operations of the tree expansion)`` of an expression, in linear time."""
    tree: dict[int, int] = {}
    stack = [expr]
    while stack:
        e = stack[-1]
        if isinstance(e, int) or id(e) in tree:
            stack.pop()
            continue
        kids = [k for k in e[1:] if not isinstance(k, int) and id(k) not in tree]
        if kids:
            stack.extend(kids)
            continue
        stack.pop()
        tree[id(e)] = 1 + sum(tree.get(id(k), 0) for k in e[1:])
    return len(tree), tree.get(id(expr), 0)


def make_data(rng: random.Random, n: int, max_steps: int) -> list[tuple[Any, float]]:
    """``n`` programs spread evenly over 1..max_steps operations, with their values."""
    return [random_program(rng, 1 + i % max_steps) for i in range(n)]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--train-size", type=COUNT, default=20_000, help="training programs")
    p.add_argument("--test-size", type=COUNT, default=3_000, help="test programs")
    p.add_argument("--dev-size", type=COUNT, default=1_000, help="dev programs (they pick the best epoch)")
    p.add_argument("--max-steps", type=COUNT, default=16, help="most operations in a program")
    p.add_argument("--hidden", type=COUNT, default=64, help="state size of the expression encoder")
    add_training_flags(p, "expression_dag", epochs=20, batch_size=64, learning_rate=2e-3)
    args = p.parse_args(argv)
    if args.quick:
        args.train_size, args.test_size, args.dev_size, args.epochs, args.hidden = 1_000, 300, 300, 4, 32
        args.max_steps = min(args.max_steps, 8)
    return args


def sharing_costs(hidden: int, data: list[tuple[Any, float]], batch_size: int) -> dict:
    """Operation calls and host seconds to build ``data``'s batches with the shared model and
    with the same model walking every expression as a tree."""
    costs = {}
    for name, shared in (("shared", True), ("tree", False)):
        compiler = fd.Compiler.create(build_model(hidden, shared=shared))
        start, nodes = time.perf_counter(), 0
        for k in range(0, len(data), batch_size):
            nodes += compiler.build_batch(data[k:k + batch_size]).stats.num_nodes
        costs[name] = {"nodes": nodes, "build_seconds": time.perf_counter() - start}
    return costs


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    rng = random.Random(args.seed)
    train_data = make_data(rng, args.train_size, args.max_steps)
    test_data = make_data(rng, args.test_size, args.max_steps)
    dev_data = make_data(rng, args.dev_size, args.max_steps)

    compiler = fd.Compiler.create(build_model(args.hidden, shared=True))
    trainer = common.trainer(compiler, optax.adam(args.learning_rate), args)
    test_recorded = compiler.record(test_data)

    def test_errors(p: Any) -> np.ndarray:
        return trainer.evaluate(p, test_recorded, per_example=True)["abs_error"]

    fitted = common.fit(trainer, train_data, args, "expression_dag", dev=dev_data, monitor="dev_abs_error",
                        scores=lambda p: {"test_abs_error": float(test_errors(p).mean())})
    params, history = fitted.best_params, fitted.history

    errors = test_errors(params)
    steps = np.array([sizes(e)[0] for e, _ in test_data])
    expanded = np.array([sizes(e)[1] for e, _ in test_data])
    targets = np.array([t for _, t in test_data])
    mean = float(np.mean([t for _, t in train_data]))
    rows = []
    for s in range(1, args.max_steps + 1):
        at = steps == s
        if at.any():
            rows.append({"operations": s, "examples": int(at.sum()), "tree_operations": float(expanded[at].mean()),
                         "abs_error": float(errors[at].mean()),
                         "baseline_abs_error": float(np.abs(targets[at] - mean).mean())})
    print_table("held-out mean absolute error by distinct operations",
                ["operations", "examples", "as a tree (mean)", "fold model", "predict the mean"],
                [[r["operations"], r["examples"], r["tree_operations"], r["abs_error"], r["baseline_abs_error"]]
                 for r in rows])
    costs = sharing_costs(args.hidden, test_data, args.batch_size)
    print_table("building the test set's batches", ["model", "operation calls", "host seconds"],
                [[k, v["nodes"], v["build_seconds"]] for k, v in costs.items()])
    report = {"example": "expression_dag", "args": vars(args), "history": history, "by_operations": rows,
              "test_costs": costs}
    path = write_report("expression_dag_quick" if args.quick else "expression_dag", report, args.json)
    print(f"\nreport written to {path}")
    return report


if __name__ == "__main__":
    main()
