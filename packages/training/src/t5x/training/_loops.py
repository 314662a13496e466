"""The train and evaluate loops: periodic eval and checkpoints, resume, preemption."""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import itertools
import math
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import jax
import numpy as np

from t5x.interfaces import Checkpointer, InputIterator, MetricWriter
from t5x.training._actions import TRAIN_METRICS_KEY, ActionMode, improves, normalize_actions, run_actions
from t5x.training._trainer import Trainer

Batch = Mapping[str, np.ndarray]
EvalSource = Iterable[Batch] | Callable[[], Iterable[Batch]]
# (step, params) -> task -> metric -> value: decodes and scores (e.g. t5x.launch's inference eval).
InferenceEval = Callable[[int, Any], Mapping[str, Mapping[str, float]]]


class NonFiniteLossError(FloatingPointError):
    """Training produced a NaN or infinite loss.

    Attributes:
      step: the train state's step when the bad batch was used (the update that
        would have produced ``step + 1`` was not kept).
      loss: the loss value.
      last_checkpoint_step: the newest saved checkpoint, or None.
    """

    def __init__(self, step: int, loss: float, last_checkpoint_step: int | None):
        self.step, self.loss, self.last_checkpoint_step = step, loss, last_checkpoint_step
        where = (
            "no checkpoint was saved"
            if last_checkpoint_step is None
            else (f"the last good checkpoint is step {last_checkpoint_step}")
        )
        super().__init__(f"non-finite loss {loss} at train step {step}; training stopped ({where})")


@dataclasses.dataclass
class EarlyStopping:
    """Stops training when an eval metric stops improving, as upstream's action.

    Args:
      metric: ``(eval name, metric name)``, e.g. ``("validation", "loss")``.
      mode: ``"min"`` or ``"max"``.
      patience: evaluations without improvement before stopping.
      atol: absolute improvement that counts.
      rtol: relative improvement that counts.
    """

    metric: tuple[str, str]
    mode: str = "min"
    patience: int = 3
    atol: float = 0.0
    rtol: float = 0.0
    best: float | None = dataclasses.field(default=None, init=False)
    misses: int = dataclasses.field(default=0, init=False)

    def __post_init__(self) -> None:
        if self.mode not in ("min", "max"):
            raise ValueError(f"EarlyStopping.mode must be 'min' or 'max', got {self.mode!r}")

    def update(self, eval_metrics: Mapping[str, Mapping[str, float]]) -> bool:
        """Records one evaluation; returns True when training should stop.

        Raises:
          KeyError: the monitored metric is not among the results.
        """
        name, metric = self.metric
        if name not in eval_metrics or metric not in eval_metrics[name]:
            raise KeyError(
                f"EarlyStopping monitors {self.metric}, but evaluation gave {sorted(eval_metrics)}"
            )
        value = float(eval_metrics[name][metric])
        if improves(value, self.best, self.mode, self.atol, self.rtol):
            self.best, self.misses = value, 0
        else:
            self.misses += 1
        return self.misses >= self.patience


@dataclasses.dataclass
class TrainResult:
    """What :func:`train` did.

    Attributes:
      step: the train state's step at the end.
      losses: ``{step: loss}`` for each step run here (the state's step before
        the update).
      stop_reason: ``"completed"``, ``"signal"``, ``"early_stopping"`` (the
        ``early_stopping`` argument), ``"action"`` (an action asked to stop),
        ``"data_exhausted"`` or ``"already_done"``.
      start_step: the step training started (or resumed) from.
      eval_metrics: the last evaluation's results.
      inference_metrics: the last inference evaluation's results (task ->
        metric -> value).
      stopped_by: the action (its ``str``) that stopped training, with its
        mode, e.g. ``"TRAIN_EVAL: EarlyStoppingAction(...)"``; else None.
      signal: the number of the SIGTERM / SIGINT received while training ran
        (``signal.SIGTERM``, ...), else None. With ``stop_reason == "signal"``
        it stopped training early (after saving); one that came after the last
        step leaves ``stop_reason`` as it was, so that a caller running several
        trainings can still stop.
    """

    step: int
    losses: dict[int, float]
    stop_reason: str
    start_step: int
    eval_metrics: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)
    signal: int | None = None
    inference_metrics: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)
    stopped_by: str | None = None


@contextlib.contextmanager
def _manual_gc(gc_period: int) -> Iterator[None]:
    """With a ``gc_period``, Python's automatic collection is off while inside (as upstream)."""
    was_enabled = gc.isenabled()
    if gc_period:
        gc.disable()
    try:
        yield
    finally:
        if gc_period and was_enabled:
            gc.enable()


@contextlib.contextmanager
def _stop_on_signals(enabled: bool) -> Iterator[dict[str, Any]]:
    """Records the first SIGTERM / SIGINT in ``flag["signal"]``; a later SIGINT raises KeyboardInterrupt."""
    flag: dict[str, Any] = {"signal": None}
    if not enabled or threading.current_thread() is not threading.main_thread():
        yield flag
        return

    def handler(signum: int, frame: Any) -> None:
        del frame
        if flag["signal"] is None:
            flag["signal"] = signum
        elif signum == signal.SIGINT:
            # A second interrupt: the user does not want to wait for the step and the save.
            raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield flag
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


_BARRIER_TIMEOUT_MS = 30 * 60 * 1000
_train_calls = itertools.count()


class _SignalAgreement:
    """Makes every process of a ``jax.distributed`` job stop after the same step.

    A signal reaches the processes at different moments (or only some of them).
    A process that got one announces it in the distributed runtime's key-value
    store together with the step after which it checks; after each step every
    process meets the others at a barrier and reads the announcements. An
    announcement for step ``s`` is written before its process enters barrier
    ``s``, so after that barrier every process sees the same set for ``s``.
    Alone (or without jax.distributed) it is the local flag.
    """

    def __init__(self) -> None:
        self.client = None
        if jax.process_count() > 1:
            from jax._src import distributed  # the public API has no key-value store or barrier

            self.client = distributed.global_state.client
        self.prefix = f"t5x_train/{next(_train_calls)}"
        self.announced = False

    def check(self, step: int, local_signal: int | None) -> int | None:
        """The signal every process stops for after ``step``, or None to go on."""
        if self.client is None:
            return local_signal
        if local_signal is not None and not self.announced:
            self.client.key_value_set(
                f"{self.prefix}/signal/{jax.process_index()}", f"{step}:{int(local_signal)}"
            )
            self.announced = True
        self.client.wait_at_barrier(f"{self.prefix}/step/{step}", _BARRIER_TIMEOUT_MS)
        announced = []
        for _, value in self.client.key_value_dir_get(f"{self.prefix}/signal/"):
            at, signum = (int(part) for part in value.split(":"))
            if at <= step:
                announced.append((at, signum))
        return min(announced)[1] if announced else None


def restore_latest(
    trainer: Trainer, checkpointer: Checkpointer, train_iter: InputIterator | None = None
) -> int | None:
    """Loads the newest checkpoint into ``trainer.state`` (and the iterator).

    Returns:
      The restored step, or None when there is no checkpoint.
    """
    step = checkpointer.latest_step()
    if step is None:
        return None
    restored = checkpointer.restore(
        step, target=trainer.state.state_dict(), shardings=trainer.state_shardings.state_dict()
    )
    trainer.state = trainer.state.restore_state(restored.state)
    if train_iter is not None and restored.input_state is not None:
        train_iter.set_state(restored.input_state)
    return int(restored.step)


def fetch_scalars(trainer: Trainer, metrics: Mapping[str, Any]) -> dict[str, float]:
    """Replicated device scalars as floats, without a cross-process gather."""
    out, rest = {}, {}
    for key, value in metrics.items():
        if isinstance(value, jax.Array) and value.sharding.is_fully_replicated:
            out[key] = float(np.asarray(value.addressable_data(0)))
        else:
            rest[key] = value
    if rest:
        out.update({k: float(v) for k, v in trainer.partitioner.global_to_host_local(rest).items()})
    return out


def _sources(eval_sources: Mapping[str, EvalSource] | None) -> dict[str, EvalSource]:
    return dict(eval_sources or {})


def evaluate(
    trainer: Trainer,
    eval_sources: Mapping[str, EvalSource],
    *,
    num_batches: int | None = None,
    metric_writer: MetricWriter | None = None,
    step: int | None = None,
    inference_evaluators: Mapping[str, Callable[[Any], Mapping[str, float]]] | None = None,
) -> dict[str, dict[str, float]]:
    """Teacher-forced metrics of ``trainer.state`` on each eval dataset.

    Args:
      trainer: holds the model and state.
      eval_sources: name -> an iterable of batches, or a function returning a
        fresh one (called on every evaluation).
      num_batches: at most this many batches per dataset (None: all).
      metric_writer: where ``<name>/<metric>`` scalars go.
      step: the step to write them at (default: the state's step).
      inference_evaluators: name -> a function of the params returning
        inference metrics (e.g. a task evaluator running predictions); its
        results are merged into ``name``'s metrics.

    Returns:
      name -> metric -> the mean over batches of the model's eval metrics
      (plus the inference metrics).

    Raises:
      ValueError: a dataset gave no batch.
    """
    results: dict[str, dict[str, float]] = {}
    for name, source in eval_sources.items():
        batches = source() if callable(source) else source
        sums: dict[str, float] = {}
        count = 0
        for batch in batches:
            if num_batches is not None and count >= num_batches:
                break
            for key, value in fetch_scalars(trainer, trainer.eval_step(batch)).items():
                sums[key] = sums.get(key, 0.0) + value
            count += 1
        if count == 0:
            raise ValueError(f"eval dataset {name!r} gave no batches")
        results[name] = {k: v / count for k, v in sums.items()}
    for name, evaluator in (inference_evaluators or {}).items():
        results.setdefault(name, {}).update({k: float(v) for k, v in evaluator(trainer.state.params).items()})
    if metric_writer is not None:
        at = int(trainer.state.step) if step is None else step
        metric_writer.write_scalars(at, {f"{n}/{k}": v for n, m in results.items() for k, v in m.items()})
    return results


def train(
    trainer: Trainer,
    train_iter: InputIterator,
    *,
    total_steps: int,
    checkpointer: Checkpointer | None = None,
    checkpoint_period: int | None = None,
    eval_sources: Mapping[str, EvalSource] | None = None,
    eval_period: int | None = None,
    eval_batches: int | None = None,
    inference_evaluators: Mapping[str, Callable[[Any], Mapping[str, float]]] | None = None,
    metric_writer: MetricWriter | None = None,
    log_period: int = 10,
    early_stopping: EarlyStopping | None = None,
    resume: bool = True,
    handle_signals: bool = True,
    on_step: Callable[[int, Mapping[str, float]], None] | None = None,
    inference_eval: InferenceEval | None = None,
    actions: Mapping[Any, Sequence[Any]] | None = None,
    run_eval_before_training: bool = False,
    checkpoint_steps: Iterable[int] | None = None,
    gc_period: int = 0,
) -> TrainResult:
    """Trains until ``total_steps``, resuming from the latest checkpoint.

    With ``resume`` the newest checkpoint of ``checkpointer`` (params,
    optimizer, step and the iterator's state) is loaded first, so a restarted
    job repeats exactly the losses the uninterrupted job would have had. A
    checkpoint is saved every ``checkpoint_period`` steps and at the end. On
    SIGTERM or SIGINT the loop finishes the current step, saves, and returns
    with ``stop_reason="signal"`` and the signal's number in ``signal`` (what
    to exit with is the caller's choice; ``t5x-launch`` exits 128 + the
    number). A second SIGINT raises KeyboardInterrupt at once. In a
    multi-process job every process stops after the same step, whichever
    processes got the signal.

    Args:
      trainer: the Trainer (its state is updated in place).
      train_iter: this process's batches.
      total_steps: the step to stop at (absolute, counting resumed steps).
      checkpointer: saves and restores; None for none.
      checkpoint_period: steps between saves (None: only at the end).
      eval_sources: eval datasets for :func:`evaluate`.
      eval_period: steps between evaluations, teacher-forced and inference
        (None: only at the end).
      eval_batches: batches per evaluation and dataset (upstream's ``eval_steps``).
      inference_evaluators: see :func:`evaluate`.
      metric_writer: receives train metrics every ``log_period`` steps (means
        over the period, plus tokens/s, sequences/s and MFU) and eval metrics.
      log_period: steps between train-metric writes.
      early_stopping: stops when an eval metric stops improving.
      resume: load the latest checkpoint first.
      handle_signals: install the SIGTERM / SIGINT handlers (main thread only)
        and, in a multi-process job, agree on the step to stop after (one
        barrier of the distributed runtime per step).
      on_step: called with ``(step, metrics)`` after each step.
      inference_eval: ``(step, params) -> task -> metric -> value``, run with
        the teacher-forced evaluation (every ``eval_period`` and at the end).
      actions: ``{mode: [action, ...]}`` (mode an :class:`ActionMode` or its
        name); an action's ``run(step, metrics_by_task)`` returning True ends
        training after a save (``stop_reason="action"``). ``TRAIN`` actions
        run every ``eval_period`` (else ``log_period``) steps with the mean
        train metrics since their last run under ``"train"``.
      run_eval_before_training: evaluate (both kinds) once before the first step.
      checkpoint_steps: further steps to save at, besides every ``checkpoint_period``.
      gc_period: run ``gc.collect()`` every this many steps, with Python's
        automatic collection off during training (0: Python's default).

    Returns:
      A TrainResult.

    Raises:
      NonFiniteLossError: a NaN / infinite loss; that state is not saved.
    """
    if total_steps < 0:
        raise ValueError(f"total_steps must be >= 0, got {total_steps}")
    if gc_period < 0:
        raise ValueError(f"gc_period must be >= 0, got {gc_period}")
    by_mode = normalize_actions(actions)
    save_steps = {int(s) for s in (checkpoint_steps or ())}
    if resume and checkpointer is not None:
        restore_latest(trainer, checkpointer, train_iter)
    step = start_step = int(trainer.state.step)
    result = TrainResult(step=step, losses={}, stop_reason="completed", start_step=start_step)
    if step >= total_steps:
        result.stop_reason = "already_done"
        return result
    last_saved = checkpointer.latest_step() if checkpointer is not None else None

    def save() -> None:
        nonlocal last_saved
        if checkpointer is not None and last_saved != step:
            checkpointer.save(step, trainer.state.state_dict(), train_iter.get_state())
            last_saved = step

    period_sums: dict[str, float] = {}
    period_steps = 0
    period_start = time.perf_counter()
    batch_shapes: dict[str, tuple[int, ...]] = {}

    def flush_metrics() -> None:
        nonlocal period_sums, period_steps, period_start
        if metric_writer is not None and period_steps:
            scalars = {k: v / period_steps for k, v in period_sums.items()}
            scalars.update(
                trainer.throughput_metrics(batch_shapes, period_steps, time.perf_counter() - period_start)
            )
            metric_writer.write_scalars(step, scalars)
        period_sums, period_steps, period_start = {}, 0, time.perf_counter()

    has_eval = bool(eval_sources or inference_evaluators or inference_eval)
    evaluated_at: int | None = None
    action_sums: dict[str, float] = {}
    action_steps = 0

    def stop_for(mode: ActionMode, metrics_by_task: Mapping[str, Mapping[str, float]]) -> bool:
        stopper = run_actions(by_mode, mode, step, metrics_by_task, lambda: trainer.state)
        if stopper is not None and result.stopped_by is None:
            result.stopped_by = f"{mode.name}: {stopper}"
        return stopper is not None

    def run_eval() -> bool:
        nonlocal evaluated_at
        evaluated_at = step
        stop = False
        if eval_sources or inference_evaluators:
            result.eval_metrics = evaluate(
                trainer,
                _sources(eval_sources),
                num_batches=eval_batches,
                metric_writer=metric_writer,
                step=step,
                inference_evaluators=inference_evaluators,
            )
            if early_stopping is not None and early_stopping.update(result.eval_metrics):
                stop = True
                result.stopped_by = result.stopped_by or f"early_stopping: {early_stopping}"
            stop = stop_for(ActionMode.TRAIN_EVAL, result.eval_metrics) or stop
        if inference_eval is not None:
            found = inference_eval(step, trainer.state.params)
            result.inference_metrics = {task: dict(m) for task, m in found.items()}
            stop = stop_for(ActionMode.INFER_EVAL, result.inference_metrics) or stop
        return stop

    def run_train_actions() -> bool:
        nonlocal action_sums, action_steps
        means = {k: v / max(1, action_steps) for k, v in action_sums.items()}
        action_sums, action_steps = {}, 0
        return stop_for(ActionMode.TRAIN, {TRAIN_METRICS_KEY: means})

    def stop_reason_for_actions() -> str:
        return "early_stopping" if (result.stopped_by or "").startswith("early_stopping") else "action"

    agreement = _SignalAgreement() if handle_signals else None
    train_action_period = eval_period or max(1, log_period)
    with _manual_gc(gc_period), _stop_on_signals(handle_signals) as flag:
        stop = False
        if run_eval_before_training and has_eval:
            stop = run_eval()
            if stop:
                result.stop_reason = stop_reason_for_actions()
        while step < total_steps and not stop:
            try:
                batch = next(train_iter)
            except StopIteration:
                result.stop_reason = "data_exhausted"
                break
            metrics = trainer.train_step(batch)
            host = fetch_scalars(trainer, metrics)
            if not batch_shapes:
                batch_shapes = {k: tuple(v.shape) for k, v in trainer.to_global(batch).items()}
            loss = host.get("loss", math.nan)
            if not math.isfinite(loss):
                if checkpointer is not None:
                    checkpointer.wait_until_finished()
                raise NonFiniteLossError(step, loss, checkpointer.latest_step() if checkpointer else None)
            result.losses[step] = loss
            step += 1
            for key, value in host.items():
                period_sums[key] = period_sums.get(key, 0.0) + value
                action_sums[key] = action_sums.get(key, 0.0) + value
            period_steps += 1
            action_steps += 1
            if on_step is not None:
                on_step(step, host)
            if step % max(1, log_period) == 0:
                flush_metrics()
            if gc_period and step % gc_period == 0:
                gc.collect()
            if ActionMode.TRAIN in by_mode and step % train_action_period == 0:
                stop = run_train_actions()
            if has_eval and eval_period and step % eval_period == 0:
                stop = run_eval() or stop
            if (checkpoint_period and step % checkpoint_period == 0) or step in save_steps:
                save()
            if agreement is not None:
                result.signal = agreement.check(step, flag["signal"])
            if result.signal is not None:
                result.stop_reason = "signal"
                break
            if stop:
                result.stop_reason = stop_reason_for_actions()
                break
        flush_metrics()
        if has_eval and result.stop_reason == "completed" and evaluated_at != step:
            run_eval()  # the final evaluation; a stop it asks for has nothing left to stop
        save()
        if checkpointer is not None:
            checkpointer.wait_until_finished()
        if metric_writer is not None:
            metric_writer.flush()
    if result.signal is None:
        result.signal = flag["signal"]  # came after the last step's check
    result.step = step
    return result
