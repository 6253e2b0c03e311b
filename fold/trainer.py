"""``Trainer``: train, evaluate and infer with a compiled model (TensorFlow Fold's ``td.Plan``, the JAX way).

A ``Trainer`` holds a ``Compiler``, an optax optimizer and the name of the
metric to minimise, and runs Fold's three modes:

* **train** (``fit``): the examples are recorded once (``compiler.record``),
  each epoch's batches are built from them in a seeded order, ahead of the
  steps (on a thread, or in worker processes with ``num_workers``), and
  one jitted step differentiates the loss and applies the optimizer.
  Every ``eval_every`` steps (or after each epoch) it evaluates on a dev
  set, keeps the best parameters by a monitored score, stops early after
  ``patience`` evaluations without improvement, writes checkpoints (the
  last state, the best parameters and the history) and TensorBoard
  scalars. A tqdm bar shows the live loss; Ctrl-C stops cleanly, saving
  the last state. A run whose loss and parameters stop being finite stops
  at that step, keeps the state from before it and names the example
  (``compiler.check_numerics``) instead of running its epochs on NaN. For
  that, the state before each step is kept until the step's loss is read,
  one step later: one copy of the parameters and optimizer state more than
  the step itself holds. ``donate=True`` updates them in place instead
  (faster where they are large, as an embedding table under Adam), and a
  diverging run then stops with the state it diverged to.
* **eval** (``evaluate``): each metric's mean over a dataset, or per example.
* **infer** (``predict``): the model's outputs for a dataset, in order.

Runs are reproducible: epoch ``e`` visits the examples in
``numpy.random.default_rng([seed, e]).permutation``, and step ``n`` runs
stochastic layers with ``fold_in(key(seed), n)``. A run resumed from its
last checkpoint therefore continues exactly where it stopped, mid-epoch
included.

Examples:
    >>> import fold as fd, jax, jax.numpy as jnp, optax
    >>> c = fd.Composition()
    >>> with c.scope():
    ...     y = (fd.Vector(2) >> fd.FC(1, activation=None) >> fd.Function(lambda v: v[:, 0])).reads(c.input[0])
    ...     error = fd.Function(jnp.subtract).reads(y, fd.Scalar().reads(c.input[1]))
    ...     _ = fd.Metric("loss").reads(fd.Function(jnp.square).reads(error))
    ...     _ = c.output.reads(y)
    >>> data = [([x, 1.0], 3.0 * x - 1.0) for x in jnp.linspace(-1, 1, 64).tolist()]
    >>> trainer = fd.Trainer(fd.Compiler.create(c), optax.adam(0.1), batch_size=16, progress=False)
    >>> run = trainer.fit(data, epochs=30, dev=data)
    >>> run.best["dev_loss"] < 1e-3
    True
    >>> trainer.predict(run.best_params, data[:2]).shape
    (2,)
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import pathlib
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import NamedTuple, Protocol

import jax
import jax.numpy as jnp
import numpy as np
import optax

from fold.checkpoint import checkpoint_metadata, is_left_by, load_checkpoint, save_checkpoint, write_whole
from fold.compiler.compiler import Compiler, check_compiler
from fold.compiler.progress import tqdm_class
from fold.compiler.result import Result
from fold.errors import check_examples, check_int
from fold.fields import documented
from fold.scheduler.batch import Batch, BatchLayout
from fold.scheduler.records import RecordedExamples
from fold.typing import Params, PyObject, PyTree

__all__ = ["Trainer", "TrainState", "FitResult"]

logger = logging.getLogger("fold")

# Files a run keeps in its checkpoint_dir. last.npz carries the history and the run's settings as
# metadata, so that they always match its state; history.json is a copy to read.
LAST, BEST, HISTORY = "last.npz", "best.npz", "history.json"
# A step on a new layout whose call took longer than this compiled (a call only queues a step).
_COMPILED_SECONDS = 0.5


Record = dict[str, "int | float | bool | np.ndarray"]
"""One evaluation: ``step``, ``epoch``, ``train_loss``, ``seconds``, the scores and ``best``."""

ScoreFn = Callable[[Params], dict[str, float]]
"""``scores=``: more scores per evaluation, from the parameters."""


class _Writer(Protocol):
    """What ``fit`` uses of a tensorboardX ``SummaryWriter``."""

    def add_scalar(self, tag: str, value: float, step: int) -> None: ...

    def close(self) -> None: ...


class _Bar(Protocol):
    """What ``fit`` uses of a tqdm progress bar."""

    def update(self, n: int = 1) -> object: ...

    def set_postfix(self, *, loss: str, refresh: bool) -> None: ...

    def unpause(self) -> None: ...

    def close(self) -> None: ...


@documented
class TrainState(NamedTuple):
    """Everything a run needs to continue: saved as ``last.npz`` and restored by ``resume=True``."""

    params: Params  # the parameters
    opt_state: PyTree  # the optimizer's state
    step: int  # optimizer steps taken
    epoch: int  # epochs completed
    epoch_step: int  # steps taken in the epoch under way
    best: float  # best monitored score so far (NaN before the first evaluation)
    stale: int  # evaluations since it last improved


@documented
class FitResult(NamedTuple):
    """What ``Trainer.fit`` returns."""

    params: Params
    """The parameters after the last step."""
    best_params: Params
    """The parameters of the best evaluation (``params`` when there was no evaluation)."""
    best: Record | None
    """The best evaluation's record (``step``, ``epoch`` and its scores), or None."""
    history: list[Record]
    """One record per evaluation (or per epoch without evaluations): ``step``, ``epoch``, ``train_loss``
    (mean since the previous record), ``seconds`` (since ``fit`` started), the scores and ``best``."""
    state: TrainState
    """The final ``TrainState`` (optimizer state included)."""
    stopped: str
    """Why it stopped: ``"epochs"``, ``"early_stopping"``, ``"interrupted"`` or ``"diverged"`` (a step's
    loss was not finite and the parameters after it were not either: ``state`` is the one before
    that step when its parameters are finite, unless the trainer donates its state (then the one
    after it), and a warning names the step's examples)."""


class _Step(NamedTuple):
    """A step whose loss is read one step late, with what a diverging run needs to go back to it."""

    step: int  # its number, counting from 1
    loss: jax.Array
    before: TrainState | None  # the state it started from (None: the step updated it in place)
    indices: np.ndarray  # its examples' indices in the training set


class _Diverged(Exception):
    """Raised by ``Trainer._log_loss`` at a non-finite loss after which the parameters are not finite."""

    def __init__(self, pending: _Step, loss: float):
        super().__init__(pending.step, loss)
        self.pending, self.loss = pending, loss


@dataclasses.dataclass(frozen=True)
class _FitOptions:
    """``fit``'s options, checked (see ``Trainer.fit`` for each)."""

    epochs: int
    evaluates: bool  # a dev set or scores: evaluations record scores and pick the best
    scores: ScoreFn | None
    eval_every: int | None
    monitor: str | None
    mode: str | None
    patience: int | None
    directory: pathlib.Path | None
    resume: bool
    drop_remainder: bool
    overwrite: bool = False

    @classmethod
    def checked(cls, epochs: int, dev: object, scores: ScoreFn | None,
                eval_every: int | None, monitor: str | None, mode: str | None, patience: int | None,
                checkpoint_dir: str | pathlib.Path | None, resume: bool, drop_remainder: bool,
                loss: str | Callable[[Result], jax.Array], overwrite: bool = False) -> _FitOptions:
        """The options, or ValueError naming the first bad one (FileExistsError for a
        ``checkpoint_dir`` that holds a run neither resumed nor overwritten)."""
        epochs = check_int("epochs", epochs, 0)
        eval_every = None if eval_every is None else check_int("eval_every", eval_every, 1)
        patience = None if patience is None else check_int("patience", patience, 1)
        if resume and checkpoint_dir is None:
            raise ValueError("resume=True needs the checkpoint_dir to resume from")
        if resume and overwrite:
            raise ValueError("resume=True continues the run in checkpoint_dir and overwrite=True replaces it: pass one")
        if checkpoint_dir is not None and not (resume or overwrite):
            kept = [name for name in (LAST, BEST, HISTORY) if (pathlib.Path(checkpoint_dir) / name).exists()]
            if kept:
                raise FileExistsError(
                    f"checkpoint_dir {checkpoint_dir} holds a run ({', '.join(kept)}): pass resume=True to continue "
                    "it, overwrite=True to replace it with a new run, or another checkpoint_dir")
        if mode not in (None, "min", "max"):
            raise ValueError(f"mode must be 'min' or 'max', got {mode!r}")
        evaluates = dev is not None or scores is not None
        if patience is not None and not evaluates:
            raise ValueError("patience needs evaluations: pass dev= or scores=")
        if monitor is None and dev is not None and isinstance(loss, str):
            monitor = f"dev_{loss}"
        directory = None if checkpoint_dir is None else pathlib.Path(checkpoint_dir)
        return cls(epochs, evaluates, scores, eval_every, monitor, mode, patience, directory, resume, drop_remainder,
                   overwrite)


@dataclasses.dataclass
class _Run:
    """A ``fit`` in progress: its options and data, the state, its history and where it writes."""

    state: TrainState
    best_params: Params
    history: list[Record]
    options: _FitOptions
    train: RecordedExamples
    dev: RecordedExamples | None
    per_epoch: int  # steps per epoch
    writer: _Writer | None
    bar: _Bar | None = None
    started: float = dataclasses.field(default_factory=time.perf_counter)
    losses: list[float] = dataclasses.field(default_factory=list)  # since the last record
    pending: _Step | None = None  # the last step, its loss not yet read
    batches: Iterator[Batch] | None = None  # the epoch's batches, while it runs
    stopped: str = "epochs"
    settings: dict[str, object] = dataclasses.field(default_factory=dict)  # what a resume must match
    warned_loss: bool = False  # whether a non-finite loss with finite parameters was reported
    donate: bool = False  # the steps update the state in place: what is kept past a step is copied
    layouts: set[BatchLayout] = dataclasses.field(default_factory=set)  # those the steps have met

    def save(self) -> None:
        """Writes the last state, with the history and settings, to the checkpoint directory (if
        there is one), then the history's readable copy."""
        directory = self.options.directory
        if directory is None:
            return
        # The losses since the last evaluation (the pending step's too: the state includes it) go
        # with the state, so a resumed run's next evaluation reports them as an unbroken one would.
        losses = self.losses + ([float(self.pending.loss)] if self.pending is not None else [])
        save_checkpoint(directory / LAST, self.state._asdict(),
                        {"history": self.history, "settings": self.settings, "losses": losses})
        text = json.dumps(self.history, indent=1) + "\n"
        write_whole(directory / HISTORY, lambda f: f.write(text.encode()))

    def keep(self, tree: PyTree) -> PyTree:
        """``tree`` as the run keeps it past the next step: a copy when the steps update in place."""
        return jax.tree_util.tree_map(jnp.copy, tree) if self.donate else tree

    def keep_if_best(self, record: Record) -> bool:
        """Keeps the current parameters if ``record``'s monitored score is the best so far (marking
        ``record["best"]``); True when ``patience`` evaluations in a row did not improve on it."""
        options, state = self.options, self.state
        # Without a monitor, the first score decides; losses and errors are minimised.
        key = options.monitor or next((k for k in record if k not in ("step", "epoch", "train_loss", "seconds")), "")
        if key not in record:
            raise ValueError(f"monitor={key!r} is not among the scores of an evaluation: {sorted(record)}")
        sign = -1.0 if (options.mode or _mode_of(key)) == "max" else 1.0
        score = float(record[key])
        stop = False
        if math.isnan(state.best) or sign * score < sign * state.best:
            self.state = state._replace(best=score, stale=0)
            self.best_params = self.keep(state.params)
            if options.directory is not None:
                save_checkpoint(options.directory / BEST, state.params)
        else:
            self.state = state._replace(stale=int(state.stale) + 1)
            stop = options.patience is not None and int(self.state.stale) >= options.patience
        record["best"] = bool(self.state.stale == 0)
        return stop

    def close_batches(self) -> None:
        """Stops the epoch's batches (shutting worker processes down)."""
        if self.batches is not None and hasattr(self.batches, "close"):
            self.batches.close()
        self.batches = None

    def close(self) -> None:
        """Stops the batches, the progress bar and the TensorBoard writer."""
        self.close_batches()
        if self.bar is not None:
            self.bar.close()
        if self.writer is not None:
            self.writer.close()


class Trainer:
    """Trains, evaluates and runs a compiled model.

    Args:
      compiler: the model, from ``Compiler.create``.
      optimizer: an optax ``GradientTransformation``.
      loss: the float scalar metric whose mean over a batch's entries is
        minimised, or a function ``Result -> float scalar`` (traced inside
        the step; ``fit`` raises ``TypeError`` when it returns anything else).
      batch_size: examples per training batch (and per evaluation batch
        unless ``eval_batch_size`` says otherwise).
      eval_batch_size: examples per batch in ``evaluate`` and ``predict``.
      seed: seeds the example order of every epoch and the stochastic
        layers' keys.
      num_workers: worker processes building batches ahead
        (``compiler.batches``); 0 builds them on a thread of this process
        while the steps run (on a CPU backend with few cores,
        ``fd.reserve_host_cores`` at the program's start leaves that thread
        a core of its own).
      progress: show tqdm progress bars and per-evaluation lines.
      donate: each step updates the parameters and the optimizer's state
        in place (``jax.jit``'s ``donate_argnums``) rather than writing
        them to new buffers: faster where they are large, as Adam's three
        copies of an embedding table (``benchmarks.dynet_treenn``: a
        Tree-LSTM's step at batch 16, 1.2x). ``fit`` then copies what it
        keeps past a step (the parameters it starts from, the best ones),
        and a step that diverges cannot be undone: the run stops with the
        state it diverged to (the last checkpoint, and the best parameters
        of the evaluations before it, stay as they were).

    Raises:
      TypeError: ``compiler`` is not a ``Compiler`` or ``loss`` is neither
        a metric name nor callable, or ``donate`` is not a bool.
      ValueError: a size is not positive, or ``loss`` names no metric of
        the model or one that is not a float scalar.
    """

    def __init__(self, compiler: Compiler, optimizer: optax.GradientTransformation, *,
                 loss: str | Callable[[Result], jax.Array] = "loss", batch_size: int = 64,
                 eval_batch_size: int = 256, seed: int = 0, num_workers: int = 0, progress: bool = True,
                 donate: bool = False):
        check_compiler(compiler, "Trainer")
        if isinstance(loss, str):
            if loss not in compiler.program.metric_types:
                known = ", ".join(sorted(compiler.program.metric_types)) or "none"
                raise ValueError(f"loss={loss!r} names no metric of the model (its metrics: {known}); "
                                 "add fd.Metric(name) or pass loss=a function of the Result")
            t = compiler.program.metric_types[loss]
            if t.shape != () or not jnp.issubdtype(t.dtype, jnp.floating):
                raise ValueError(f"loss={loss!r} is a metric of type {t}, but the loss a Trainer minimises is the "
                                 "mean of a float scalar metric: reduce each value in the model (e.g. "
                                 "fd.Function(jnp.sum) before the Metric) or pass loss=a function of the Result")
        elif not callable(loss):
            raise TypeError(f"loss must be a metric name or a function of the Result, got {loss!r}")
        if not (callable(getattr(optimizer, "init", None)) and callable(getattr(optimizer, "update", None))):
            raise TypeError(f"Trainer takes an optax optimizer (e.g. optax.adam(1e-3)), got {optimizer!r}")
        batch_size = check_int("batch_size", batch_size, 1)
        eval_batch_size = check_int("eval_batch_size", eval_batch_size, 1)
        num_workers = check_int("num_workers", num_workers, 0)
        if not isinstance(donate, bool):
            raise TypeError(f"donate must be True or False, got {donate!r}")
        self.compiler = compiler
        self.optimizer = optimizer
        self.loss = loss
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size
        self.seed = seed
        self.num_workers = num_workers
        self.progress = progress
        self.donate = donate
        self._step = jax.jit(self._train_step, donate_argnums=(0, 1) if donate else ())

    def __repr__(self) -> str:
        loss = self.loss if isinstance(self.loss, str) else getattr(self.loss, "__name__", "function")
        return f"Trainer({self.compiler!r}, loss={loss!r}, batch_size={self.batch_size}, seed={self.seed})"

    # ------------------------------------------------------------------ train
    def _loss(self, params: Params, batch: Batch, key: jax.Array) -> jax.Array:
        result = self.compiler.apply(params, batch, key)
        if isinstance(self.loss, str):
            return result.metrics[self.loss].mean()
        loss = self.loss(result)
        if not isinstance(loss, jax.Array) or loss.shape != () or not jnp.issubdtype(loss.dtype, jnp.floating):
            what = (f"a {loss.dtype} array of shape {loss.shape}" if isinstance(loss, jax.Array)
                    else type(loss).__name__)
            raise TypeError(f"the loss function {getattr(self.loss, '__name__', self.loss)!r} returned {what}; "
                            "it must return a float scalar computed from the Result (e.g. "
                            "result.metrics['loss'].mean())")
        return loss

    def _train_step(self, params: Params, opt_state: PyTree, batch: Batch,
                    step: jax.Array) -> tuple[Params, PyTree, jax.Array]:
        key = jax.random.fold_in(jax.random.key(self.seed), step)
        loss, grads = jax.value_and_grad(self._loss)(params, batch, key)
        updates, opt_state = self.optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    def init(self, params: Params | None = None) -> TrainState:
        """A fresh ``TrainState``: ``params`` (default ``compiler.init(key(seed))``) and the optimizer's state."""
        if params is None:
            params = self.compiler.init(jax.random.key(self.seed))
        params = self.compiler.prepare_params(params)
        return TrainState(params, self.optimizer.init(params), 0, 0, 0, math.nan, 0)

    def fit(self, train: Iterable[PyObject] | RecordedExamples, *, epochs: int, params: Params | None = None,
            dev: Iterable[PyObject] | RecordedExamples | None = None,
            scores: ScoreFn | None = None, eval_every: int | None = None,
            monitor: str | None = None, mode: str | None = None, patience: int | None = None,
            checkpoint_dir: str | pathlib.Path | None = None, resume: bool = False, overwrite: bool = False,
            log_dir: str | pathlib.Path | None = None, drop_remainder: bool = True) -> FitResult:
        """Trains for ``epochs`` epochs over ``train``, evaluating, keeping the best and checkpointing.

        An *evaluation* (every ``eval_every`` steps and after the last step,
        else after every epoch)
        records ``dev_<metric>`` for every metric's mean over ``dev`` and the
        entries of ``scores(params)``, keeps the parameters whose ``monitor``
        is best, and counts evaluations without improvement for ``patience``.

        Args:
          train: the training examples, or examples recorded by this
            trainer's compiler (others are recorded here, once).
          epochs: passes over ``train`` (a resumed run counts those done).
          params: initial parameters (default: ``init``'s).
          dev: examples to evaluate on.
          scores: more scores per evaluation, ``params -> {name: float}``
            (accuracies, say), recorded under their own names.
          eval_every: steps between evaluations, plus one after the last step
            when it falls between them (default: each epoch's end).
          monitor: the score that picks the best parameters (default
            ``dev_<loss>`` with a dev set and a metric loss, else the
            first of ``scores``).
          mode: ``"min"`` or ``"max"`` (default: ``"min"`` for a monitor
            whose name has ``loss`` or ``error`` in it, else ``"max"``).
          patience: evaluations without improvement before stopping early
            (default: never).
          checkpoint_dir: where ``last.npz`` (the ``TrainState``, after each
            evaluation and when interrupted, with the history and settings as
            ``fd.checkpoint_metadata``), ``best.npz`` (the best parameters) and
            ``history.json`` (a copy of the history) go, each written whole.
          resume: continue from ``checkpoint_dir``'s last state if it has one
            (with the same batch size, seed, training examples,
            ``drop_remainder`` and layers as the run it continues; an
            evaluation a kill or Ctrl-C cut short is made first).
          overwrite: start a new run in a ``checkpoint_dir`` that holds one,
            replacing its files. Without ``resume`` or ``overwrite``, a
            ``checkpoint_dir`` holding a run is refused: a finished run's
            best parameters are not lost to a second call.
          log_dir: write TensorBoard scalars there (needs ``tensorboardX``):
            ``train/loss`` every step and every score per evaluation.
          drop_remainder: skip each epoch's last partial batch (its examples
            are others each epoch), so every step has one shape class.

        Returns:
          A ``FitResult``.

        Raises:
          ValueError: bad sizes, ``resume`` without ``checkpoint_dir`` (or with
            ``overwrite``) or with other settings than the run's, an unknown
            ``mode``, a ``monitor`` no evaluation records, or a malformed
            example (the message says whether in ``train`` or ``dev``).
          FileExistsError: ``checkpoint_dir`` holds a run, and neither
            ``resume`` nor ``overwrite`` was given.
          ImportError: ``log_dir`` without ``tensorboardX``.
        """
        options = _FitOptions.checked(epochs, dev, scores, eval_every, monitor, mode, patience, checkpoint_dir,
                                      resume, drop_remainder, self.loss, overwrite)
        train_data = self._recorded(train, "fit", "fit's training examples")
        dev_data = None if dev is None else self._recorded(dev, "fit(dev=)", "fit's dev examples")
        run = self._start(options, train_data, dev_data, params, log_dir)
        try:
            run.stopped = self._epochs(run)
        except _Diverged as diverged:
            run.stopped = "diverged"
            self._stop_diverged(run, diverged, train)
        except KeyboardInterrupt:
            _interrupted(run)
        finally:
            run.close()
        best = _best_record(run.history) if options.evaluates else None
        return FitResult(run.state.params, run.state.params if best is None else run.best_params, best, run.history,
                         run.state, run.stopped)

    def _recorded(self, data: Iterable[PyObject] | RecordedExamples, where: str, name: str) -> RecordedExamples:
        """``data`` recorded by this trainer's compiler (once: recorded examples come back as they are);
        a malformed example's error says which data it is in (``name``)."""
        if isinstance(data, RecordedExamples):
            return data
        try:
            return self.compiler.record(check_examples(data, where), progress=self.progress)
        except (KeyError, TypeError, ValueError, OverflowError) as e:
            raise _named(e, name) from e

    def _start(self, options: _FitOptions, train: RecordedExamples, dev: RecordedExamples | None, params: Params | None,
               log_dir: str | pathlib.Path | None) -> _Run:
        """A run at its first step, or where its checkpoint left it (``resume``)."""
        if dev is not None and not len(dev):
            raise ValueError("fit got no dev examples: pass dev=None to train without evaluating")
        per_epoch = _steps_per_epoch(len(train), self.batch_size, options.drop_remainder)
        state = self.init(params)
        run = _Run(state, state.params, [], options, train, dev, per_epoch, _writer(log_dir), donate=self.donate)
        # The first step would otherwise delete the caller's arrays.
        run.state = state._replace(params=run.keep(state.params), opt_state=run.keep(state.opt_state))
        run.settings = {"batch_size": self.batch_size, "seed": self.seed, "train_examples": len(train),
                        "drop_remainder": options.drop_remainder,
                        "layers": dict(self.compiler.program.layer_seeds)}
        if options.directory is not None:
            _remove_temp_files(options.directory)
        if options.resume and options.directory is not None and (options.directory / LAST).exists():
            self._restore(run)
            if int(run.state.epoch) >= options.epochs:
                logger.warning("the run in %s has done its %d epochs (step %d): nothing to train; pass a larger "
                               "epochs= to continue it", options.directory, int(run.state.epoch), int(run.state.step))
        run.bar = _bar(self.progress, total=options.epochs * per_epoch, initial=int(run.state.step), desc="training")
        run.started = time.perf_counter()
        return run

    def _epochs(self, run: _Run) -> str:
        """Runs the epochs left; returns why they stopped (``"epochs"`` or ``"early_stopping"``)."""
        stopped = "epochs"
        if self._owes_evaluation(run) and self._evaluate(run):
            return "early_stopping"
        while int(run.state.epoch) < run.options.epochs:
            if self._epoch(run):
                stopped = "early_stopping"
                break
        else:
            # The steps after the last evaluation would otherwise never be evaluated.
            last = run.history[-1]["step"] if run.history else 0
            if run.options.eval_every is not None and last < int(run.state.step):
                self._evaluate(run)
        self._log_loss(run, None)
        return stopped

    def _epoch(self, run: _Run) -> bool:
        """Runs the rest of the epoch under way and its evaluations; True when one asks to stop early."""
        options = run.options
        epoch, done = int(run.state.epoch), int(run.state.epoch_step)
        order = np.random.default_rng([self.seed, epoch]).permutation(len(run.train))
        stop = run.per_epoch * self.batch_size if options.drop_remainder else len(run.train)
        run.batches = self.compiler.batches(run.train[order[done * self.batch_size:stop]], self.batch_size,
                                            num_workers=self.num_workers, drop_remainder=options.drop_remainder)
        stopping = False
        for batch in run.batches:
            self._train_step_on(run, batch, order)
            if options.eval_every is not None and int(run.state.step) % options.eval_every == 0 and self._evaluate(run):
                stopping = True
                break
        run.close_batches()
        run.state = run.state._replace(epoch=epoch + 1, epoch_step=0)
        if stopping or (options.eval_every is None and self._evaluate(run) and options.evaluates):
            return True
        if options.eval_every is not None:
            run.save()
        return False

    def _train_step_on(self, run: _Run, batch: Batch, order: np.ndarray) -> None:
        """One optimizer step on ``batch`` (the next of an epoch visiting examples in ``order``); its
        loss is read one step later (``_log_loss``)."""
        s = run.state
        new_layout = batch.layout not in run.layouts
        started = time.perf_counter()
        params, opt_state, loss = self._step(s.params, s.opt_state, batch, jnp.int32(s.step))
        if new_layout:
            run.layouts.add(batch.layout)
            if run.bar is not None and time.perf_counter() - started > _COMPILED_SECONDS:
                run.bar.unpause()  # the bar's rate and ETA leave out the compilation
        run.state = s._replace(params=params, opt_state=opt_state, step=int(s.step) + 1,
                               epoch_step=int(s.epoch_step) + 1)
        first = int(s.epoch_step) * self.batch_size
        self._log_loss(run, _Step(int(s.step) + 1, loss, None if self.donate else s,
                                  order[first:first + self.batch_size]))

    @staticmethod
    def _owes_evaluation(run: _Run) -> bool:
        """Whether a resumed run stopped where an evaluation was due but not recorded (one that a
        Ctrl-C or a kill interrupted after the state was saved at its step)."""
        step = int(run.state.step)
        if step == 0 or (run.history and run.history[-1]["step"] >= step):
            return False
        every = run.options.eval_every
        return step % every == 0 if every is not None else int(run.state.epoch_step) == 0

    def _evaluate(self, run: _Run) -> bool:
        """Records an evaluation (the train loss since the last one, dev metrics, scores), keeps the
        best parameters and saves the run; True when it asks to stop early."""
        state = run.state
        record: Record = {"step": int(state.step), "epoch": int(state.epoch)}
        self._log_loss(run, None)
        record["train_loss"] = float(np.mean(run.losses)) if run.losses else math.nan
        record["seconds"] = round(time.perf_counter() - run.started, 3)
        if run.dev is not None:
            record.update({f"dev_{k}": v for k, v in self.evaluate(state.params, run.dev).items()})
        if run.options.scores is not None:
            record.update(run.options.scores(state.params))
        run.losses = []  # only now: an evaluation interrupted before here is made again on resume, with them
        stop = run.options.evaluates and run.keep_if_best(record)
        run.history.append(record)
        self._report(record, run.writer)
        run.save()
        return stop

    def _restore(self, run: _Run) -> None:
        """``run``'s state, best parameters and history from its checkpoint_dir."""
        directory = run.options.directory
        assert directory is not None
        template = run.state._replace(step=np.int64(0), epoch=np.int64(0), epoch_step=np.int64(0),
                                      best=np.float64(0), stale=np.int64(0))
        saved = checkpoint_metadata(directory / LAST)
        _check_settings(directory, saved.get("settings"), run.settings)
        restored = TrainState(**load_checkpoint(directory / LAST, template._asdict()))
        run.state = restored._replace(step=int(restored.step), epoch=int(restored.epoch),
                                      epoch_step=int(restored.epoch_step), best=float(restored.best),
                                      stale=int(restored.stale))
        has_best = (directory / BEST).exists()
        run.best_params = (load_checkpoint(directory / BEST, run.state.params) if has_best
                           else run.keep(run.state.params))
        run.losses = [float(x) for x in saved.get("losses", [])]  # type: ignore[attr-defined]
        if "history" in saved:
            history = saved["history"]
            assert isinstance(history, list)
            run.history = history
        elif (directory / HISTORY).exists():  # a checkpoint from before last.npz carried the history
            try:
                run.history = json.loads((directory / HISTORY).read_text())
            except json.JSONDecodeError as e:
                raise ValueError(f"{directory / HISTORY} is not a history that fit wrote ({e}): move it away to "
                                 "resume without the evaluations before this point") from None
        logger.info("resumed from %s at step %d (epoch %d)", directory / LAST, run.state.step, run.state.epoch)

    def _log_loss(self, run: _Run, step: _Step | None) -> None:
        """Logs the pending step's loss, which is ready once the next step is queued (reading it
        then does not stall the device), and makes ``step`` (the one just taken) pending.

        Raises _Diverged when the pending loss is not finite and neither are the parameters now
        (an optimizer that skips such updates, ``optax.apply_if_finite``, keeps the run going)."""
        if run.pending is not None:
            value = float(run.pending.loss)
            if not math.isfinite(value):
                if not _finite(run.state.params):
                    raise _Diverged(run.pending, value)
                if not run.warned_loss:  # a NaN term the parameters do not reach: training goes on, said once
                    run.warned_loss = True
                    warnings.warn(f"the loss of step {run.pending.step} is {value}, but the parameters stayed finite "
                                  "(a term of the loss that does not depend on them, or an optimizer that skips "
                                  "such steps); training goes on, and train_loss records it", RuntimeWarning,
                                  stacklevel=4)
            run.losses.append(value)
            if run.writer is not None:
                run.writer.add_scalar("train/loss", value, run.pending.step)
            assert run.bar is not None  # made by _start
            run.bar.set_postfix(loss=f"{value:.4g}", refresh=False)
        run.pending = step
        if step is not None:
            assert run.bar is not None  # made by _start
            run.bar.update(1)

    def _stop_diverged(self, run: _Run, diverged: _Diverged, train: Iterable[PyObject] | RecordedExamples) -> None:
        """Goes back to the state before the diverging step when it is finite (saving it as the last
        state) and warns, naming the step's examples, checked with ``check_numerics`` when ``train``
        holds the examples themselves."""
        step, before, indices = diverged.pending.step, diverged.pending.before, diverged.pending.indices.tolist()
        if before is None:
            logger.warning("training diverged at step %d: its loss is %s, and the parameters after it are not "
                           "finite; the run stopped with them, as its steps update the state in place "
                           "(donate=True: the last checkpoint and the best evaluation's parameters are from "
                           "before); its examples are train[i] for i in %s", step, diverged.loss, indices)
            return
        where = f"training diverged at step {step} (epoch {int(before.epoch) + 1}): its loss is {diverged.loss}"
        if not _finite(before.params):
            logger.warning("%s, and the parameters were not finite before it either (an earlier step's gradient "
                           "was not finite though its loss was); the run stopped there", where)
            return
        run.state = before
        run.save()
        examples = f"its examples are train[i] for i in {indices}"
        if isinstance(train, RecordedExamples) or not hasattr(train, "__getitem__"):
            found = (f"{examples}: compiler.check_numerics(result.state.params, those examples, "
                     "dataset_indices=those i) names the one at fault")
        else:
            try:
                self.compiler.check_numerics(before.params, [train[i] for i in indices], dataset_indices=indices)
                found = (f"{examples}, whose values and per-example gradients are all finite: the step diverged "
                         "as a whole (a learning rate too high?)")
            except FloatingPointError as e:
                found = f"{examples}; check_numerics, run on them with the parameters before that step, finds {e}"
        logger.warning("%s, and the parameters after it are not; the run stopped, its state the one before that "
                       "step; %s", where, found)

    def _report(self, record: Record, writer: _Writer | None) -> None:
        line = " ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in record.items())
        if self.progress:
            from tqdm.std import tqdm  # write() prints above every kind of bar

            tqdm.write(line)
        else:
            logger.info(line)
        if writer is not None:
            for k, v in record.items():
                if isinstance(v, float) and k != "step":
                    writer.add_scalar(k.replace("dev_", "dev/", 1), v, int(record["step"]))

    # ------------------------------------------------------------- eval, infer
    def _eval_batches(self, data: Iterable[PyObject] | RecordedExamples, batch_size: int | None,
                      where: str) -> Iterator[Batch]:
        if not isinstance(data, RecordedExamples):
            check_examples(data, where)
        batch_size = self.eval_batch_size if batch_size is None else check_int("batch_size", batch_size, 1)
        return self.compiler.batches(data, batch_size, num_workers=self.num_workers)

    def evaluate(self, params: Params, data: Iterable[PyObject] | RecordedExamples, per_example: bool = False,
                 batch_size: int | None = None) -> dict[str, float | np.ndarray]:
        """Each metric's mean over every entry ``data`` produces (no stochastic layers).

        Args:
          params: the parameters.
          data: examples or recorded examples.
          per_example: instead, per metric, an array with each example's
            mean entry (NaN for an example with no entry), in ``data``'s order.
          batch_size: examples per batch (default ``eval_batch_size``).

        Returns:
          ``{metric: float}`` (a vector metric gives an array; NaN for a
          metric no example gave an entry), or ``{metric: array of
          len(data)}`` with ``per_example``.

        Raises:
          ValueError: ``data`` holds no examples, or ``batch_size`` is not an int >= 1.
        """
        sums: dict[str, np.ndarray] = {}
        counts: dict[str, int] = {}
        parts: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}  # per_example: (examples, entry means)
        n = 0
        for batch in self._eval_batches(data, batch_size, "evaluate"):
            n += batch.layout.num_examples
            for name, m in self.compiler.apply(params, batch).metrics.items():
                mask = np.asarray(m.mask)
                values = np.asarray(m.padded)[mask]
                if per_example:
                    flat = values.reshape(len(values), int(np.prod(values.shape[1:]))).mean(axis=1)
                    example = np.asarray(batch.example_indices)[np.asarray(m.example)[mask]]
                    parts.setdefault(name, []).append((example, flat))
                else:
                    total = values.sum(axis=0, dtype=np.float64)
                    sums[name] = sums[name] + total if name in sums else total
                    counts[name] = counts.get(name, 0) + len(values)
        if not n:
            raise ValueError("evaluate got no examples")
        if per_example:
            out: dict[str, float | np.ndarray] = {}
            for name, metric_parts in parts.items():
                total, count = np.zeros(n), np.zeros(n)
                for example, flat in metric_parts:
                    np.add.at(total, example, flat)
                    np.add.at(count, example, 1)
                with np.errstate(invalid="ignore"):
                    out[name] = total / count
            return out
        with np.errstate(invalid="ignore"):  # a metric with no entry has no mean: NaN, as per example
            return {name: _scalar(sums[name] / counts[name]) for name in sums}

    def predict(self, params: Params, data: Iterable[PyObject] | RecordedExamples,
                batch_size: int | None = None) -> PyTree:
        """The model's outputs for every example of ``data``, in order (NumPy; a tuple output gives
        a tuple of arrays).

        Raises:
          ValueError: the model's root outputs nothing (it ends in a loss ``Metric``): predict
            with a compiler of the block that makes the prediction (docs/quickstart.md,
            "Predicting"), or no examples.
        """
        if not self.compiler.program.root_leaves:
            raise ValueError(
                f"predict returns the model's outputs, and this model's root outputs "
                f"{self.compiler.program.output_type} (it ends in a Metric, say): compile the block that makes "
                "the prediction, fd.Compiler.create(prediction_block), whose layers are the model's so the same "
                "params fit, and run its apply on its batches; docs/quickstart.md, 'Predicting'")
        parts = [jax.tree.map(np.asarray, self.compiler.apply(params, b).outputs)
                 for b in self._eval_batches(data, batch_size, "predict")]
        if not parts:
            raise ValueError("predict got no examples")
        return jax.tree.map(lambda *xs: np.concatenate(xs), *parts)


def _named(error: Exception, what: str) -> Exception:
    """``error`` with ``what`` before its message (``"fit(dev=)'s examples: example 3: ..."``), of
    its own type where that type takes a message alone, else of the built-in type it derives from."""
    message = f"{what}: {error.args[0] if isinstance(error, KeyError) and error.args else error}"
    for cls in type(error).__mro__:
        if issubclass(cls, Exception):
            try:
                return cls(message)
            except Exception:
                continue
    return RuntimeError(message)


def _remove_temp_files(directory: pathlib.Path) -> None:
    """Removes what saves killed halfway (SIGKILL, power loss) left in a run's ``directory``."""
    if not directory.is_dir():
        return
    for path in directory.iterdir():
        if any(is_left_by(path.name, name) for name in (LAST, BEST, HISTORY)):
            logger.info("removing %s, left by a save that was killed halfway", path)
            path.unlink(missing_ok=True)


def _check_settings(directory: pathlib.Path, saved: object, now: dict[str, object]) -> None:
    """Refuses to resume a run with settings that change its batches (its epochs would then visit
    other examples than the run it continues)."""
    if not isinstance(saved, dict):
        return  # saved before checkpoints carried their settings
    layers, saved_layers = now["layers"], saved.get("layers")
    assert isinstance(layers, dict)
    # A default name counts the layers the process made before; the model's order is the layer's
    # place. Loading by name would put each checkpointed layer in another's place. (Names in one
    # of the two only are for loading to refuse, if the layer has parameters.)
    moved = [f"{name} is the model's {layers[name]} (in the checkpoint, its {saved_layers[name]})"
             for name in sorted(layers) if isinstance(saved_layers, dict) and saved_layers.get(name, layers[name])
             != layers[name]]
    if moved:
        raise ValueError(f"resume=True: the layers of the run in {directory} were made in another order: "
                         f"{'; '.join(moved)}. Their parameters would load into other layers: make the layers in "
                         "the order the run did, or give them names (name=) so that checkpoints find them by name")
    differ = [f"{k} {saved[k]!r} (now {now[k]!r})" for k in now if k != "layers" and k in saved and saved[k] != now[k]]
    if differ:
        raise ValueError(f"resume=True: the run in {directory} was trained with {', '.join(differ)}; resuming "
                         "with other settings would not continue it. Resume with its settings, or pass "
                         "overwrite=True to start a new run there")


def _interrupted(run: _Run) -> None:
    """Saves a run that Ctrl-C stopped and says where to resume it; re-raises the interrupt when it
    came in the middle of a step that had taken the state to update in place (nothing to save)."""
    run.stopped = "interrupted"
    if _deleted(run.state):
        logger.warning("training interrupted during step %d, whose state it updates in place (donate=True): the "
                       "state is not saved", int(run.state.step) + 1)
        raise  # called from the except block: re-raises the interrupt being handled
    run.save()
    directory = run.options.directory
    where = f"; resume from {directory / LAST}" if directory is not None else ""
    logger.warning("training interrupted at step %d%s", int(run.state.step), where)


def _deleted(state: TrainState) -> bool:
    """Whether a donating step has deleted ``state``'s arrays."""
    return any(isinstance(leaf, jax.Array) and leaf.is_deleted()
               for leaf in jax.tree_util.tree_leaves((state.params, state.opt_state)))


def _finite(tree: PyTree) -> bool:
    """Whether every float leaf of ``tree`` is finite (read on the host: a diverging run's check only)."""
    return all(np.isfinite(leaf).all() for leaf in map(np.asarray, jax.tree_util.tree_leaves(tree))
               if jnp.issubdtype(leaf.dtype, jnp.inexact))


def _steps_per_epoch(n: int, batch_size: int, drop_remainder: bool) -> int:
    if n == 0:
        raise ValueError("fit got no training examples")
    if drop_remainder and n < batch_size:
        raise ValueError(f"{n} training examples make no full batch of {batch_size}: "
                         "lower batch_size or pass drop_remainder=False")
    return n // batch_size if drop_remainder else -(-n // batch_size)


def _scalar(x: np.ndarray) -> float | np.ndarray:
    return float(x) if np.ndim(x) == 0 else x


def _mode_of(score: str) -> str:
    return "min" if any(word in score for word in ("loss", "error")) else "max"


def _best_record(history: list[Record]) -> Record | None:
    best = None
    for record in history:
        if record.get("best"):
            best = record
    return best


def _writer(log_dir: str | pathlib.Path | None) -> _Writer | None:
    if log_dir is None:
        return None
    try:
        from tensorboardX import SummaryWriter
    except ImportError as e:
        raise ImportError("log_dir needs tensorboardX: pip install tensorboardX") from e
    writer: _Writer = SummaryWriter(str(log_dir))
    return writer


def _bar(show: bool, total: int, initial: int, desc: str) -> _Bar:
    bar: _Bar = tqdm_class()(unit="step", disable=not show, total=total, initial=initial, desc=desc)
    return bar
