"""Every benchmark's numeric flag out of range is a usage error naming the flag, before any work."""

from __future__ import annotations

import importlib
import sys

import pytest

# Per benchmark, its numeric flags: counts (at least 1) and those that may be 0 (seeds, workers).
COUNTS = {
    "backward": ["--sst-batches", "--tree-batches", "--hidden", "--weave-batches", "--weave-hidden", "--repeats"],
    "compile_count": ["--batch-size", "--chunk-size", "--models", "--examples"],
    "dynet_tagger": ["--batch-sizes", "--warmup", "--batches", "--rounds"],
    "dynet_treenn": ["--batch-sizes", "--warmup", "--batches", "--rounds"],
    "executor": ["--chunk-sizes", "--sst-batch", "--tree-batch", "--hidden", "--weave-batch", "--weave-hidden",
                 "--repeats"],
    "fuzz": ["--cases", "--jobs"],
    "host_allocator": ["--batch-sizes", "--rounds", "--batches", "--repeats", "--hidden"],
    "host_cores": ["--batch-sizes", "--batches", "--rounds"],
    "item_ladder": ["--batch-sizes", "--hidden", "--batches", "--repeats"],
    "memory": ["--batch-size", "--batches", "--hidden", "--embed-size"],
    "prefetch": ["--batch-sizes", "--batches", "--repeats"],
    "scaling": ["--devices", "--per-device", "--steps", "--hidden", "--embed-size"],
    "saved_rows": ["--batch-sizes", "--hidden", "--batches", "--repeats"],
    "schedule_build": ["--batch-size", "--batches", "--step-batches", "--leaves", "--repeats"],
    "sst_styles": ["--batch-size", "--hidden", "--embed-size", "--trees", "--repeats"],
    "sst_throughput": ["--batch-sizes", "--hidden", "--embed-size", "--trees", "--peer-trees", "--jax-trees",
                       "--dynet-trees", "--workers", "--repeats"],
    "step_profile": ["--batch-sizes", "--hidden", "--repeats"],
    "table1": ["--batch-sizes", "--hidden", "--chunk-size", "--repeats"],
    "weight_pass": ["--batch-sizes", "--hidden", "--repeats"],
}
NATURALS = {"compile_count": ["--workers"], "fuzz": ["--first-seed", "--case"], "table1": ["--seed"]}


def _parse(name: str, argv: list[str], monkeypatch) -> None:
    """Parses ``argv`` as benchmark ``name``'s command line (``parse_args``, else ``main``, which
    parses first)."""
    module = importlib.import_module(f"benchmarks.{name}")
    monkeypatch.setattr(sys, "argv", [name, *argv])
    if hasattr(module, "parse_args"):
        module.parse_args(argv)
    elif name == "fuzz":
        module.main()
    else:
        module.main(argv)


def _usage_error(name: str, argv: list[str], monkeypatch, capsys) -> str:
    with pytest.raises(SystemExit) as exit_:
        _parse(name, argv, monkeypatch)
    assert exit_.value.code == 2, (name, argv)
    return capsys.readouterr().err


@pytest.mark.parametrize(("name", "flag", "value", "message"), [
    *[(name, flag, "0", "must be int >= 1, got 0") for name, flags in COUNTS.items() for flag in flags],
    *[(name, flag, "-1", "must be int >= 0, got -1") for name, flags in NATURALS.items() for flag in flags],
    ("prefetch", "--step-ratios", "0", "must be float > 0, got 0"),
    ("table1", "--leaves", "1", "must be int >= 2, got 1"),
    ("memory", "--batch-size", "2.5", "invalid int >= 1 value: '2.5'"),
])
def test_a_numeric_flag_out_of_range_is_a_usage_error(name, flag, value, message, monkeypatch, capsys):
    assert f"{flag}: {message}" in _usage_error(name, [flag, value], monkeypatch, capsys)


@pytest.mark.parametrize("name", sorted(NATURALS))
def test_zero_is_a_seed_or_a_worker_count(name, monkeypatch, capsys):
    """The flags that may be 0 take it (``fuzz --case 0`` would run the case, so only its
    ``--first-seed`` is parsed, with a ``--cases`` that fails afterwards)."""
    if name == "fuzz":
        assert "--cases" in _usage_error(name, ["--first-seed", "0", "--cases", "0"], monkeypatch, capsys)
        return
    module = importlib.import_module(f"benchmarks.{name}")
    args = module.parse_args([flag for f in NATURALS[name] for flag in (f, "0")])
    assert all(getattr(args, f[2:].replace("-", "_")) == 0 for f in NATURALS[name])


def test_executor_chunk_sizes_are_powers_of_two(monkeypatch, capsys):
    assert "chunk sizes must be powers of two >= 8" in _usage_error(
        "executor", ["--chunk-sizes", "24"], monkeypatch, capsys)


@pytest.mark.parametrize("name", sorted(COUNTS))
def test_a_device_that_is_not_there_is_a_usage_error(name, monkeypatch, capsys):
    """Every benchmark takes ``--device``; a platform JAX does not have is refused as the flag is read."""
    assert "--device nowhere:" in _usage_error(name, ["--device", "nowhere"], monkeypatch, capsys)


@pytest.mark.parametrize("name", sorted(COUNTS))
def test_reserving_cores_after_the_backends_started_is_a_usage_error(name, monkeypatch, capsys):
    """Every benchmark takes ``--reserve-cores``; here JAX has started, so it is refused as the
    flag is read (``tests/test_cores.py`` runs a reservation in a fresh process)."""
    import jax

    jax.devices()
    err = _usage_error(name, ["--reserve-cores", "1"], monkeypatch, capsys)
    assert "--reserve-cores 1: reserve_host_cores must run before JAX starts its backends" in err
    assert "--reserve-cores: must be int >= 0, got -1" in _usage_error(name, ["--reserve-cores", "-1"], monkeypatch,
                                                                       capsys)
