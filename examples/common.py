"""Helpers shared by the examples: training loop, progress bars, reports."""

from __future__ import annotations

import argparse
import json
import pathlib
import platform
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
import optax
from tqdm.auto import tqdm

import fold as fd

RESULTS = pathlib.Path(__file__).resolve().parent / "results"


def add_training_flags(p: argparse.ArgumentParser, name: str, *, epochs: int, batch_size: int,
                       learning_rate: float, learning_rate_help: str | None = None) -> None:
    """The flags every example shares: schedule, seed, --quick, --json and --quiet."""
    p.add_argument("--epochs", type=int, default=epochs, help="passes over the training set")
    p.add_argument("--batch-size", type=int, default=batch_size, help="examples per batch")
    p.add_argument("--learning-rate", type=float, default=learning_rate, help=learning_rate_help)
    p.add_argument("--seed", type=int, default=0, help="seed of the parameters, shuffling and dropout")
    p.add_argument("--quick", action="store_true", help="a few seconds on a small subset")
    p.add_argument("--json", default=None, help=f"report path (default examples/results/{name}[_quick].json)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--workers", type=int, default=1,
                   help="processes building batches ahead of the device (0: build in this process)")


def make_train_step(compiler: fd.Compiler, optimizer: optax.GradientTransformation,
                    metric: str = "loss") -> Callable:
    """A jitted SGD step minimising the mean of ``metric`` over a batch.

    ``key`` switches the model's stochastic layers (dropout) on for the step.
    """

    @jax.jit
    def train_step(params, opt_state, batch, key):
        def loss_fn(p):
            return compiler.apply(p, batch, key).metrics[metric].mean()

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return train_step


def train(compiler: fd.Compiler, params: Any, data: list | fd.RecordedExamples, *, epochs: int, batch_size: int,
          optimizer: optax.GradientTransformation, seed: int, quiet: bool = False, num_workers: int = 0,
          on_epoch: Callable[[int, Any], dict] | None = None) -> tuple[Any, list[dict]]:
    """Trains with ``compiler.batches``; returns params and one record per epoch.

    Step ``n`` runs stochastic layers with ``fold_in(key(seed), n)``. The
    examples are walked once (``compiler.record``): every epoch sees them
    again, and batches of recorded examples are merged from arrays.
    """
    data = compiler.record(data, progress=not quiet)
    step = make_train_step(compiler, optimizer)
    key, n = jax.random.key(seed), 0
    opt_state = optimizer.init(params)
    history = []
    for epoch in tqdm(range(epochs), desc="epochs", disable=quiet):
        start, losses = time.perf_counter(), []
        # Equal batch sizes keep the number of compilations down (it is a static shape).
        batches = compiler.batches(data, batch_size, shuffle=True, seed=seed * 10_000 + epoch,
                                   drop_remainder=len(data) >= batch_size, num_workers=num_workers)
        n_batches = max(len(data) // batch_size, 1)
        for batch in tqdm(batches, total=n_batches, desc=f"epoch {epoch + 1}", leave=False, disable=quiet):
            params, opt_state, loss = step(params, opt_state, batch, jax.random.fold_in(key, n))
            n += 1
            losses.append(float(loss))
        record = {"epoch": epoch + 1, "train_loss": sum(losses) / len(losses),
                  "seconds": round(time.perf_counter() - start, 3)}
        if on_epoch is not None:
            record.update(on_epoch(epoch, params))
        history.append(record)
        if not quiet:
            tqdm.write(" ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in record.items()))
    return params, history


def train_keep_best(compiler: fd.Compiler, params: Any, data: list, dev_scores: Callable[[Any], dict],
                    key: str, **train_args: Any) -> tuple[dict, list[dict]]:
    """``train``, scoring the dev set after each epoch (``dev_scores(params)``);
    returns the best epoch's record (by ``dev_`` + ``key``, with its ``params``) and the history."""
    best: dict[str, Any] = {f"dev_{key}": -float("inf")}

    def on_epoch(epoch: int, p: Any) -> dict:
        scores = {f"dev_{k}": v for k, v in dev_scores(p).items()}
        if scores[f"dev_{key}"] > best[f"dev_{key}"]:
            best.update(scores, epoch=epoch + 1, params=p)
        return scores

    _, history = train(compiler, params, data, on_epoch=on_epoch, **train_args)
    return best, history


def outputs(compiler: fd.Compiler, params: Any, data: list, batch_size: int = 256) -> np.ndarray:
    """The root outputs of every example of ``data``, in order."""
    apply = jax.jit(compiler.apply)
    return np.concatenate([np.asarray(apply(params, b).outputs) for b in compiler.batches(data, batch_size)])


def per_example_metrics(compiler: fd.Compiler, params: Any, data: list, batch_size: int = 256) -> dict:
    """Per metric, the mean of its entries for each example of ``data`` (NaN if none)."""
    apply = jax.jit(compiler.apply)
    sums: dict[str, np.ndarray] = {}
    counts: dict[str, np.ndarray] = {}
    for offset, batch in zip(range(0, len(data), batch_size), compiler.batches(data, batch_size)):
        for name, m in apply(params, batch).metrics.items():
            mask = np.asarray(m.mask)
            values = np.asarray(m.values).reshape(int(mask.sum()), -1).mean(axis=1)
            example = np.asarray(m.example)[mask] + offset
            sums.setdefault(name, np.zeros(len(data)))
            counts.setdefault(name, np.zeros(len(data)))
            np.add.at(sums[name], example, values)
            np.add.at(counts[name], example, 1)
    with np.errstate(invalid="ignore"):
        return {name: sums[name] / counts[name] for name in sums}


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
    return out
