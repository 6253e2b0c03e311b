"""Arithmetic expression trees evaluated by a learned recursive network.

Expressions are nested tuples ``(op, left, right)`` with ``op`` in ``+ - *``
and integer leaves in [0, 9], nested up to depth 6; every intermediate
value stays within [-100, 100]. A Tree-RNN embeds each expression
(one dense layer per operator, reading its children's embeddings) and a
linear read-out predicts the value. The report gives the held-out mean
absolute error by nesting depth, against predicting the training mean.

Run: ``python -m examples.calculator`` (``--quick`` for a few-second run).
"""

from __future__ import annotations

import argparse
import random
from typing import Any

import jax.numpy as jnp
import numpy as np
import optax

import fold as fd
from examples import common
from examples.common import COUNT, add_training_flags, print_table, write_report

OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
LIMIT = 100
SCALE = 10.0  # targets are divided by this for training


def value(expr: Any) -> int:
    if isinstance(expr, int):
        return expr
    op, left, right = expr
    return OPS[op](value(left), value(right))


def depth(expr: Any) -> int:
    return 0 if isinstance(expr, int) else 1 + max(depth(expr[1]), depth(expr[2]))


def random_expression(rng: random.Random, max_depth: int) -> Any:
    """A random expression of nesting depth <= max_depth with all values in [-LIMIT, LIMIT]."""
    if max_depth == 0 or rng.random() < 0.2:
        return rng.randint(0, 9)
    while True:
        left = random_expression(rng, max_depth - 1)
        right = random_expression(rng, max_depth - 1)
        expr = (rng.choice(list(OPS)), left, right)
        if abs(value(expr)) <= LIMIT:
            return expr


def make_data(rng: random.Random, n: int, max_depth: int) -> list[tuple[Any, float]]:
    """``n`` expressions spread evenly over depths 1..max_depth, with their values."""
    data = []
    for i in range(n):
        target_depth = 1 + i % max_depth
        while True:
            e = random_expression(rng, target_depth)
            if depth(e) == target_depth:
                break
        data.append((e, float(value(e))))
    return data


def build_model(hidden: int, shared: bool = False) -> fd.Block:
    """(expression, value) -> squared error ('loss') and absolute error ('abs_error'). ``shared``
    computes a sub-expression reached along several paths once (``fd.Shared``): expressions that
    are DAGs (``examples/expression_dag.py``)."""
    expr = fd.ForwardDeclaration(fd.PyObjectType(), fd.TensorType((hidden,)))
    number = fd.Scalar() >> fd.Function(lambda x: x[:, None] / 10.0) >> fd.FC(hidden, activation=jnp.tanh)

    def operator() -> fd.Block:
        return fd.Record([(1, expr()), (2, expr())]) >> fd.Concat() >> fd.FC(hidden, activation=jnp.tanh)

    cases = {"num": number, **{op: operator() for op in OPS}}
    node = fd.OneOf(lambda e: "num" if isinstance(e, int) else e[0], cases)
    expr.resolve_to(fd.Shared(node) if shared else node)
    predict = expr() >> fd.FC(1, activation=None) >> fd.Function(lambda y: y[:, 0] * SCALE)
    c = fd.Composition()
    with c.scope():
        prediction = predict.reads(c.input[0])
        target = fd.Scalar().reads(c.input[1])
        error = fd.Function(jnp.subtract).reads(prediction, target)
        fd.Metric("loss").reads(fd.Function(lambda d: (d / SCALE) ** 2).reads(error))
        fd.Metric("abs_error").reads(fd.Function(jnp.abs).reads(error))
        c.output.reads(prediction)
    return c


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--train-size", type=COUNT, default=20_000, help="training expressions")
    p.add_argument("--test-size", type=COUNT, default=3_000, help="test expressions")
    p.add_argument("--dev-size", type=COUNT, default=1_000, help="dev expressions (they pick the best epoch)")
    p.add_argument("--max-depth", type=COUNT, default=6, help="deepest expression tree")
    p.add_argument("--hidden", type=COUNT, default=64, help="state size of the expression encoder")
    add_training_flags(p, "calculator", epochs=20, batch_size=64, learning_rate=2e-3)
    args = p.parse_args(argv)
    if args.quick:
        args.train_size, args.test_size, args.dev_size, args.epochs, args.hidden = 1_000, 300, 300, 4, 32
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    rng = random.Random(args.seed)
    train_data = make_data(rng, args.train_size, args.max_depth)
    test_data = make_data(rng, args.test_size, args.max_depth)
    dev_data = make_data(rng, args.dev_size, args.max_depth)  # drawn after the test set, which stays as it was

    compiler = fd.Compiler.create(build_model(args.hidden))
    trainer = common.trainer(compiler, optax.adam(args.learning_rate), args)
    test_recorded = compiler.record(test_data)

    def test_errors(p: Any) -> np.ndarray:
        return trainer.evaluate(p, test_recorded, per_example=True)["abs_error"]

    # The dev set picks the best epoch; the test set is only reported (its curve too, in the history).
    fitted = common.fit(trainer, train_data, args, "calculator", dev=dev_data, monitor="dev_abs_error",
                        scores=lambda p: {"test_abs_error": float(test_errors(p).mean())})
    params, history = fitted.best_params, fitted.history

    errors = test_errors(params)
    depths = np.array([depth(e) for e, _ in test_data])
    targets = np.array([t for _, t in test_data])
    mean = float(np.mean([t for _, t in train_data]))
    rows = []
    for d in range(1, args.max_depth + 1):
        at = depths == d
        if at.any():
            rows.append({"depth": d, "examples": int(at.sum()), "abs_error": float(errors[at].mean()),
                         "baseline_abs_error": float(np.abs(targets[at] - mean).mean())})
    print_table("held-out mean absolute error by depth",
                ["depth", "examples", "fold model", "predict the mean"],
                [[r["depth"], r["examples"], r["abs_error"], r["baseline_abs_error"]] for r in rows])
    report = {"example": "calculator", "args": vars(args), "history": history, "by_depth": rows}
    path = write_report("calculator_quick" if args.quick else "calculator", report, args.json)
    print(f"\nreport written to {path}")
    return report


if __name__ == "__main__":
    main()
