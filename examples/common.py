"""Helpers shared by the examples: flags, the ``fd.Trainer`` they describe, tables and reports."""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import platform
from collections.abc import Callable
from typing import Any

import jax
import optax

import fold as fd

RESULTS = pathlib.Path(__file__).resolve().parent / "results"
CHECKPOINTS = pathlib.Path(__file__).resolve().parent / "checkpoints"


def number(kind: type, low: float, high: float = math.inf, *, low_open: bool = False,
           high_open: bool = False) -> Callable[[str], Any]:
    """An argparse ``type``: a ``kind`` (``int`` or ``float``) from ``low`` to ``high``, each end
    included unless ``*_open``, so that a flag out of range is a usage message, not a traceback
    from deep in the run.

    >>> number(int, 1)("3"), number(float, 0, 1, high_open=True)("0.25")
    (3, 0.25)
    """
    ends = ("(" if low_open else "[") + f"{low:g}, {high:g}" + (")" if high_open else "]")
    name = f"{kind.__name__} in {ends}" if high < math.inf else f"{kind.__name__} {'>' if low_open else '>='} {low:g}"

    def parse(text: str) -> Any:
        value = kind(text)
        if value < low or (low_open and value == low) or value > high or (high_open and value == high):
            raise argparse.ArgumentTypeError(f"must be {name}, got {text}")
        return value

    parse.__name__ = name  # argparse names it in "invalid ... value" for text that is no number
    return parse


# Counts, seeds and worker counts (which may be 0), learning and dropout rates.
COUNT, NATURAL = number(int, 1), number(int, 0)
RATE, FRACTION = number(float, 0, low_open=True), number(float, 0, 1, high_open=True)


class _ReserveCores(argparse.Action):
    """``--reserve-cores N``: ``fd.reserve_host_cores(N)``, as the flag is read (0: none). Give it
    before any flag that starts JAX (a benchmark's ``--device``)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        if values:
            try:
                fd.reserve_host_cores(values)
            except RuntimeError as e:
                parser.error(f"--reserve-cores {values}: {e}")
        setattr(namespace, self.dest, values)


def add_reserve_flag(p: argparse.ArgumentParser) -> None:
    """``--reserve-cores N``, which the examples and benchmarks take."""
    p.add_argument("--reserve-cores", type=NATURAL, default=0, action=_ReserveCores, metavar="N",
                   help="leave N CPU cores to building batches (fd.reserve_host_cores; default 0: none)")


def add_training_flags(p: argparse.ArgumentParser, name: str, *, epochs: int, batch_size: int,
                       learning_rate: float, learning_rate_help: str | None = None) -> None:
    """The flags every example shares: schedule, seed, --quick, --json, --quiet, workers, checkpoints,
    in-place updates, reserved cores."""
    p.add_argument("--epochs", type=COUNT, default=epochs, help="passes over the training set")
    p.add_argument("--batch-size", type=COUNT, default=batch_size, help="examples per batch")
    p.add_argument("--learning-rate", type=RATE, default=learning_rate,
                   help=learning_rate_help or "step size of the optimizer (Adam)")
    p.add_argument("--seed", type=NATURAL, default=0, help="seed of the parameters, shuffling and dropout")
    p.add_argument("--quick", action="store_true", help="a few seconds on a small subset")
    p.add_argument("--json", default=None, help=f"report path (default examples/results/{name}[_quick].json)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--workers", type=NATURAL, default=1,
                   help="processes building batches ahead of the device (0: build in this process)")
    p.add_argument("--checkpoint-dir", default=None,
                   help=f"the last state and the best parameters go to DIR/{name}[_quick] "
                        "(default DIR: examples/checkpoints)")
    p.add_argument("--resume", action="store_true",
                   help="continue the run saved in the checkpoint dir (without it, a run replaces the one saved there)")
    p.add_argument("--log-dir", default=None, help="write TensorBoard scalars there (needs tensorboardX)")
    p.add_argument("--donate", action="store_true",
                   help="update the parameters and the optimizer's state in place (fd.Trainer(donate=True)): "
                        "faster for large embedding tables, but a diverging run stops without going back a step")
    add_reserve_flag(p)


def trainer(compiler: fd.Compiler, optimizer: optax.GradientTransformation, args: argparse.Namespace,
            **kwargs: Any) -> fd.Trainer:
    """The ``fd.Trainer`` the flags of ``add_training_flags`` describe."""
    return fd.Trainer(compiler, optimizer, batch_size=args.batch_size, seed=args.seed, num_workers=args.workers,
                      progress=not args.quiet, donate=args.donate, **kwargs)


def fit(trainer: fd.Trainer, train: list, args: argparse.Namespace, name: str, **kwargs: Any) -> fd.FitResult:
    """``trainer.fit`` for ``args.epochs`` epochs, checkpointing into ``checkpoint_dir(args, name)``
    and resuming from it with ``--resume`` (without it, the run replaces the one saved there, as
    running an example again should); TensorBoard scalars with ``--log-dir``."""
    return trainer.fit(train, epochs=args.epochs, checkpoint_dir=checkpoint_dir(args, name), resume=args.resume,
                       overwrite=not args.resume, log_dir=args.log_dir, **kwargs)


def checkpoint_dir(args: argparse.Namespace, name: str) -> pathlib.Path:
    """``--checkpoint-dir`` (default examples/checkpoints, git-ignored) / NAME[_quick]."""
    return pathlib.Path(args.checkpoint_dir or CHECKPOINTS) / (f"{name}_quick" if args.quick else name)


def print_table(title: str, header: list[str], rows: list[list[Any]]) -> None:
    """Prints a plain aligned table."""
    cells = [header] + [[f"{c:.4f}" if isinstance(c, float) else str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    print(f"\n{title}")
    for i, row in enumerate(cells):
        print("  ".join(c.rjust(w) for c, w in zip(row, widths)))
        if i == 0:
            print("  ".join("-" * w for w in widths))


def write_report(name: str, report: dict, path: str | None = None) -> pathlib.Path:
    """Writes ``report`` (plus the machine) as JSON, by default to examples/results/NAME.json."""
    out = pathlib.Path(path) if path else RESULTS / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    report = {**report, "machine": {"platform": platform.platform(), "processor": platform.processor(),
                                    "jax_backend": jax.default_backend(),
                                    "devices": [str(d) for d in jax.devices()]}}
    out.write_text(json.dumps(report, indent=2) + "\n")
    if name.endswith("_quick"):
        print("\n(a --quick run is a smoke test: a small subset, few epochs and a small model, so its scores "
              "are not those of the full run in docs/examples.md)")
    return out
