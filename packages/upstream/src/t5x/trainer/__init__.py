"""Upstream t5x's ``t5x.trainer``: its train / eval loop, metrics managers and train actions.

Two uses share the ``Trainer`` class:

* a run's settings record: upstream gin files bind ``trainer_cls = @trainer.Trainer``
  with ``learning_rate_fn`` / ``num_microbatches``; t5x-upstream's train script builds
  it without a model just to read those settings (t5x-launch then trains itself);
* upstream's trainer object: ``Trainer(model, train_state, partitioner, eval_names,
  summary_dir, train_state_axes, rng, learning_rate_fn, num_microbatches)`` then
  ``train(batch_iter, num_steps)`` / ``eval(batch_iters)``, with upstream's
  step functions (``accumulate_grads_microbatched``, ``apply_grads``, ``eval_step``,
  ``train_with_lr``) looked up on this module at trace time, so they can be patched.

Metrics are clu ``Metric`` objects (``t5x.metrics``); a model whose loss function
returns plain scalars (as t5x.models' do) has them wrapped (see `as_metric_objects`).
"""

from __future__ import annotations

import abc
import concurrent.futures
import enum
import functools
import threading
import time
from collections.abc import Callable, Iterator, Mapping, MutableMapping, Sequence
from typing import Any

import flax
import jax
import jax.numpy as jnp
import numpy as np
from absl import logging
from flax.core import FrozenDict
from jax.sharding import PartitionSpec

from t5x.partitioning import with_sharding_constraint
from t5x.trainer._metrics_manager import (
    MetricsManager,
    _host_value,
    _require_clu,
    clu_metrics,
    clu_values,
    metrics_lib,
)
from t5x.training import SUMMED_METRICS

BatchType = Mapping[str, Any]
MetricMapType = MutableMapping[str, Any]  # name -> clu Metric
PyTree = Any


# Upstream's default batch sharding: the batch dimension over the 'data' mesh axis.
_DATA_SPEC = PartitionSpec("data")

# Names of directories TensorBoard reads must stay short of the file system's name limit.
_MAX_EVAL_NAME = 113


# ---------------------------------------------------------------------------------- metrics


def as_metric_objects(metrics: Mapping[str, Any]) -> dict[str, clu_metrics.Metric]:
    """``metrics`` with every plain number wrapped as a clu metric; metric objects pass through.

    Upstream's models return clu metrics; t5x.models' return scalars. Totals (the
    names in ``t5x.training.SUMMED_METRICS``, e.g. ``loss``) add up over microbatches
    and average over steps (``AveragePerStep``), as upstream's loss does; the others
    (ratios such as ``accuracy``) are averaged over every microbatch of every step.
    """
    _require_clu("as_metric_objects")
    out: dict[str, clu_metrics.Metric] = {}
    for name, value in metrics.items():
        if metrics_lib.is_metric_obj(value):
            out[name] = value
        elif name in SUMMED_METRICS:
            out[name] = metrics_lib.AveragePerStep.from_model_output(value)
        else:
            out[name] = clu_metrics.Average(
                total=jnp.asarray(value, jnp.float32).sum(), count=jnp.asarray(1, jnp.int32)
            )
    return out


@jax.jit
def _merge_metrics(a: MetricMapType, b: MetricMapType) -> MetricMapType:
    return {name: a[name].merge(b[name]) for name in a}


def merge_metrics(a: MetricMapType, b: MetricMapType) -> MetricMapType:
    """Merges two ``{name: clu Metric}`` maps name by name (both must have the same names)."""
    if set(a) != set(b):
        raise ValueError(f"cannot merge metrics with different names: {sorted(a)} vs {sorted(b)}")
    return _merge_metrics(dict(a), dict(b))


class WeightMetricsComputer:
    """Per-parameter summaries of the weights, their gradients and their updates.

    Given to ``Trainer(weight_metrics_computer=...)``, each train step adds
    ``weight_rms/<param>``, ``weight_gradient_rms/<param>``, ``weight_gradient_norm``,
    ``weight_update_rms/<param>``, ``weight_update_divided_by_weight_rms/<param>`` and
    ``weight_max/<param>`` (per-step averages). t5x-launch's own train loop
    does not compute them.
    """

    @staticmethod
    def _per_param(prefix: str, tree: Any, reduce: Callable[[jax.Array], jax.Array]) -> dict[str, Any]:
        flat = flax.traverse_util.flatten_dict(flax.core.unfreeze(tree), sep="/")
        return {
            f"{prefix}/{name}": metrics_lib.AveragePerStep.from_model_output(reduce(jnp.asarray(value)))
            for name, value in flat.items()
        }

    def compute_metrics(self, gradients: Any, old_train_state: Any, new_train_state: Any) -> dict[str, Any]:
        """The summaries for one step, from its gradients and the states before and after it."""
        rms = lambda x: jnp.sqrt(jnp.mean(jnp.square(x)))  # noqa: E731
        update = jax.tree.map(jnp.subtract, new_train_state.params, old_train_state.params)
        relative = jax.tree.map(jnp.divide, update, old_train_state.params)
        grad_norm = jnp.sqrt(sum(jnp.vdot(g, g) for g in jax.tree.leaves(gradients)))
        return {
            **self._per_param("weight_rms", new_train_state.params, rms),
            **self._per_param("weight_gradient_rms", gradients, rms),
            "weight_gradient_norm": metrics_lib.AveragePerStep.from_model_output(grad_norm),
            **self._per_param("weight_update_rms", update, rms),
            **self._per_param("weight_update_divided_by_weight_rms", relative, rms),
            **self._per_param("weight_max", new_train_state.params, lambda x: jnp.max(jnp.abs(x))),
        }


# --------------------------------------------------------------------------- step functions


def _data_partition_spec(partitioner: Any) -> PartitionSpec:
    """Upstream's ``partitioner.data_partition_spec``; ours is derived from its data axes."""
    spec = getattr(partitioner, "data_partition_spec", None)
    if spec is not None:
        return spec
    axes = tuple(getattr(partitioner, "data_axes", ("data",)))
    return PartitionSpec(axes if len(axes) > 1 else (axes[0] if axes else None))


def _loss_and_grads(
    model: Any, params: Any, batch: BatchType, rng: Any, flax_mutables: Any
) -> tuple[dict[str, Any], Any, Any]:
    """(metrics, gradients, new flax_mutables) of one (micro)batch through ``model.loss_fn``."""
    grad_fn = jax.value_and_grad(model.loss_fn, has_aux=True)  # looked up now: tests patch it
    if flax_mutables is None:
        (_, metrics), grads = grad_fn(params, batch, rng)
    else:
        (_, (metrics, flax_mutables)), grads = grad_fn(params, batch, rng, flax_mutables)
    return as_metric_objects(metrics), grads, flax_mutables


def accumulate_grads_microbatched(
    model: Any,
    train_state: Any,
    batch: BatchType,
    dropout_rng: Any,
    num_microbatches: int | None,
    data_partition_spec: PartitionSpec = _DATA_SPEC,
) -> tuple[Any, dict[str, clu_metrics.Metric], Any]:
    """Gradients of ``model.loss_fn`` summed over ``num_microbatches`` equal slices of the batch.

    A train state with non-empty ``flax_mutables`` passes them to ``loss_fn`` as a fourth
    argument and expects ``(loss, (metrics, flax_mutables))`` back.

    Args:
      model: the model (``loss_fn(params, batch, dropout_rng[, flax_mutables])``).
      train_state: the current state.
      batch: the features, batch-major.
      dropout_rng: the step's key; microbatch ``i`` uses ``fold_in(dropout_rng, i)``.
      num_microbatches: slices to accumulate over; None, 0 or 1: the whole batch at once.
      data_partition_spec: how a microbatch is sharded (as the batch is).

    Returns:
      ``(gradients, metrics, flax_mutables)``; flax_mutables is None when the state has none.
    """
    mutables = train_state.flax_mutables or None
    if num_microbatches is None or num_microbatches <= 1:
        metrics, grads, mutables = _loss_and_grads(model, train_state.params, batch, dropout_rng, mutables)
        return grads, metrics, mutables

    batch_size = next(iter(batch.values())).shape[0]
    if batch_size % num_microbatches:
        raise ValueError(f"batch size {batch_size} is not divisible by num_microbatches={num_microbatches}")
    size = batch_size // num_microbatches
    logging.info("accumulating gradients over %d microbatches of %d rows", num_microbatches, size)

    def microbatch_step(index: Any, mutables: Any) -> tuple[dict[str, Any], Any, Any]:
        sliced = {k: jax.lax.dynamic_slice_in_dim(v, index * size, size, axis=0) for k, v in batch.items()}
        sliced = {k: with_sharding_constraint(v, data_partition_spec) for k, v in sliced.items()}
        rng = jax.random.fold_in(dropout_rng, index)
        return _loss_and_grads(model, train_state.params, sliced, rng, mutables)

    # The first microbatch starts the sums, so metric types need no neutral element.
    metrics, grads, mutables = microbatch_step(0, mutables)
    grads = jax.tree.map(lambda p, g: jnp.zeros(np.shape(p), jnp.float32) + g, train_state.params, grads)

    def body(index: Any, carry: tuple[Any, Any, Any]) -> tuple[Any, Any, Any]:
        grad_sum, metric_sum, mutables = carry
        step_metrics, step_grads, mutables = microbatch_step(index, mutables)
        grad_sum = jax.tree.map(jnp.add, grad_sum, step_grads)
        metric_sum = {name: metric_sum[name].merge(step_metrics[name]) for name in metric_sum}
        return grad_sum, metric_sum, mutables

    grads, metrics, mutables = jax.lax.fori_loop(1, num_microbatches, body, (grads, metrics, mutables))
    return grads, metrics, mutables


def apply_grads(
    train_state: Any,
    grad_accum: Any,
    metrics: MutableMapping[str, clu_metrics.Metric],
    learning_rate: Any,
    weight_metrics_computer: WeightMetricsComputer | None,
    other_state_variables: Mapping[str, Any] | None = None,
) -> tuple[Any, MutableMapping[str, clu_metrics.Metric]]:
    """One optimizer update; adds ``learning_rate`` (mean) and ``learning_rate/current`` (last)."""
    new_state = train_state.apply_gradient(
        grad_accum, learning_rate=learning_rate, **(other_state_variables or {})
    )
    lr = jnp.asarray([learning_rate], jnp.float32)
    metrics["learning_rate"] = clu_metrics.Average.from_model_output(lr)
    metrics["learning_rate/current"] = clu_metrics.LastValue.from_model_output(lr)
    if weight_metrics_computer is not None:
        metrics.update(weight_metrics_computer.compute_metrics(grad_accum, train_state, new_state))
    return new_state, metrics


def eval_step(model: Any, train_state: Any, batch: BatchType) -> dict[str, clu_metrics.Metric]:
    """The metrics of ``model.eval_fn`` on one batch (with the state's flax_mutables, if any)."""
    if train_state.flax_mutables:
        _, metrics = model.eval_fn(train_state.params, batch, train_state.flax_mutables)
    else:
        _, metrics = model.eval_fn(train_state.params, batch)
    return as_metric_objects(metrics)


def train_with_lr(
    train_state: Any,
    batch: BatchType,
    learning_rate: Any,
    dropout_rng: Any,
    model: Any,
    num_microbatches: int | None,
    weight_metrics_computer: WeightMetricsComputer | None = None,
    data_partition_spec: PartitionSpec = _DATA_SPEC,
) -> tuple[Any, MutableMapping[str, clu_metrics.Metric]]:
    """One train step: accumulate the gradients, then apply them at ``learning_rate``."""
    # Positional calls: patched stand-ins name their parameters differently.
    grad_accum, metrics, flax_mutables = accumulate_grads_microbatched(
        model, train_state, batch, dropout_rng, num_microbatches, data_partition_spec
    )
    other = {"flax_mutables": flax_mutables} if flax_mutables else None
    return apply_grads(
        train_state, grad_accum, metrics, learning_rate, weight_metrics_computer, other_state_variables=other
    )


# --------------------------------------------------------------------------------- trainers


class PreemptionError(Exception):
    """Training was interrupted and needs an emergency checkpoint."""


class BaseTrainer(abc.ABC):
    """The train and eval loops; subclasses give ``_partitioned_train_step`` / ``_partitioned_eval_step``.

    The loops start metric threads: use the trainer as a context manager or call
    ``close()`` when done.
    """

    def __init__(
        self,
        model: Any,
        train_state: Any,
        partitioner: Any,
        eval_names: Sequence[str],
        summary_dir: str | None,
        train_state_axes: Any,
        rng: Any,
    ):
        self._model = model
        self._partitioner = partitioner
        self._train_state_axes = train_state_axes
        self._base_rng = rng
        self._compiled_train_step: Callable[..., Any] | None = None
        self._compiled_eval_steps: MutableMapping[str, Callable[..., Any]] = {}
        self._compiled_eval_step_cache: MutableMapping[Any, Callable[..., Any]] = {}
        # Kept by a lock: an async checkpointer may read the state while the loop runs.
        self._train_state_lock = threading.RLock()
        self._train_state = train_state
        self.stop_training = False
        self._trainer_init_time = time.time()  # for timing/uptime
        self.train_metrics_manager: Any = MetricsManager("train", summary_dir=summary_dir)
        self.eval_metrics_managers: dict[str, Any] = {
            name: MetricsManager(f"training_eval/{name[:_MAX_EVAL_NAME]}", summary_dir=summary_dir)
            for name in eval_names
        }

    def __enter__(self) -> BaseTrainer:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def close(self) -> None:
        """Waits for the metric threads and closes the writers."""
        managers = [self.train_metrics_manager, *self.eval_metrics_managers.values()]
        for manager in managers:
            if manager is not None:
                manager.close()

    @property
    def train_state(self) -> Any:
        with self._train_state_lock:
            return self._train_state

    @train_state.setter
    def train_state(self, train_state: Any) -> None:
        with self._train_state_lock:
            self._train_state = train_state

    def _get_step_rng(self, step: Any) -> Any:
        return jax.random.fold_in(self._base_rng, step)

    def _global_batch(self, batch: Any) -> Any:
        # With several processes each reads its own rows; the step wants global arrays.
        if jax.process_count() > 1 and isinstance(batch, Mapping):
            return self._partitioner.host_local_to_global(batch)
        return batch

    def train(
        self, batch_iter: Iterator[BatchType], num_steps: int, start_step: int | None = None
    ) -> concurrent.futures.Future[dict[str, Any]]:
        """Runs ``num_steps`` train steps on batches from ``batch_iter``.

        Returns:
          A future of the summary (``{name: clu value}``) written at the last step.
        """
        self._check_bound("train")
        step_fn = self._compiled_train_step or self._partitioned_train_step
        metrics: Any = None
        with self._train_state_lock:
            state = self.train_state
            first = int(start_step if start_step is not None else _host_value(state.step))
            self.train_metrics_manager.start_duration_timer(block_on=state)
            for step in range(first, first + num_steps):
                logging.log_every_n_seconds(logging.INFO, "Training: step %d", 10, step)
                with jax.profiler.StepTraceAnnotation("train", step_num=step):
                    state, update = step_fn(state, self._global_batch(next(batch_iter)))
                    metrics = update if metrics is None else merge_metrics(metrics, update)
            self.train_state = state
        metrics = dict(metrics or {})
        uptime = time.time() - self._trainer_init_time
        metrics["timing/uptime"] = clu_metrics.LastValue.from_model_output(jnp.asarray([uptime]))
        return self.train_metrics_manager.write_metrics_summary(metrics, first + num_steps, num_steps)

    def compile_train(self, batch: BatchType) -> None:
        """Compiles the train step for batches shaped like ``batch`` (optional; logs the time)."""
        self._check_bound("compile_train")
        tick = time.time()
        self._compiled_train_step = self._partitioner.compile(
            self._partitioned_train_step, self.train_state, batch
        )
        tock = time.time()
        self.train_metrics_manager.write_scalar(
            "timing/compilation_seconds", tock - tick, self.train_state.step
        )

    def eval(self, batch_iters: Mapping[str, Iterator[BatchType]]) -> dict[str, dict[str, Any]]:
        """Evaluates every ``{eval_name: batches}`` and writes their summaries.

        Returns:
          ``{eval_name: {metric: clu value}}``.
        """
        self._check_bound("eval")
        state = self.train_state
        futures = {}
        for name, batch_iter in batch_iters.items():
            logging.info("Evaluating: %s.", name)
            step_fn = self._compiled_eval_steps.get(name, self._partitioned_eval_step)
            manager = self.eval_metrics_managers[name]
            manager.start_duration_timer(block_on=state)
            metrics, num_steps = self._eval_batches(step_fn, state, batch_iter)
            futures[name] = manager.write_metrics_summary(metrics, state.step, num_steps)
        return {name: future.result() for name, future in futures.items()}

    def _eval_batches(self, step_fn: Callable[..., Any], state: Any, batch_iter: Any) -> tuple[Any, int]:
        metrics: Any = None
        num_steps = 0
        for batch in batch_iter:
            num_steps += 1
            self._assert_same_step_count(num_steps)
            update = step_fn(state, self._global_batch(batch))
            metrics = update if metrics is None else merge_metrics(metrics, update)
        self._assert_same_step_count(-1)  # every process ran out of batches together
        return (metrics or {}), num_steps

    @staticmethod
    def _assert_same_step_count(count: int) -> None:
        if jax.process_count() > 1:
            from jax.experimental import multihost_utils

            multihost_utils.assert_equal(
                np.asarray(count), "Eval step mismatch across hosts. Check for empty dataset shard."
            )

    def compile_eval(self, batches: Mapping[str, BatchType]) -> None:
        """Compiles the eval step per ``{eval_name: sample batch}``, once per batch shape."""
        self._check_bound("compile_eval")
        for name, batch in batches.items():
            tick = time.time()
            key: Any = FrozenDict(jax.eval_shape(lambda b=batch: b))
            if key not in self._compiled_eval_step_cache:
                self._compiled_eval_step_cache[key] = self._partitioner.compile(
                    self._partitioned_eval_step, self.train_state, self._global_batch(batch)
                )
            self._compiled_eval_steps[name] = self._compiled_eval_step_cache[key]
            tock = time.time()
            self.eval_metrics_managers[name].write_scalar(
                "timing/compilation_seconds", tock - tick, self.train_state.step
            )

    def _check_bound(self, what: str) -> None:
        if getattr(self, "_model", None) is None:
            raise RuntimeError(
                f"{type(self).__name__}.{what}: this trainer was built as a settings record (no model); "
                "pass model, train_state, partitioner, eval_names, summary_dir, train_state_axes and rng"
            )

    @property
    @abc.abstractmethod
    def _partitioned_train_step(self) -> Callable[..., Any]:
        """``(train_state, batch) -> (train_state, metrics)``, partitioned."""

    @property
    @abc.abstractmethod
    def _partitioned_eval_step(self) -> Callable[..., Any]:
        """``(train_state, batch) -> metrics``, partitioned."""


class Trainer(BaseTrainer):
    """Upstream's trainer: a learning-rate schedule, optional microbatches and weight metrics.

    Built without a model (``Trainer(learning_rate_fn=..., num_microbatches=...)``), as
    t5x-upstream's train script does with a gin file's ``trainer_cls``, it only records
    those settings; ``train`` / ``eval`` then refuse to run.

    Args:
      model: the model (``loss_fn``, ``eval_fn``).
      train_state: the starting state (e.g. ``t5x.train_state.FlaxOptimTrainState``).
      partitioner: e.g. ``t5x.partitioning.PjitPartitioner``.
      eval_names: the names ``eval`` will be given batches for.
      summary_dir: TensorBoard's folder (``train/``, ``training_eval/<name>/`` in it).
      train_state_axes: the state's partitioning, as the partitioner takes it.
      rng: the base key; step ``s`` trains with ``fold_in(rng, s)``.
      learning_rate_fn: ``step -> learning rate``.
      num_microbatches: gradient accumulation slices; None or 0 for none.
      weight_metrics_computer: a `WeightMetricsComputer` to add weight summaries.
    """

    def __init__(
        self,
        model: Any = None,
        train_state: Any = None,
        partitioner: Any = None,
        eval_names: Sequence[str] = (),
        summary_dir: str | None = None,
        train_state_axes: Any = None,
        rng: Any = None,
        learning_rate_fn: Callable[[Any], Any] | None = None,
        num_microbatches: int | None = None,
        weight_metrics_computer: WeightMetricsComputer | None = None,
        use_gda: bool = True,
    ) -> None:
        del use_gda  # upstream's old switch; arrays are always global here
        if num_microbatches is not None and num_microbatches < 0:
            raise ValueError(f"trainer.Trainer.num_microbatches must be >= 0 or None, got {num_microbatches}")
        self.learning_rate_fn = learning_rate_fn
        # Upstream treats 0 like None: no microbatching.
        self.num_microbatches = num_microbatches or None
        self.weight_metrics_computer = weight_metrics_computer
        if model is None:
            self._model = None
            self.train_metrics_manager = None
            self.eval_metrics_managers = {}
            return
        if learning_rate_fn is None:
            raise ValueError("trainer.Trainer needs learning_rate_fn to train (step -> learning rate)")
        super().__init__(model, train_state, partitioner, eval_names, summary_dir, train_state_axes, rng)

    def _train_step(self, train_state: Any, batch: BatchType) -> tuple[Any, Any]:
        return train_with_lr(
            train_state,
            batch,
            learning_rate=self.learning_rate_fn(train_state.step),  # type: ignore[misc]
            dropout_rng=self._get_step_rng(train_state.step),
            model=self._model,
            num_microbatches=self.num_microbatches,
            weight_metrics_computer=self.weight_metrics_computer,
            data_partition_spec=_data_partition_spec(self._partitioner),
        )

    @functools.cached_property
    def _partitioned_train_step(self) -> Callable[..., Any]:
        return self._partitioner.partition(
            self._train_step,
            in_axis_resources=(self._train_state_axes, _data_partition_spec(self._partitioner)),
            out_axis_resources=(self._train_state_axes, None),
            donate_argnums=_donate_state(),
        )

    @functools.cached_property
    def _partitioned_eval_step(self) -> Callable[..., Any]:
        return self._partitioner.partition(
            lambda train_state, batch: eval_step(self._model, train_state, batch),
            in_axis_resources=(self._train_state_axes, _data_partition_spec(self._partitioner)),
            out_axis_resources=None,
        )


def _donate_state() -> tuple[int, ...]:
    # Donating the old state saves a copy on accelerators; on CPU the caller's arrays
    # (often the very state it passed in and still reads) would be deleted for little gain.
    return () if jax.default_backend() == "cpu" else (0,)


# ---------------------------------------------------------------------------------- actions


class ActionMode(enum.Enum):
    """When an action runs (upstream's names)."""

    TRAIN = 1
    TRAIN_EVAL = 2
    INFER_EVAL = 3


class BaseAction:
    """Base of the actions upstream's train script runs after train, train-eval or infer-eval.

    Subclass it and define ``run(train_state, metrics_by_task) -> bool``
    (True stops training): t5x-launch's loop passes the train state
    (``t5x.training.TrainState``) and ``{task: {metric: value}}``, where
    values are floats (upstream passes clu values; both are accepted by the actions here).
    TRAIN-mode actions find the train metrics under ``"train"``.
    """

    takes_train_state = True  # t5x.training's loop: call run(train_state, ...), not run(step, ...)

    def run(self, train_state: Any, metrics_by_task: Any) -> bool:
        raise NotImplementedError


def _watched_value(action: Any, task: str, metric: str, metrics_by_task: Any) -> Any:
    """The watched value, or None (logged) when the task or metric is missing."""
    if task not in metrics_by_task:
        logging.warning("%s: task %s not among %s; not run", action, task, sorted(metrics_by_task))
        return None
    if metric not in metrics_by_task[task]:
        logging.warning("%s: metric %s not among %s's metrics; not run", action, metric, task)
        return None
    return metrics_by_task[task][metric]


class TerminateOnNanAction(BaseAction):
    """Stop training when ``task``'s ``metric`` is not finite (a missing metric does not stop).

    Args:
      task: the task (or ``"train"``) whose metric is watched.
      metric: the metric watched.
    """

    def __init__(self, task: str, metric: str = "loss") -> None:
        from t5x.training import TerminateOnNanAction as Impl

        self.task = task
        self.metric = metric
        self._impl = Impl(task=task, metric=metric)

    def run(self, train_state: Any, metrics_by_task: Any) -> bool:
        value = _watched_value(self, self.task, self.metric, metrics_by_task)
        if value is None:
            return False
        # A clu Scalar carries its number in `.value`; t5x-launch's loop passes floats.
        return self._impl.run(0, {self.task: {self.metric: value}})

    def __str__(self) -> str:
        return str(self._impl)


class EarlyStoppingAction(BaseAction):
    """Stops when ``metric`` has not improved over its last ``patience`` values.

    The last ``patience`` values are kept (at least two); training stops once none of
    them improved on the one before by more than ``atol + rtol * |previous|`` (upstream's
    rule). A NaN never counts as an improvement. Values must be clu ``Scalar``s or floats
    (anything else, e.g. an int, is logged and ignored, as upstream does).

    Args:
      metric: ``(task, metric name)``.
      mode: ``"min"`` (lower is better) or ``"max"``.
      patience: how many values the window holds.
      atol: absolute tolerance of an improvement.
      rtol: relative tolerance, times the previous value.
    """

    def __init__(
        self, metric: tuple[str, str], mode: str, patience: int = 3, atol: float = 0.0, rtol: float = 0.0
    ) -> None:
        if mode not in ("min", "max"):
            raise ValueError(f"EarlyStoppingAction.mode must be 'min' or 'max', got {mode!r}")
        if atol < 0 or rtol < 0:
            raise ValueError(f"EarlyStoppingAction atol and rtol must be >= 0, got {atol}, {rtol}")
        if patience < 1:
            raise ValueError(f"EarlyStoppingAction.patience must be >= 1, got {patience}")
        self.metric = tuple(metric)
        self.mode = mode
        self.patience = patience
        self.atol = atol
        self.rtol = rtol
        self.history: list[float] = []

    def _improves(self, current: float, previous: float) -> bool:
        margin = self.atol + self.rtol * abs(previous)
        if self.mode == "min":
            return current < previous - margin
        return current > previous + margin

    def run(self, train_state: Any, metrics_by_task: Any) -> bool:
        task, name = self.metric
        value = _as_float(_watched_value(self, task, name, metrics_by_task))
        if value is None:
            return False
        window = max(self.patience, 2)
        self.history = [*self.history, value][-window:]
        if len(self.history) < window:
            return False
        pairs = zip(self.history[1:], self.history[:-1], strict=True)
        return not any(self._improves(current, previous) for current, previous in pairs)

    def __str__(self) -> str:
        return f"EarlyStoppingAction({'/'.join(self.metric)}, mode={self.mode}, last values {self.history})"


def _as_float(value: Any) -> float | None:
    """A clu Scalar's or a float's number; None for anything else (logged)."""
    if value is None:
        return None
    if clu_values is not None and isinstance(value, clu_values.Scalar):
        value = value.value
    elif not isinstance(value, (float, np.floating)):
        logging.warning("EarlyStoppingAction: %r is neither a clu Scalar nor a float; not run", value)
        return None
    return float(np.asarray(value).reshape(()))


__all__ = [
    "ActionMode",
    "BaseAction",
    "BaseTrainer",
    "EarlyStoppingAction",
    "MetricsManager",
    "PreemptionError",
    "TerminateOnNanAction",
    "Trainer",
    "WeightMetricsComputer",
    "accumulate_grads_microbatched",
    "apply_grads",
    "as_metric_objects",
    "eval_step",
    "merge_metrics",
    "train_with_lr",
]
