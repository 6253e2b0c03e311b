"""fd.Trainer: training steps against a closed-form reference, evaluation against per-example NumPy,
reproducibility, resuming (after an epoch and mid-epoch, through a real KeyboardInterrupt), early
stopping, checkpoints, TensorBoard scalars and bad arguments."""

from __future__ import annotations

import json
import math
import struct

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import fold as fd

N, BATCH = 40, 8


def regression(dropout: float = 0.0) -> fd.Block:
    """([x, 1], target) -> prediction w.[x, 1] + b; metrics 'loss' (squared error) and 'abs_error'."""
    c = fd.Composition()
    with c.scope():
        features = fd.Vector(2)
        if dropout:
            features = features >> fd.Dropout(dropout)
        y = (features >> fd.FC(1, activation=None, name="linear") >> fd.Function(lambda v: v[:, 0])).reads(c.input[0])
        error = fd.Function(jnp.subtract).reads(y, fd.Scalar().reads(c.input[1]))
        fd.Metric("loss").reads(fd.Function(jnp.square).reads(error))
        fd.Metric("abs_error").reads(fd.Function(jnp.abs).reads(error))
        c.output.reads(y)
    return c


def data(n: int = N, seed: int = 0) -> list:
    xs = np.random.default_rng(seed).uniform(-1, 1, n)
    return [([float(x), 1.0], float(2.0 * x - 0.5)) for x in xs]


def predictions(params: dict, examples: list) -> np.ndarray:
    w, b = np.asarray(params["linear"]["w"]), np.asarray(params["linear"]["b"])
    return np.array([np.asarray(x) @ w[:, 0] + b[0] for x, _ in examples])


def trainer(optimizer=None, **kwargs) -> fd.Trainer:
    kwargs.setdefault("batch_size", BATCH)
    return fd.Trainer(fd.Compiler.create(regression(kwargs.pop("dropout", 0.0))),
                      optimizer or optax.sgd(0.1), progress=False, **kwargs)


def leaves_equal(a, b) -> bool:
    return all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def assert_sgd(params, start, examples, lr, seed, steps):
    """``params`` are ``steps`` steps of plain NumPy gradient descent from ``start`` on the mean squared
    error of each batch, in the documented order (``default_rng([seed, epoch]).permutation``, last
    partial batch dropped)."""
    w = np.asarray(start["linear"]["w"], np.float64)[:, 0].copy()
    b = float(np.asarray(start["linear"]["b"])[0])
    x = np.array([e[0] for e in examples])
    y = np.array([e[1] for e in examples])
    for step in range(steps):
        epoch, i = divmod(step, N // BATCH)
        idx = np.random.default_rng([seed, epoch]).permutation(N)[i * BATCH:(i + 1) * BATCH]
        err = x[idx] @ w + b - y[idx]
        w, b = w - lr * 2 * (err @ x[idx]) / BATCH, b - lr * 2 * err.mean()
    np.testing.assert_allclose(np.asarray(params["linear"]["w"])[:, 0], w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(params["linear"]["b"])[0], b, rtol=1e-5, atol=1e-6)


def test_each_step_is_sgd_on_the_batch_the_seeded_order_gives():
    lr, seed = 0.1, 3
    t = trainer(optax.sgd(lr), seed=seed)
    examples = data()
    start = t.init()
    run = t.fit(examples, epochs=2, params=start.params)
    assert_sgd(run.params, start.params, examples, lr, seed, steps=2 * (N // BATCH))
    assert int(run.state.step) == 2 * (N // BATCH) and int(run.state.epoch) == 2
    assert [r["epoch"] for r in run.history] == [1, 2] and run.stopped == "epochs"
    assert run.best is None  # nothing to evaluate on


def test_evaluate_and_predict_match_per_example_numpy():
    t = trainer(eval_batch_size=7)
    params = t.init().params
    examples = data(23)
    pred = predictions(params, examples)
    err = pred - np.array([e[1] for e in examples])
    np.testing.assert_allclose(t.predict(params, examples), pred, rtol=1e-5, atol=1e-6)
    means = t.evaluate(params, examples)
    assert set(means) == {"loss", "abs_error"}
    np.testing.assert_allclose(means["loss"], np.mean(err ** 2), rtol=1e-5)
    np.testing.assert_allclose(means["abs_error"], np.mean(np.abs(err)), rtol=1e-5)
    per = t.evaluate(params, examples, per_example=True)
    np.testing.assert_allclose(per["loss"], err ** 2, rtol=1e-5, atol=1e-7)
    recorded = t.compiler.record(examples)
    np.testing.assert_allclose(t.evaluate(params, recorded, per_example=True)["abs_error"], np.abs(err),
                               rtol=1e-5, atol=1e-7)


def test_evaluate_a_metric_some_batches_or_all_examples_give_no_entry():
    # A metric per item of a sequence: empty sequences give none. Per example, a batch without
    # entries crashed (reshape of an empty array); over the dataset, no entry at all gave 0.0.
    c = fd.Composition()
    with c.scope():
        xs = fd.Map(fd.Scalar()).reads(c.input)
        (fd.Map(fd.Function(jnp.square) >> fd.Metric("square")) >> fd.Void()).reads(xs)
        c.output.reads(fd.Sum().reads(xs))
    t = fd.Trainer(fd.Compiler.create(c), optax.sgd(0.1), loss=lambda r: r.outputs.sum(), eval_batch_size=2,
                   progress=False)
    params = t.init().params
    examples = [[], [], [1.0, 2.0], [], [3.0]]  # the first batch has no entry
    per = t.evaluate(params, examples, per_example=True)["square"]
    np.testing.assert_allclose(per, [np.nan, np.nan, 2.5, np.nan, 9.0])
    assert t.evaluate(params, examples)["square"] == pytest.approx(14.0 / 3)
    assert np.isnan(t.evaluate(params, [[], []])["square"])


def test_fit_keeps_the_best_dev_parameters_and_learns():
    t = trainer(optax.adam(0.05))
    dev = data(16, seed=1)
    run = t.fit(data(), epochs=8, dev=dev)
    assert all("dev_loss" in r and "dev_abs_error" in r for r in run.history)
    best = min(run.history, key=lambda r: r["dev_loss"])
    assert run.best == best and best["best"]
    assert t.evaluate(run.best_params, dev)["loss"] == pytest.approx(best["dev_loss"], rel=1e-6)
    assert run.history[-1]["dev_loss"] < 0.1 * run.history[0]["dev_loss"]


def test_same_seed_same_run_and_another_seed_another():
    def params(seed):
        return trainer(optax.adam(0.05), seed=seed, dropout=0.3).fit(data(), epochs=2).params

    assert leaves_equal(params(0), params(0))
    assert not leaves_equal(params(0), params(1))


def test_resuming_after_an_epoch_continues_the_same_run(tmp_path):
    full = trainer(optax.adam(0.05), dropout=0.3).fit(data(), epochs=3, dev=data(8, 1))
    trainer(optax.adam(0.05), dropout=0.3).fit(data(), epochs=1, dev=data(8, 1), checkpoint_dir=tmp_path)
    resumed = trainer(optax.adam(0.05), dropout=0.3).fit(data(), epochs=3, dev=data(8, 1),
                                                         checkpoint_dir=tmp_path, resume=True)
    assert leaves_equal(resumed.params, full.params)
    assert leaves_equal(resumed.state.opt_state, full.state.opt_state)
    assert [r["step"] for r in resumed.history] == [r["step"] for r in full.history]
    assert json.loads((tmp_path / "history.json").read_text()) == resumed.history


def test_an_interrupt_mid_epoch_saves_and_resuming_finishes_the_same_run(tmp_path):
    calls = []

    def interrupt_second_time(params):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return {"calls": float(len(calls))}

    full = trainer(optax.adam(0.05), dropout=0.3).fit(data(), epochs=2)
    stopped = trainer(optax.adam(0.05), dropout=0.3).fit(data(), epochs=2, scores=interrupt_second_time,
                                                         eval_every=3, checkpoint_dir=tmp_path)
    assert stopped.stopped == "interrupted" and int(stopped.state.step) == 6
    assert int(stopped.state.epoch) == 1 and int(stopped.state.epoch_step) == 1  # 5 steps per epoch
    resumed = trainer(optax.adam(0.05), dropout=0.3).fit(data(), epochs=2, checkpoint_dir=tmp_path, resume=True)
    assert int(resumed.state.step) == 10 and resumed.stopped == "epochs"
    assert leaves_equal(resumed.params, full.params)


def test_early_stopping_after_patience_evaluations_without_improvement(tmp_path):
    scores = iter([3.0, 1.0, 2.0, 2.5, 0.5])

    def accuracy(params):
        return {"accuracy": next(scores)}

    run = trainer().fit(data(), epochs=5, scores=accuracy, patience=2, checkpoint_dir=tmp_path)
    assert run.stopped == "early_stopping"
    assert [r["accuracy"] for r in run.history] == [3.0, 1.0, 2.0]
    assert run.best["accuracy"] == 3.0 and run.best["epoch"] == 1  # "accuracy" is maximised
    first = trainer().fit(data(), epochs=1).params
    assert leaves_equal(run.best_params, first)
    assert leaves_equal(fd.load_checkpoint(tmp_path / "best.npz", first), first)


def test_eval_every_also_evaluates_the_steps_after_the_last_evaluation():
    dev = data(8, 1)
    run = trainer().fit(data(), epochs=2, dev=dev, eval_every=3)  # 10 steps
    assert [r["step"] for r in run.history] == [3, 6, 9, 10]
    final = trainer().evaluate(run.params, dev)["loss"]
    assert run.history[-1]["dev_loss"] == pytest.approx(final, rel=1e-6)
    assert run.best == min(run.history, key=lambda r: r["dev_loss"])
    on_the_last_step = trainer().fit(data(), epochs=2, dev=dev, eval_every=5)
    assert [r["step"] for r in on_the_last_step.history] == [5, 10]


def test_monitor_and_mode_choose_the_best():
    run = trainer(optax.adam(0.05)).fit(data(), epochs=3, dev=data(8, 1), monitor="dev_loss", mode="max")
    assert run.best == max(run.history, key=lambda r: r["dev_loss"])


def _events(path) -> list:
    """(tag, step, value) of every scalar in a TensorBoard event file (TFRecord framing)."""
    from tensorboardX.proto import event_pb2

    out, raw = [], path.read_bytes()
    while raw:
        (length,) = struct.unpack("<Q", raw[:8])
        event = event_pb2.Event.FromString(raw[12:12 + length])
        raw = raw[12 + length + 4:]
        out += [(v.tag, event.step, v.simple_value) for v in event.summary.value]
    return out


def test_tensorboard_scalars(tmp_path):
    pytest.importorskip("tensorboardX")
    run = trainer().fit(data(), epochs=2, dev=data(8, 1), log_dir=tmp_path)
    (path,) = tmp_path.glob("events.out.tfevents.*")
    events = _events(path)
    losses = [(s, v) for tag, s, v in events if tag == "train/loss"]
    assert [s for s, _ in losses] == list(range(1, 2 * (N // BATCH) + 1))
    assert np.mean([v for s, v in losses if s <= N // BATCH]) == pytest.approx(run.history[0]["train_loss"], rel=1e-6)
    dev = [(s, v) for tag, s, v in events if tag == "dev/loss"]
    assert dev == [(r["step"], pytest.approx(r["dev_loss"], rel=1e-6)) for r in run.history]


def test_without_evaluations_the_best_parameters_are_the_last():
    # They were the parameters the run started from.
    run = trainer().fit(data(), epochs=2)
    assert run.best is None and leaves_equal(run.best_params, run.params)
    assert not leaves_equal(run.best_params, trainer().init().params)


@pytest.mark.parametrize("interrupt", [False, True])
def test_donating_steps_train_the_same_run_and_leave_the_callers_arrays(tmp_path, interrupt):
    calls, interrupting = [], []

    def scores(params):
        calls.append(1)
        if interrupting and len(calls) == 2:
            raise KeyboardInterrupt
        return {"calls": float(len(calls))}

    dev = data(8, 1)
    theirs = trainer(optax.adam(0.05), dropout=0.3)
    start = theirs.init().params
    # The first evaluation stays the best: its parameters must outlive the steps after it.
    kwargs = {"epochs": 3, "dev": dev, "eval_every": 3, "scores": scores, "monitor": "calls", "mode": "min"}
    plain = theirs.fit(data(), params=start, **kwargs)
    calls.clear()
    interrupting.extend([True] if interrupt else [])
    mine = fd.Trainer(theirs.compiler, optax.adam(0.05), batch_size=BATCH, progress=False, donate=True)
    donated = mine.fit(data(), params=start, checkpoint_dir=tmp_path, **kwargs)
    if interrupt:  # at step 6: the saved state resumes to the same end
        assert donated.stopped == "interrupted" and int(donated.state.step) == 6
        donated = mine.fit(data(), params=start, checkpoint_dir=tmp_path, resume=True, **kwargs)
    assert not any(leaf.is_deleted() for leaf in jax.tree.leaves(start))
    assert leaves_equal(donated.params, plain.params)
    assert leaves_equal(donated.state.opt_state, plain.state.opt_state)
    # The best parameters were copied, not deleted by the steps after them.
    assert donated.best["step"] == plain.best["step"] == 3
    assert leaves_equal(donated.best_params, plain.best_params)
    assert [r["dev_loss"] for r in donated.history] == [r["dev_loss"] for r in plain.history]


def test_an_interrupt_inside_a_donating_step_is_raised_and_saves_nothing(tmp_path, monkeypatch, caplog):
    # As if Ctrl-C came after the step had taken the state and before it returned the new one.
    import fold.trainer

    def interrupt(params):
        raise KeyboardInterrupt

    monkeypatch.setattr(fold.trainer, "_deleted", lambda state: True)
    with caplog.at_level("WARNING", logger="fold"), pytest.raises(KeyboardInterrupt):
        trainer(donate=True).fit(data(), epochs=1, scores=interrupt, eval_every=2, checkpoint_dir=tmp_path)
    assert not (tmp_path / "last.npz").exists()
    assert any("the state is not saved" in r.getMessage() for r in caplog.records)


def test_a_diverging_donating_run_stops_with_the_state_it_diverged_to(caplog):
    bad = 13
    step = first_step_with(bad)
    with caplog.at_level("WARNING", logger="fold"):
        run = trainer(donate=True).fit(with_nan_at(bad), epochs=3)
    # The next step ran before the loss was read, on the state in place.
    assert run.stopped == "diverged" and int(run.state.step) == step + 1
    assert not all(np.isfinite(np.asarray(leaf)).all() for leaf in jax.tree.leaves(run.params))
    (message,) = [r.getMessage() for r in caplog.records if "diverged" in r.getMessage()]
    assert f"training diverged at step {step}: its loss is nan" in message and "donate=True" in message


def test_bad_arguments_are_refused():
    compiler = fd.Compiler.create(regression())
    with pytest.raises(ValueError, match="loss='cost' names no metric of the model \\(its metrics: abs_error, loss"):
        fd.Trainer(compiler, optax.sgd(0.1), loss="cost")
    with pytest.raises(TypeError, match="Trainer takes a Compiler"):
        fd.Trainer(regression(), optax.sgd(0.1))
    with pytest.raises(ValueError, match="batch_size must be an int >= 1, got 0"):
        fd.Trainer(compiler, optax.sgd(0.1), batch_size=0)
    with pytest.raises(ValueError, match="eval_batch_size must be an int >= 1, got 2.5"):
        fd.Trainer(compiler, optax.sgd(0.1), eval_batch_size=2.5)
    with pytest.raises(TypeError, match="Trainer takes an optax optimizer .* got 'adam'"):
        fd.Trainer(compiler, "adam")  # was accepted, then an AttributeError in fit
    with pytest.raises(TypeError, match="donate must be True or False, got 'yes'"):
        fd.Trainer(compiler, optax.sgd(0.1), donate="yes")
    t = fd.Trainer(compiler, optax.sgd(0.1), batch_size=BATCH, progress=False)
    with pytest.raises(ValueError, match="resume=True needs the checkpoint_dir"):
        t.fit(data(), epochs=1, resume=True)
    with pytest.raises(ValueError, match="epochs must be an int >= 0, got 1.5"):
        t.fit(data(), epochs=1.5)
    with pytest.raises(ValueError, match="patience needs evaluations"):
        t.fit(data(), epochs=1, patience=2)
    with pytest.raises(ValueError, match="make no full batch of 8"):
        t.fit(data(5), epochs=1)
    with pytest.raises(ValueError, match="monitor='dev_accuracy' is not among the scores"):
        t.fit(data(), epochs=1, dev=data(4), monitor="dev_accuracy")
    with pytest.raises(ValueError, match="mode must be 'min' or 'max'"):
        t.fit(data(), epochs=1, dev=data(4), mode="best")
    by_id = dict(enumerate(data()))
    with pytest.raises(TypeError, match=r"fit takes a list or iterable of examples, got a dict; pass list\(d.values"):
        t.fit(by_id, epochs=1)
    with pytest.raises(TypeError, match=r"fit\(dev=\) takes a list or iterable of examples, got a dict"):
        t.fit(data(), epochs=1, dev=by_id)
    params = t.init().params
    for method in (t.evaluate, t.predict):  # evaluate returned {} and batch_size=0 meant the default
        with pytest.raises(ValueError, match=f"{method.__name__} got no examples"):
            method(params, [])
        with pytest.raises(ValueError, match="batch_size must be an int >= 1, got 0"):
            method(params, data(4), batch_size=0)
    with pytest.raises(ValueError, match="fit got no dev examples: pass dev=None"):
        t.fit(data(), epochs=1, dev=[])
    for method in (t.evaluate, t.predict):
        with pytest.raises(TypeError, match=f"{method.__name__} takes a list or iterable of examples, got a set"):
            method(params, set(by_id))


def test_a_loss_function_of_the_result():
    t = fd.Trainer(fd.Compiler.create(regression()), optax.sgd(0.1), batch_size=BATCH, progress=False,
                   loss=lambda result: result.metrics["abs_error"].mean())
    run = t.fit(data(), epochs=3, dev=data(8, 1), monitor="dev_abs_error")
    assert run.history[-1]["dev_abs_error"] < run.history[0]["dev_abs_error"]


def test_a_loss_that_is_not_a_float_scalar_is_refused_with_a_message():
    c = fd.Composition()
    with c.scope():
        y = (fd.Vector(2) >> fd.FC(2, activation=None, name="linear")).reads(c.input[0])
        error = fd.Function(jnp.subtract).reads(y, fd.Vector(2).reads(c.input[1]))
        fd.Metric("squares").reads(fd.Function(jnp.square).reads(error))
        fd.Metric("count").reads(fd.Scalar("int32").reads(c.input[2]))
        c.output.reads(y)
    compiler = fd.Compiler.create(c)
    with pytest.raises(ValueError, match=r"loss='squares' is a metric of type TensorType\(\(2,\), 'float32'\).*"
                                         r"float scalar metric: reduce"):
        fd.Trainer(compiler, optax.sgd(0.1), loss="squares")
    with pytest.raises(ValueError, match=r"loss='count' is a metric of type TensorType\(\(\), 'int32'\)"):
        fd.Trainer(compiler, optax.sgd(0.1), loss="count")
    examples = [([x, 1.0], [x, -x], 1) for x in (0.1, 0.2, 0.3, 0.4)]

    def vector_loss(result):
        return result.metrics["squares"].mean()

    t = fd.Trainer(compiler, optax.sgd(0.1), loss=vector_loss, batch_size=2, progress=False)
    with pytest.raises(TypeError, match=r"'vector_loss' returned a float32 array of shape \(2,\); it must return a "
                                        "float scalar"):
        t.fit(examples, epochs=1)
    t = fd.Trainer(compiler, optax.sgd(0.1), loss=lambda r: r.metrics["squares"].mean().sum(), batch_size=2,
                   progress=False)
    params = t.init().params
    before = t.evaluate(params, examples)["squares"]
    after = t.evaluate(t.fit(examples, epochs=20, params=params).params, examples)["squares"]
    assert before.shape == (2,) and after.sum() < 0.1 * before.sum()


def with_nan_at(i: int) -> list:
    examples = data()
    examples[i] = ([float("nan"), 1.0], 0.0)
    return examples


def first_step_with(i: int, seed: int = 0) -> int:
    """The step (from 1) of the first epoch whose batch holds example ``i``."""
    return int(np.flatnonzero(np.random.default_rng([seed, 0]).permutation(N) == i)[0]) // BATCH + 1


def test_a_run_whose_parameters_turn_nan_stops_at_that_step_and_names_the_example(tmp_path, caplog):
    # Ran every epoch on NaN parameters, and returned them.
    bad = 13
    step = first_step_with(bad)
    with caplog.at_level("WARNING", logger="fold"):
        run = trainer().fit(with_nan_at(bad), epochs=3, checkpoint_dir=tmp_path)
    assert run.stopped == "diverged" and int(run.state.step) == step - 1
    assert_sgd(run.params, trainer().init().params, data(), 0.1, 0, steps=step - 1)  # the state before it
    assert leaves_equal(fd.load_checkpoint(tmp_path / "last.npz", run.state._asdict())["params"], run.params)
    (message,) = [r.getMessage() for r in caplog.records if "diverged" in r.getMessage()]
    assert f"training diverged at step {step} (epoch 1): its loss is nan" in message
    assert f"with the parameters before that step, finds example {bad} (position" in message
    assert "an input value of type TensorType((2,), 'float32')" in message


def test_a_nan_loss_that_the_optimizer_skips_does_not_stop_the_run(caplog):
    with caplog.at_level("WARNING", logger="fold"), pytest.warns(RuntimeWarning, match="parameters stayed finite"):
        run = trainer(optax.apply_if_finite(optax.sgd(0.1), 10)).fit(with_nan_at(13), epochs=2)
    assert run.stopped == "epochs" and int(run.state.step) == 2 * (N // BATCH)
    assert all(np.isfinite(np.asarray(leaf)).all() for leaf in jax.tree.leaves(run.params))
    assert not [r for r in caplog.records if "diverged" in r.getMessage()]


def test_a_diverging_run_over_recorded_examples_says_how_to_find_the_example(caplog):
    t = trainer()
    bad = 21
    with caplog.at_level("WARNING", logger="fold"):
        run = t.fit(t.compiler.record(with_nan_at(bad), progress=False), epochs=2)
    step = first_step_with(bad)
    assert run.stopped == "diverged" and int(run.state.step) == step - 1
    (message,) = [r.getMessage() for r in caplog.records if "diverged" in r.getMessage()]
    order = np.random.default_rng([0, 0]).permutation(N)
    assert f"its examples are train[i] for i in {order[(step - 1) * BATCH:step * BATCH].tolist()}" in message
    assert "compiler.check_numerics(result.state.params, those examples" in message


def test_a_learning_rate_too_high_stops_the_run_before_its_parameters_overflow(caplog):
    with caplog.at_level("WARNING", logger="fold"):
        run = trainer(optax.sgd(1e4)).fit(data(), epochs=50)
    assert run.stopped == "diverged" and 0 < int(run.state.step) < 50 * (N // BATCH)
    assert all(np.isfinite(np.asarray(leaf)).all() for leaf in jax.tree.leaves(run.params))
    (message,) = [r.getMessage() for r in caplog.records if "diverged" in r.getMessage()]
    assert f"training diverged at step {int(run.state.step) + 1}" in message


def test_fit_options_are_checked_before_any_work():
    from fold.trainer import _FitOptions

    with pytest.raises(ValueError, match="resume=True needs the checkpoint_dir"):
        _FitOptions.checked(1, None, None, None, None, None, None, None, True, True, "loss")
    with pytest.raises(ValueError, match="patience needs evaluations"):
        _FitOptions.checked(1, None, None, None, None, None, 2, None, False, True, "loss")
    with pytest.raises(ValueError, match="mode must be 'min' or 'max'"):
        _FitOptions.checked(1, [1], None, None, None, "up", None, None, False, True, "loss")
    options = _FitOptions.checked(3, [1], None, 5, None, None, None, "runs/a", False, True, "loss")
    assert (options.monitor, options.evaluates, str(options.directory)) == ("dev_loss", True, "runs/a")
    assert _FitOptions.checked(3, [1], None, None, None, None, None, None, False, True, len).monitor is None


def test_an_evaluation_keeps_the_best_parameters_and_counts_patience():
    from fold.trainer import _FitOptions, _Run

    options = _FitOptions.checked(1, [1], None, None, None, None, 2, None, False, True, "loss")
    run = _Run(fd.TrainState({"w": 1.0}, None, 0, 0, 0, float("nan"), 0), None, [], options, None, None, 1, None)
    records = [{"dev_loss": 1.0}, {"dev_loss": 0.5}, {"dev_loss": 0.7}, {"dev_loss": 0.6}]
    stops = []
    for w, record in enumerate(records):
        run.state = run.state._replace(params={"w": float(w)})
        stops.append(run.keep_if_best(record))
    assert stops == [False, False, False, True]  # two evaluations in a row without improving on 0.5
    assert [r["best"] for r in records] == [True, True, False, False]
    assert run.best_params == {"w": 1.0} and run.state.best == 0.5 and run.state.stale == 2
    with pytest.raises(ValueError, match="monitor='dev_loss' is not among the scores"):
        run.keep_if_best({"accuracy": 1.0})


def test_a_finished_run_is_not_overwritten_by_a_new_one(tmp_path):
    """``fit(checkpoint_dir=d)`` on a finished run's directory, without ``resume``, replaced its
    ``best.npz``, ``last.npz`` and ``history.json`` without a word."""
    first = trainer().fit(data(), epochs=2, dev=data(8, 1), checkpoint_dir=tmp_path)
    before = {name: (tmp_path / name).read_bytes() for name in ("best.npz", "last.npz", "history.json")}
    with pytest.raises(FileExistsError, match=r"holds a run \(last.npz, best.npz, history.json\): pass resume=True"):
        trainer(optax.sgd(5.0)).fit(data(), epochs=1, dev=data(8, 1), checkpoint_dir=tmp_path)
    assert {name: (tmp_path / name).read_bytes() for name in before} == before
    with pytest.raises(ValueError, match="pass one"):
        trainer().fit(data(), epochs=1, checkpoint_dir=tmp_path, resume=True, overwrite=True)
    again = trainer().fit(data(), epochs=2, dev=data(8, 1), checkpoint_dir=tmp_path, overwrite=True)
    assert leaves_equal(again.params, first.params)  # a new run from the start, in the same directory
    assert json.loads((tmp_path / "history.json").read_text()) == again.history



def test_resuming_with_another_batch_size_or_seed_is_refused(tmp_path):
    """A resumed run with another batch size was accepted silently (its epoch then covered 240 of
    256 examples); another seed visits other examples in the epochs left."""
    trainer().fit(data(), epochs=1, checkpoint_dir=tmp_path)
    with pytest.raises(ValueError, match=r"trained with batch_size 8 \(now 16\); resuming .* overwrite=True"):
        trainer(batch_size=16).fit(data(), epochs=2, checkpoint_dir=tmp_path, resume=True)
    with pytest.raises(ValueError, match=r"seed 0 \(now 3\)"):
        trainer(seed=3).fit(data(), epochs=2, checkpoint_dir=tmp_path, resume=True)
    with pytest.raises(ValueError, match=r"train_examples 40 \(now 32\)"):
        trainer().fit(data(32), epochs=2, checkpoint_dir=tmp_path, resume=True)
    assert int(trainer().fit(data(), epochs=2, checkpoint_dir=tmp_path, resume=True).state.step) == 10


def test_the_history_travels_with_the_last_state(tmp_path):
    """``history.json`` was written after ``last.npz``, and not atomically: a kill between them lost
    an evaluation record, and a torn file made resume raise a bare JSONDecodeError. The history now
    goes into ``last.npz`` with the state; ``history.json`` is a copy."""
    full = trainer().fit(data(), epochs=3, dev=data(8, 1))
    trainer().fit(data(), epochs=1, dev=data(8, 1), checkpoint_dir=tmp_path)
    saved = fd.checkpoint_metadata(tmp_path / "last.npz")["history"]
    assert saved == json.loads((tmp_path / "history.json").read_text())
    (tmp_path / "history.json").write_text('[{"step": 5, "ep')  # torn
    resumed = trainer().fit(data(), epochs=3, dev=data(8, 1), checkpoint_dir=tmp_path, resume=True)
    assert [r["step"] for r in resumed.history] == [5, 10, 15]
    assert [r["dev_loss"] for r in resumed.history] == [r["dev_loss"] for r in full.history]
    assert json.loads((tmp_path / "history.json").read_text()) == resumed.history


def test_a_torn_history_of_an_older_checkpoint_is_a_clear_error(tmp_path):
    run = trainer().fit(data(), epochs=1, checkpoint_dir=tmp_path)
    fd.save_checkpoint(tmp_path / "last.npz", run.state._asdict())  # as older versions wrote it
    (tmp_path / "history.json").write_text("[{")
    with pytest.raises(ValueError, match=r"history.json is not a history that fit wrote .* move it away"):
        trainer().fit(data(), epochs=2, checkpoint_dir=tmp_path, resume=True)


def test_files_of_saves_killed_halfway_are_removed(tmp_path):
    trainer().fit(data(), epochs=1, checkpoint_dir=tmp_path)
    left = [tmp_path / "last.npz.0123456789abcdef.tmp", tmp_path / "history.json.fedcba9876543210.tmp"]
    for path in left:
        path.write_bytes(b"\0" * 1000)
    (tmp_path / "notes.tmp").write_text("the user's")
    trainer().fit(data(), epochs=2, checkpoint_dir=tmp_path, resume=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["history.json", "last.npz", "notes.tmp"]


def test_an_evaluation_interrupted_after_its_step_is_made_on_resume(tmp_path):
    """A Ctrl-C during an evaluation saved the state at its step, and the resumed run went on to
    the next one: that evaluation was missing from the history for good."""
    calls = []

    def interrupt_second(params):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return {"w": float(np.asarray(params["linear"]["w"]).sum())}

    def score(params):
        return {"w": float(np.asarray(params["linear"]["w"]).sum())}

    full = trainer().fit(data(), epochs=2, scores=score, eval_every=3)
    stopped = trainer().fit(data(), epochs=2, scores=interrupt_second, eval_every=3, checkpoint_dir=tmp_path)
    assert stopped.stopped == "interrupted" and [r["step"] for r in stopped.history] == [3]
    resumed = trainer().fit(data(), epochs=2, scores=score, eval_every=3, checkpoint_dir=tmp_path, resume=True)
    keys = ("step", "epoch", "train_loss", "w")
    assert [{k: r[k] for k in keys} for r in resumed.history] == [{k: r[k] for k in keys} for r in full.history]


def test_a_bad_example_says_whether_it_is_in_the_training_or_the_dev_set():
    bad = [([1.0, 1.0], 0.5), (["x", 1.0], 0.5)]
    with pytest.raises(ValueError, match=r"^fit's dev examples: example 1: at .*Vector: expected numbers"):
        trainer().fit(data(), epochs=1, dev=bad)
    with pytest.raises(ValueError, match=r"^fit's training examples: example 1: at .*Vector"):
        trainer().fit(bad, epochs=1)
    with pytest.raises(KeyError, match=r"fit's dev examples: example 0: at .*GetItem found no key 'a'"):
        fd.Trainer(fd.Compiler.create(fd.GetItem("a") >> fd.Scalar() >> fd.Metric("loss") >> fd.Void()),
                   optax.sgd(0.1), progress=False).fit([{"a": 1.0}] * 4, epochs=1, dev=[{"b": 1.0}])


def test_resuming_with_layers_made_in_another_order_is_refused(tmp_path, monkeypatch):
    """A default layer name counts the layers the process made before: a script that makes its
    layers in another order swaps their names, and the checkpoint's parameters loaded by name
    into the wrong layers (two layers of one shape: nothing else noticed)."""
    from fold.blocks import layers

    def model(first_made_is_inner: bool) -> fd.Block:
        monkeypatch.setattr(layers, "_names", layers._Names())  # as in a fresh process
        a, b = fd.FC(2), fd.FC(2)
        inner, outer = (a, b) if first_made_is_inner else (b, a)
        return (fd.Vector(2) >> inner >> outer >> fd.Function(lambda v: jnp.sum(v ** 2, -1)) >> fd.Metric("loss")
                >> fd.Void())

    def fit(first_made_is_inner: bool, **kwargs):
        return fd.Trainer(fd.Compiler.create(model(first_made_is_inner)), optax.sgd(0.1), batch_size=4,
                          progress=False).fit([[1.0, 2.0]] * 8, checkpoint_dir=tmp_path, **kwargs)

    fit(True, epochs=1)
    with pytest.raises(ValueError, match=r"made in another order: fc is the model's fc_1 \(in the checkpoint, its "
                                         r"fc\); fc_1 is the model's fc \(in the checkpoint, its fc_1\)"):
        fit(False, epochs=2, resume=True)
    assert int(fit(True, epochs=2, resume=True).state.step) == 4


def test_predict_on_a_model_that_outputs_nothing_says_what_to_do():
    """``predict`` returned None, with no warning, for a root that ends in a loss Metric (the quick
    start's own kind of model)."""
    scale = fd.FC(1, activation=None, name="scale")

    def prediction() -> fd.Block:
        return fd.Vector(1) >> scale >> fd.Function(lambda v: v[:, 0])

    model = fd.Record((prediction(), fd.Scalar())) >> fd.Function(lambda y, t: (y - t) ** 2) >> fd.Metric("loss")
    t = fd.Trainer(fd.Compiler.create(model >> fd.Void()), optax.sgd(0.1), batch_size=2, progress=False)
    examples = [([float(x)], 3.0 * x) for x in range(6)]
    run = t.fit(examples, epochs=2)
    with pytest.raises(ValueError, match=r"this model's root outputs VoidType\(\) .* compile the block that makes "
                                         r"the prediction"):
        t.predict(run.params, examples)
    inference = fd.Compiler.create(prediction())
    got = np.asarray(inference.apply(run.params, inference.build_batch([[2.0], [5.0]])).outputs)
    w, b = float(run.params["scale"]["w"][0, 0]), float(run.params["scale"]["b"][0])
    np.testing.assert_allclose(got, [2.0 * w + b, 5.0 * w + b], rtol=1e-6)


def test_a_nan_loss_with_finite_parameters_is_reported_once():
    """A NaN term that does not depend on the parameters trained to the end with ``train_loss: nan``
    in the history and no word."""
    model = (fd.Record((fd.Vector(1) >> fd.FC(1, activation=None, name="lin"), fd.Scalar()))
             >> fd.Function(lambda y, t: (y[:, 0] - t) ** 2 + 0.0 * jnp.log(t)) >> fd.Metric("loss") >> fd.Void())
    examples = [([1.0], 1.0)] * 6 + [([1.0], -1.0)] * 2  # log(-1) is NaN, times zero still NaN
    t = fd.Trainer(fd.Compiler.create(model), optax.sgd(0.01), batch_size=8, progress=False)
    with pytest.warns(RuntimeWarning, match=r"the loss of step 1 is nan, but the parameters stayed finite") as seen:
        run = t.fit(examples, epochs=3)
    assert len([w for w in seen if "stayed finite" in str(w.message)]) == 1
    assert run.stopped == "epochs" and math.isnan(run.history[-1]["train_loss"])


def test_progress_bars_use_the_text_bar_without_ipywidgets(monkeypatch):
    """tqdm.auto in a notebook without ipywidgets warned "IProgress not found" for every bar, even
    with progress=False."""
    import importlib.util

    import tqdm.std

    from fold.compiler import progress

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ipywidgets" else real(name, *a))
    assert progress.tqdm_class() is tqdm.std.tqdm


def test_resuming_a_finished_run_says_there_is_nothing_to_do(tmp_path, caplog):
    trainer().fit(data(), epochs=2, checkpoint_dir=tmp_path)
    with caplog.at_level("WARNING", logger="fold"):
        run = trainer().fit(data(), epochs=2, checkpoint_dir=tmp_path, resume=True)
    assert int(run.state.step) == 10
    assert any("has done its 2 epochs (step 10): nothing to train; pass a larger epochs=" in r.getMessage()
               for r in caplog.records)


def test_the_progress_bar_leaves_compilations_out_of_its_rate(monkeypatch):
    """The bar's ETA after the first (compiling) step read minutes for a seconds-long run."""
    import fold.trainer as trainer_module

    class Bar:
        def __init__(self):
            self.calls = []

        def update(self, n=1):
            self.calls.append("update")

        def set_postfix(self, *, loss, refresh):
            pass

        def unpause(self):
            self.calls.append("unpause")

        def close(self):
            pass

    bars = []
    monkeypatch.setattr(trainer_module, "_bar", lambda *a, **k: bars.append(Bar()) or bars[-1])
    monkeypatch.setattr(trainer_module, "_COMPILED_SECONDS", 0.0)  # every first step on a layout "compiled"
    t = trainer(optax.sgd(0.1))
    t.fit(data(), epochs=2)
    assert bars[0].calls[0] == "unpause" and bars[0].calls.count("unpause") == 1  # one layout
    assert bars[0].calls.count("update") == 10
    monkeypatch.setattr(trainer_module, "_COMPILED_SECONDS", 1e9)  # a step that only queued: nothing to leave out
    t.fit(data(), epochs=1)
    assert "unpause" not in bars[1].calls
