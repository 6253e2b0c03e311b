"""Helpers shared by the benchmarks: timing, machine description, JSON and plots."""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import pathlib
import platform
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np
import optax

import fold as fd
from examples.common import add_reserve_flag

RESULTS = pathlib.Path(__file__).resolve().parent / "results"


def make_train_step(compiler: fd.Compiler, optimizer: optax.GradientTransformation,
                    metric: str = "loss", total: bool = False, donate: bool = False) -> Callable:
    """A jitted optimizer step on the mean of ``metric`` over a batch (its sum with ``total``, as
    DyNet's scripts train): ``step(params, opt_state, batch, key) -> (params, opt_state, loss)``,
    ``key`` switching stochastic layers on. The step ``fd.Trainer`` runs, bare, so that
    benchmarks time exactly the device work. With ``donate`` the step updates ``params`` and
    ``opt_state`` in place (``donate_argnums``), as a loop that threads them through its steps
    may, and the arrays passed in are deleted."""

    def train_step(params, opt_state, batch, key):
        def loss_fn(p):
            values = compiler.apply(p, batch, key).metrics[metric]
            return values.sum() if total else values.mean()

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return jax.jit(train_step, donate_argnums=(0, 1) if donate else ())


def machine() -> dict[str, Any]:
    """CPU model, core count, JAX version, backend, devices (and the one run on) and any glibc malloc
    settings (they change step times: ``benchmarks.host_allocator``)."""
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
            "jax": jax.__version__, "backend": jax.default_backend(), "devices": [str(d) for d in jax.devices()],
            "device": str(jax.config.jax_default_device or jax.devices()[0]),
            "malloc_env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("MALLOC_")}}


class _UseDevice(argparse.Action):
    """``--device PLATFORM``: makes the first device of ``PLATFORM`` JAX's default, as the flag is read."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        try:
            device = jax.devices(values)[0]
        except RuntimeError as e:
            parser.error(f"--device {values}: {e}")
        jax.config.update("jax_default_device", device)
        setattr(namespace, self.dest, values)


def add_device_flag(p: argparse.ArgumentParser) -> None:
    """``--device PLATFORM`` and ``--reserve-cores N``, which every benchmark takes: the first GPU
    run is one command."""
    add_reserve_flag(p)
    p.add_argument("--device", default=None, action=_UseDevice, metavar="PLATFORM",
                   help="run on this platform's first device: cpu, gpu or tpu (default: JAX's default backend)")


def add_run_flags(p: argparse.ArgumentParser, name: str, quick: str, data_dir: bool = True) -> None:
    """The flags every benchmark shares: ``--data-dir`` (SST), ``--quick``, ``--json`` and ``--device``."""
    add_device_flag(p)
    if data_dir:
        p.add_argument("--data-dir", default=None,
                       help="SST folder with train.txt, dev.txt, test.txt (--quick: the committed sample)")
    p.add_argument("--quick", action="store_true", help=f"{quick} (what the tests run)")
    p.add_argument("--json", default=None, help=f"results path (default benchmarks/results/{name}[_quick].json)")


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    """``fn()`` and the wall time it took."""
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def median_seconds(fn: Callable[[], Any], repeats: int) -> float:
    """Median wall time of ``repeats`` calls of ``fn`` (call it once before to warm up)."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


# Cases a long checking run (``benchmarks.fuzz``, ``benchmarks.random_decoders``) runs in one process
# between clearings of JAX's caches. Every case compiles functions of its own (about 45 MB a case
# kept; a 300-case decoder run stopped after 40 cases with XLA's LLVM failing to allocate memory),
# but clearing after each one also drops the small eager operations (``init``, the reference) that
# every case shares, which then compile again: 30 fuzz cases took 226 s clearing after each and
# 182 s never clearing. Every 10 cases, a process's RSS stays flat (about 2 GB).
CLEAR_EVERY = 10


def clear_caches_after(cases: int) -> None:
    """Clears JAX's caches when ``cases`` (the cases this process has run) is a multiple of
    ``CLEAR_EVERY``, so that a long run's memory stays flat."""
    if cases % CLEAR_EVERY == 0:
        jax.clear_caches()


def interleaved_medians(fns: dict[str, Callable[[], Any]], repeats: int, warmup: int = 0,
                        settle: float = 0.0) -> dict[str, float]:
    """Median wall time of each of ``fns`` over ``repeats`` rounds that take turns: in each round,
    each function runs twice and its second call is timed. Taking turns, rather than timing one
    function's calls and then the next's, exposes them to the same drift of a shared machine, so
    their ratios stay fair. The untimed call keeps a timed call from directly following another
    function's; it is no full cure: right after a call with gigabytes of temporaries, a
    millisecond matmul ran at a third to a half of its speed for several calls, so functions of
    very different sizes are better timed each in a row (``table1.matmul_limit`` does), or given
    ``settle`` seconds: each function's untimed calls then repeat until they have run that long
    (a 5 ms generation ran 1.4x slower for its first 40 ms after 70 ms of PyTorch or of sleep,
    whatever its own calls before; ``generation`` settles 0.1 s).

    Python's garbage is collected first, and ``warmup`` untimed rounds run before the timed
    ones: after a benchmark had built nine GGNN batches on the host, the first nine rounds of
    fold's step ran 1.3-1.4x as long as the rounds after them."""
    gc.collect()
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            begin = time.perf_counter()
            fn()
            while time.perf_counter() - begin < settle:
                fn()
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def largest_gap(a: Any, b: Any) -> float:
    """The largest absolute difference between matching leaves of pytrees ``a`` and ``b`` (two
    ways of computing the same parameters, say)."""
    return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y))))
               for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)))


def save_results(name: str, results: dict, args: argparse.Namespace,
                 plot: Callable[[pathlib.Path], None]) -> pathlib.Path:
    """Writes ``results`` plus the machine as JSON to ``args.json`` (default
    ``benchmarks/results/NAME[_quick].json``), has ``plot`` draw the PNG next to it, and says
    where both went."""
    out = pathlib.Path(args.json) if args.json else RESULTS / f"{name}{'_quick' if args.quick else ''}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({**results, "reserve_cores": getattr(args, "reserve_cores", 0), "machine": machine()},
                              indent=2) + "\n")
    png = out.with_suffix(".png")
    plot(png)
    print(f"\nresults written to {out} and {png.name}")
    return out


@contextlib.contextmanager
def figure(path: pathlib.Path, size: tuple[float, float] = (6, 3.5)) -> Iterator[Any]:
    """Yields a matplotlib ``Axes``; saves the figure to ``path`` (PNG) on exit."""
    import matplotlib

    matplotlib.use("Agg")  # benchmarks run headless
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=size)
    try:
        yield ax
        fig.tight_layout()
        fig.savefig(path, dpi=100)
    finally:
        plt.close(fig)

