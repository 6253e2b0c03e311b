"""Feed-forward attention (Raffel & Ellis 2016) on the variable-length addition problem.

Each sequence has T steps, T uniform in [T0, 1.1 T0]; a step is a pair
(value uniform in [-1, 1], marker). Exactly two steps are marked, one in
each half of the sequence, and the target is the sum of their values. A
prediction is correct when its absolute error is below 0.04.

The model is the Fold paper's Appendix A, written with ``Composition``,
``Map``, ``Sum``, ``Broadcast`` and ``ZipWith``: each step goes through a
dense ReLU layer to ``h_t``; attention scores ``e_t = s tanh(w . h_t + b)``
are normalised with a softmax (``exp``, ``Sum``, ``Broadcast``, divide) into
``alpha_t``; the context ``c = sum_t alpha_t h_t`` goes through a dense ReLU
layer and a linear output. ``s = 1`` (``--score-scale 1``) is Raffel &
Ellis's ``tanh`` score; bounded in [-1, 1], it cannot give the two marked
steps much more weight than the others (at most e^2 times), so the model
must undo a length-dependent normalisation and learns slowly. The default
``s = 10`` lets attention concentrate on the marked steps.

Run: ``python -m examples.attention`` (``--quick`` for a few-second run).
"""

from __future__ import annotations

import argparse
from typing import Any

import jax.numpy as jnp
import numpy as np
import optax

import fold as fd
from examples import common
from examples.common import COUNT, add_training_flags, print_table, write_report

TOLERANCE = 0.04


def make_data(rng: np.random.Generator, n: int, t0: int) -> list[tuple[list, float]]:
    """``n`` (sequence of [value, marker] pairs, target) examples."""
    data = []
    for _ in range(n):
        length = int(rng.integers(t0, int(1.1 * t0) + 1))
        values = rng.uniform(-1, 1, length)
        markers = np.zeros(length)
        half = length // 2
        first, second = int(rng.integers(0, half)), int(rng.integers(half, length))
        markers[[first, second]] = 1.0
        data.append((np.stack([values, markers], 1).tolist(), float(values[first] + values[second])))
    return data


def attention_block(hidden: int, score_scale: float = 10.0) -> fd.Composition:
    """Sequence of 2-vectors -> context vector, as a DAG (the Fold paper's Appendix A)."""
    encode = fd.FC(hidden, name="encode")
    score = fd.FC(1, activation=lambda e: score_scale * jnp.tanh(e), name="score")
    c = fd.Composition()
    with c.scope():
        h = fd.Map(fd.Vector(2) >> fd.Function(encode)).reads(c.input)
        exp_e = fd.Map(fd.Function(score) >> fd.Function(jnp.exp)).reads(h)
        z = (fd.Sum() >> fd.Broadcast()).reads(exp_e)
        alpha = fd.ZipWith(fd.Function(jnp.divide)).reads(exp_e, z)
        context = (fd.ZipWith(fd.Function(jnp.multiply)) >> fd.Sum()).reads(alpha, h)
        c.output.reads(context)
    return c


def build_model(hidden: int, score_scale: float = 10.0) -> fd.Composition:
    """(sequence, target) -> prediction; metrics 'loss' (squared error) and 'correct'."""
    predict = (attention_block(hidden, score_scale) >> fd.FC(hidden) >> fd.FC(1, activation=None)
               >> fd.Function(lambda y: y[:, 0]))
    c = fd.Composition()
    with c.scope():
        prediction = predict.reads(c.input[0])
        error = fd.Function(jnp.subtract).reads(prediction, fd.Scalar().reads(c.input[1]))
        fd.Metric("loss").reads(fd.Function(jnp.square).reads(error))
        fd.Metric("correct").reads(fd.Function(lambda d: (jnp.abs(d) < TOLERANCE).astype(d.dtype)).reads(error))
        c.output.reads(prediction)
    return c


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--t0", type=COUNT, nargs="+", default=[50],
                   help="minimum sequence lengths to train, one model each")
    p.add_argument("--train-size", type=COUNT, default=20_000, help="training sequences")
    p.add_argument("--test-size", type=COUNT, default=1_000, help="test sequences")
    p.add_argument("--dev-size", type=COUNT, default=1_000, help="dev sequences (they pick the best epoch)")
    p.add_argument("--hidden", type=COUNT, default=100, help="hidden units of the feed-forward layers")
    p.add_argument("--score-scale", type=float, default=10.0,
                   help="s in the score s * tanh(w . h + b); 1 is Raffel & Ellis's tanh score")
    add_training_flags(p, "attention", epochs=4, batch_size=64, learning_rate=3e-3,
                       learning_rate_help="initial rate, cosine-decayed to 0")
    args = p.parse_args(argv)
    if args.quick:
        args.t0, args.train_size, args.test_size, args.dev_size, args.epochs, args.hidden = [10], 1_024, 256, 256, 4, 32
        args.learning_rate = 1e-2
    return args


def run(t0: int, args: argparse.Namespace) -> dict[str, Any]:
    rng = np.random.default_rng(args.seed + t0)
    train_data = make_data(rng, args.train_size, t0)
    test_data = make_data(rng, args.test_size, t0)
    dev_data = make_data(rng, args.dev_size, t0)  # drawn after the test set, which stays as it was
    compiler = fd.Compiler.create(build_model(args.hidden, args.score_scale))
    # Cosine decay: the 0.04 tolerance needs the last epochs' small steps.
    steps = args.epochs * max(len(train_data) // args.batch_size, 1)
    trainer = common.trainer(compiler, optax.adam(optax.cosine_decay_schedule(args.learning_rate, steps)), args)
    test_recorded = compiler.record(test_data)

    def test_metrics(p: Any) -> dict[str, float]:
        m = trainer.evaluate(p, test_recorded)
        return {"test_mse": m["loss"], "test_accuracy": m["correct"]}

    # The dev set picks the best epoch; the test set is only reported (its curve too, in the history).
    fitted = common.fit(trainer, train_data, args, f"attention_t0_{t0}", dev=dev_data, scores=test_metrics,
                        monitor="dev_loss")
    return {"t0": t0, "history": fitted.history, **test_metrics(fitted.best_params)}


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    runs = [run(t0, args) for t0 in args.t0]
    print_table("variable-length addition, held-out",
                ["T0", "accuracy (|err| < 0.04)", "mse", "epochs"],
                [[r["t0"], r["test_accuracy"], r["test_mse"], len(r["history"])] for r in runs])
    report = {"example": "attention", "args": vars(args), "runs": runs}
    path = write_report("attention_quick" if args.quick else "attention", report, args.json)
    print(f"\nreport written to {path}")
    return report


if __name__ == "__main__":
    main()
