"""``seqio.evaluation``: seqio's Evaluator, MetricManager and helpers, on the t5x data packages.

seqio's calling convention differs from the core ``t5x.tasks.Evaluator``
(which ``t5x-launch eval`` and the trainer use): seqio caches each task's
examples as a ``tf.data`` dataset (``cached_task_datasets``) and its model
features enumerated (``cached_model_datasets``), hands a model callable the
whole enumerated dataset and expects ``[(index, output), ...]`` back, computes
metrics through each task's metric objects and returns ``(metrics future,
{task: {ModelOutputType: outputs}})``. The core instead feeds fixed-size padded
batches (what compiled steps want). This module keeps seqio's shape, state
and names so seqio code (and code that reaches into an Evaluator's cached
datasets) runs unchanged.
"""

from __future__ import annotations

import collections
import concurrent.futures
import functools
import inspect
import itertools
import logging
import time
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from t5x.seqio import dataset_providers
from t5x.seqio import metrics as metrics_lib
from t5x.seqio.feature_converters import EncDecFeatureConverter, FeatureConverter
from t5x.seqio.loggers import JSONLogger, Logger, PyLoggingLogger, TensorBoardLogger
from t5x.seqio.metrics import ModelOutputType

_log = logging.getLogger("t5x.seqio.evaluation")

Task = dataset_providers.Task

# seqio's type names for what the model callables take and return.
PredictFnCallable = Callable[..., Any]
ScoreFnCallable = Callable[..., Any]
ModelFnCallable = Callable[..., Any]
PredictFnReturnType = (
    Sequence[tuple[int, Sequence[int]]] | tuple[Sequence[tuple[int, Sequence[int]]], Mapping]
)
ScoreFnReturnType = Sequence[tuple[int, float]] | tuple[Sequence[tuple[int, float]], Mapping]
ModelFnReturnType = PredictFnReturnType | ScoreFnReturnType
AllOutputTokensType = Mapping[str, Sequence[Sequence[int]]]
AllOutputScoresType = Any
AllOutputAuxValuesType = Mapping[str, Mapping[str, Sequence[Any]]]
TaskMetricsType = MutableMapping[str, Any]
AllMetricsType = MutableMapping[str, TaskMetricsType]
MetricsAndOutputsType = tuple[concurrent.futures.Future, Any]


def get_valid_eval_tasks(tasks: Sequence[Any], split: str) -> list[Any]:
    """The tasks that have ``split`` and at least one metric function or metric object."""
    valid = []
    for task in tasks:
        if split not in task.splits:
            _log.info("Task %s has no %r split; skipping eval.", task.name, split)
        elif not task.metric_fns and not getattr(task, "metric_objs", None):
            _log.info("Task %s has no metrics defined; skipping eval.", task.name)
        else:
            valid.append(task)
    return valid


def _metric_objs(task: Any) -> list[Any]:
    """A task's metric objects; a core ``t5x.tasks.Task`` (which has none) gets seqio's wrapping."""
    objs = getattr(task, "metric_objs", None)
    if objs is not None:
        return list(objs)
    post = getattr(task, "_postprocess_fn", None)
    return [metrics_lib.PassthroughLegacyMetric.from_metric_fn(fn, post).empty() for fn in task.metric_fns]


def _feature_length(value: Any, axis: int) -> int:
    if hasattr(value, "row_splits"):  # a ragged value: its longest row
        return int(np.max(np.diff(np.asarray(value.row_splits)), initial=0))
    return int(np.shape(value)[axis])


def _cache_and_measure_examples(
    tasks: Sequence[Any],
    dataset_fn: Callable[[Any], tf.data.Dataset],
    sequence_dims: Mapping[str, int],
    num_examples: int | None = None,
    use_memory_cache: bool = True,
) -> tuple[dict[str, tf.data.Dataset], dict[str, int]]:
    """Each task's eval dataset (cardinality set, cached in memory if asked) and the longest feature lengths.

    Lengths are measured along each feature's ``sequence_dims`` axis (0 when
    not given) over every task; all tasks must have the same output features.
    """
    names = list(tasks[0].output_features)
    for task in tasks:
        if set(task.output_features) != set(names):
            raise ValueError(
                f"Evaluator: all tasks must have the same output features; {task.name!r} has "
                f"{sorted(task.output_features)}, {tasks[0].name!r} has {sorted(names)}"
            )
    longest = dict.fromkeys(names, 0)
    datasets: dict[str, tf.data.Dataset] = {}
    for task in tasks:
        ds = dataset_fn(task)
        if num_examples:
            ds = ds.take(num_examples)
        if use_memory_cache:
            ds = ds.cache()
        count = 0
        for ex in ds.as_numpy_iterator():
            for k in names:
                longest[k] = max(longest[k], _feature_length(ex[k], sequence_dims.get(k, 0)))
            count += 1
        datasets[task.name] = ds.apply(tf.data.experimental.assert_cardinality(count))
    return datasets, longest


def _index_output_pairs(result: Any, what: str) -> list[tuple[Any, Any]]:
    pairs = list(result)
    for pair in pairs[:1]:
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise ValueError(
                f"Evaluator: {what} must return a sequence of (index, output) pairs, got {pair!r}"
            )
    return pairs


def _permute(values: Any, order: np.ndarray) -> Any:
    if isinstance(values, Mapping):
        return {k: _permute(v, order) for k, v in values.items()}
    items = list(values)
    return [items[i] for i in order]


def _extract_model_output(cached_model_dataset: tf.data.Dataset, model_fn: ModelFnCallable, what: str) -> Any:
    """Calls ``model_fn`` on the enumerated dataset; its outputs back in example order.

    ``[(index, output), ...]`` gives a list; ``([(index, output), ...],
    {name: per-example values})`` (aux values, score intermediates) gives
    ``(list, {name: list})``, both ordered by index.
    """
    result = model_fn(cached_model_dataset)
    if isinstance(result, tuple) and len(result) == 2 and isinstance(result[1], Mapping):
        pairs, extra = _index_output_pairs(result[0], what), result[1]
        order = np.argsort([int(i) for i, _ in pairs], kind="stable")
        return [pairs[i][1] for i in order], _permute(extra, order)
    pairs = _index_output_pairs(result, what)
    return [out for _, out in sorted(pairs, key=lambda p: int(p[0]))]


def _as_arrays(model_output: Any) -> Any:
    """What metric objects receive: arrays (aux / intermediate lists too)."""
    if isinstance(model_output, tuple):
        main, extra = model_output
        return np.array(main), {k: np.array(v) if isinstance(v, list) else v for k, v in extra.items()}
    return np.array(model_output)


_FN_NAMES = {
    ModelOutputType.PREDICTION: "predict_fn",
    ModelOutputType.SCORE: "score_fn",
    ModelOutputType.PREDICTION_WITH_AUX: "predict_with_aux_fn",
    ModelOutputType.SCORE_WITH_INTERMEDIATES: "model_fns[SCORE_WITH_INTERMEDIATES]",
}


class Evaluator:
    """seqio's Evaluator: caches a task's or mixture's eval data once, evaluates model callables on it.

    Args:
      mixture_or_task_name: a registered task or mixture name (or the object).
      feature_converter: task features -> model features; must not pack.
      eval_split: the split to evaluate.
      use_cached: read the tasks' offline caches.
      seed: seed of the eval datasets (shuffling, random preprocessors).
      sequence_length: task feature lengths; None (or a missing feature) uses
        the longest example. Needed when a preprocessor requires it.
      num_examples: at most this many examples per task.
      shuffle: shuffle the examples (once, with ``seed``).
      logger_cls: Logger classes, each built as ``cls(output_dir=log_dir)``.
      log_dir: where loggers write; required with ``logger_cls``.
      use_memory_cache: cache the eval datasets in memory.
      async_compute_metrics: compute metrics on a background thread.
      target_field_name: the feature holding targets.

    Raises:
      ValueError: a preprocessor needs ``sequence_length`` and none is given,
        ``logger_cls`` without ``log_dir``, or a packing converter.
    """

    def __init__(
        self,
        mixture_or_task_name: Any,
        feature_converter: Any,
        eval_split: str = "validation",
        use_cached: bool = False,
        seed: int | None = 42,
        sequence_length: Mapping[str, int] | None = None,
        num_examples: int | None = None,
        shuffle: bool = False,
        logger_cls: Sequence[type[Logger]] = (),
        log_dir: str | None = None,
        use_memory_cache: bool = True,
        async_compute_metrics: bool = True,
        target_field_name: str = "targets",
    ):
        provider = (
            dataset_providers.get_mixture_or_task(mixture_or_task_name)
            if isinstance(mixture_or_task_name, str)
            else mixture_or_task_name
        )
        self._eval_tasks = get_valid_eval_tasks(dataset_providers.get_subtasks(provider), eval_split)
        self._metrics_executor = (
            concurrent.futures.ThreadPoolExecutor(max_workers=1) if async_compute_metrics else None
        )
        self._metrics_future: concurrent.futures.Future | None = None
        self._target_field_name = target_field_name
        self._cached_targets: dict[str, list[Any]] = {}
        self._cached_model_datasets: dict[str, tf.data.Dataset] = {}
        self._cached_task_datasets: dict[str, tf.data.Dataset] = {}
        self._model_feature_shapes: dict[str, tuple[int, ...]] = {}
        if logger_cls and not log_dir:
            raise ValueError("'log_dir' must be provided to `Evaluator` if `logger_cls` is non-empty.")
        self._loggers = tuple(cls(output_dir=log_dir) for cls in logger_cls)
        if not self._eval_tasks:
            _log.warning("No eval task with valid split and metric fn found. Skipping eval.")
            return
        _require_lengths_if_needed(self._eval_tasks, sequence_length)

        def dataset_fn(task: Any) -> tf.data.Dataset:
            return task.get_dataset(
                sequence_length=sequence_length,
                split=eval_split,
                shuffle=shuffle,
                num_epochs=1,
                seed=seed,
                use_cached=use_cached,
            )

        sequence_dims = {
            k: getattr(spec, "sequence_dim", 0) for k, spec in dict(feature_converter.TASK_FEATURES).items()
        }
        task_datasets, longest = _cache_and_measure_examples(
            self._eval_tasks, dataset_fn, sequence_dims, num_examples, use_memory_cache
        )
        # Given lengths win; features left out get the longest example's length.
        lengths = (
            dict(longest)
            if sequence_length is None
            else {k: sequence_length.get(k, v) for k, v in longest.items()}
        )
        if getattr(feature_converter, "pack", False):
            raise ValueError("During evaluation, packing can't be used.")
        for task in self._eval_tasks:
            # Enumerated so that outputs can be matched to examples whatever order they come back in.
            eval_ds = feature_converter(task_datasets[task.name], lengths)
            self._cached_model_datasets[task.name] = eval_ds.enumerate()
        self._cached_task_datasets = task_datasets
        self._model_feature_shapes = {
            k: tuple(spec.shape) for k, spec in eval_ds.element_spec.items() if spec.shape.rank > 0
        }

    def __del__(self) -> None:
        executor = getattr(self, "_metrics_executor", None)
        if executor is None:
            return
        try:
            executor.shutdown(wait=True)  # let pending metrics be written
        except RuntimeError:  # collected on the metrics thread itself: it cannot wait for itself
            executor.shutdown(wait=False)

    def close(self) -> None:
        """Waits for metrics still being computed."""
        if self._metrics_executor is not None:
            self._metrics_executor.shutdown(wait=True)

    # ---- seqio's attributes ----
    @property
    def eval_tasks(self) -> Sequence[Any]:
        return self._eval_tasks

    @property
    def cached_model_datasets(self) -> Mapping[str, tf.data.Dataset]:
        return self._cached_model_datasets

    @property
    def cached_task_datasets(self) -> Mapping[str, tf.data.Dataset]:
        return self._cached_task_datasets

    @property
    def cached_targets(self) -> Mapping[str, list[Any]]:
        """Task name -> postprocessed targets, in example order."""
        for task in self.eval_tasks:
            if not self._targets_of(task.name):
                examples = list(self.cached_task_datasets[task.name].as_numpy_iterator())
                self._targets()[task.name] = metrics_lib._decode_targets(
                    examples, task.output_features, self._target_field_name, task.postprocess_fn
                )
        return dict(self._targets())

    @property
    def model_feature_shapes(self) -> Mapping[str, tuple[int, ...]]:
        return self._model_feature_shapes

    @property
    def loggers(self) -> tuple[Logger, ...]:
        return tuple(self._loggers)

    def _targets(self) -> dict[str, list[Any]]:
        # Evaluators built by hand (seqio's tests set the private state) may lack the cache.
        if not hasattr(self, "_cached_targets"):
            self._cached_targets = {}
        return self._cached_targets

    def _targets_of(self, name: str) -> list[Any] | None:
        return self._targets().get(name)

    # ---- evaluation ----
    def evaluate(
        self,
        *,
        compute_metrics: bool,
        step: int | None = None,
        predict_fn: PredictFnCallable | None = None,
        score_fn: ScoreFnCallable | None = None,
        predict_with_aux_fn: PredictFnCallable | None = None,
        model_fns: Mapping[ModelOutputType, ModelFnCallable] | None = None,
    ) -> MetricsAndOutputsType:
        """Runs the callables each task's metrics need; returns ``(metrics future, outputs)``.

        Each callable gets a task's cached model dataset of ``(index, model
        features)`` and returns ``[(index, output), ...]`` (in any order), or
        for aux values / score intermediates ``([(index, output), ...],
        {name: per-example values})``. ``outputs`` is ``{task: {ModelOutputType:
        outputs in example order}}``; the future's result is ``{task: {metric:
        value}}`` (None when ``compute_metrics`` is False).
        """
        fns: dict[ModelOutputType, ModelFnCallable] = dict(model_fns or {})
        for kind, fn in (
            (ModelOutputType.PREDICTION, predict_fn),
            (ModelOutputType.SCORE, score_fn),
            (ModelOutputType.PREDICTION_WITH_AUX, predict_with_aux_fn),
        ):
            if fn:
                fns[kind] = fn
        all_output: dict[str, dict[ModelOutputType, Any]] = {}
        for task in self.eval_tasks:
            _log.info("Evaluating %s", task.name)
            outputs = all_output[task.name] = {}
            for obj in _metric_objs(task):
                kind = ModelOutputType(obj.model_output_type)
                if kind in outputs:
                    continue
                if kind not in fns:
                    raise ValueError(
                        f"Evaluator: task {task.name!r} has {kind.name} metrics but no {_FN_NAMES[kind]} was given"
                    )
                outputs[kind] = _extract_model_output(
                    self._cached_model_datasets[task.name], fns[kind], _FN_NAMES[kind]
                )
        future: concurrent.futures.Future
        if not compute_metrics:
            future = concurrent.futures.Future()
            future.set_result(None)
            return future, all_output
        if self._metrics_future is not None:
            self._metrics_future.result()  # the previous step's metrics first; re-raises their error

        def compute_all() -> AllMetricsType:
            tick = time.time()
            results: AllMetricsType = {}
            for task in self.eval_tasks:
                try:
                    results[task.name] = self._compute_clu_metrics(task, all_output[task.name], step)
                except Exception as e:
                    raise ValueError(f"Failed to evaluate task {task.name}: {e}") from e
            _log.info("Time computing metrics: %f secs.", time.time() - tick)
            return results

        executor = getattr(self, "_metrics_executor", None)
        if executor is not None:
            future = executor.submit(compute_all)
        else:
            future = concurrent.futures.Future()
            future.set_result(compute_all())
        self._metrics_future = future
        return future, all_output

    def _compute_clu_metrics(
        self, task: Any, task_output: Mapping[ModelOutputType, Any], step: int | None
    ) -> TaskMetricsType:
        """One task's metrics from its model outputs; logged by every logger."""
        dataset = self.cached_task_datasets[task.name]
        examples = list(dataset.as_numpy_iterator())
        values: list[Mapping[str, Any]] = []
        inferences: dict[str, Any] = {}
        record: dict[str, Any] | None = None
        for obj in _metric_objs(task):
            model_output = _as_arrays(task_output[ModelOutputType(obj.model_output_type)])
            instance = obj.from_model_output(
                examples, model_output, task.output_features, self._target_field_name
            )
            if isinstance(instance, metrics_lib.CollectingMetric):
                value, record = instance.actual_compute(
                    examples, task.output_features, self._target_field_name, self._targets_of(task.name)
                )
                self._targets()[task.name] = record["targets"]
            else:
                value = instance.compute()
                record = getattr(instance, "targets_and_inferences", None)
            if not isinstance(value, Mapping):
                raise TypeError(
                    f"metric {type(obj).__name__} of task {task.name!r} must give a dict of name -> value, "
                    f"got {type(value).__name__}"
                )
            values.append(value)
            for key, val in (record or {}).items():
                if key != "targets":
                    inferences[key] = val.tolist() if isinstance(val, np.ndarray) else val
        result: TaskMetricsType = {}
        for k, v in itertools.chain.from_iterable(m.items() for m in values):
            if k in result:
                raise ValueError(f"Duplicate metric key '{k}' in Task '{task.name}'.")
            result[k] = v
        as_values = {
            k: v if isinstance(v, metrics_lib.MetricValue) else metrics_lib.Scalar(v)
            for k, v in result.items()
        }
        targets = record["targets"] if record else None
        for logger in self.loggers:
            logger(
                task_name=task.name,
                step=step,
                metrics=as_values,
                dataset=dataset,
                targets=targets,
                inferences=inferences,
            )
        return result


def _require_lengths_if_needed(tasks: Sequence[Any], sequence_length: Mapping[str, int] | None) -> None:
    """seqio's rule: a preprocessor whose ``sequence_length`` has no default needs given lengths."""
    if sequence_length is not None:
        return
    for task in tasks:
        for prep in task.preprocessors:
            try:
                params = inspect.signature(prep).parameters
            except (TypeError, ValueError):
                continue
            if "sequence_length" in params and params["sequence_length"].default is inspect.Parameter.empty:
                name = (
                    prep.func.__name__
                    if isinstance(prep, functools.partial)
                    else getattr(prep, "__name__", repr(prep))
                )
                raise ValueError(
                    f"Preprocessor '{name}' in task '{task.name}' has a `sequence_length` argument, making it "
                    "incompatible with automatic sequence length detection. Pass a valid `sequence_length` to "
                    "`Evaluator` and try again."
                )


# ---- metric objects accumulated batch by batch ----------------------------------------------------


class MetricCollection:
    """Named metrics updated together (clu's ``Collection``, without JAX).

    ``create(**{name: MetricClass})`` gives a collection class;
    ``empty()`` / ``single_from_model_output(**kwargs)`` build instances, whose
    metrics are attributes; ``merge`` merges name by name; ``compute`` gives
    ``{name: metric.compute()}``.
    """

    _metric_classes: Mapping[str, type] = {}

    def __init__(self, **metrics: Any):
        for name, metric in metrics.items():
            setattr(self, name, metric)

    @classmethod
    def create(cls, **metric_classes: type) -> type[MetricCollection]:
        return type("MetricCollection", (cls,), {"_metric_classes": dict(metric_classes)})

    @classmethod
    def empty(cls) -> MetricCollection:
        return cls(**{name: m.empty() for name, m in cls._metric_classes.items()})  # type: ignore[attr-defined]

    @classmethod
    def single_from_model_output(cls, **kwargs: Any) -> MetricCollection:
        return cls(**{name: m.from_model_output(**kwargs) for name, m in cls._metric_classes.items()})  # type: ignore[attr-defined]

    def merge(self, other: MetricCollection) -> MetricCollection:
        return type(self)(
            **{name: getattr(self, name).merge(getattr(other, name)) for name in self._metric_classes}
        )

    def reduce(self) -> MetricCollection:
        return type(self)(**{name: getattr(self, name).reduce() for name in self._metric_classes})

    def compute(self) -> dict[str, Any]:
        return {name: getattr(self, name).compute() for name in self._metric_classes}


class MetricManager:
    """Per task and model output type, a collection of the task's metric objects updated batch by batch.

    Metrics are named ``<class name>_<position in task.metric_objs>``.
    ``host_gather_and_reduce`` gathers with ``gather_fn`` (collection ->
    collection across hosts); without one it is a single-host reduce, as no
    JAX is imported here to all-gather.
    """

    def __init__(
        self, tasks: Sequence[Any], gather_fn: Callable[[MetricCollection], MetricCollection] | None = None
    ):
        self.metric_registry: dict[str, dict[ModelOutputType, type[MetricCollection]]] = (
            collections.defaultdict(dict)
        )
        self.output_metrics_collections: dict[str, dict[ModelOutputType, MetricCollection]] = (
            collections.defaultdict(dict)
        )
        self._gather_fn = gather_fn
        for task in tasks:
            by_type: dict[ModelOutputType, dict[str, type]] = collections.defaultdict(dict)
            for idx, obj in enumerate(_metric_objs(task)):
                by_type[ModelOutputType(obj.model_output_type)][f"{type(obj).__name__}_{idx}"] = type(obj)
            for kind, classes in by_type.items():
                self.metric_registry[task.name][kind] = MetricCollection.create(**classes)

    def initialize_metrics(self, task_name: str, model_output_type: ModelOutputType) -> None:
        """Starts (or restarts) the task's metrics of this output type from empty."""
        self.output_metrics_collections[task_name][model_output_type] = self._registered(
            task_name, model_output_type
        ).empty()

    def from_model_output(
        self,
        task_name: str,
        model_output_type: ModelOutputType,
        inputs: Sequence[Mapping[str, Any]],
        model_output: Any,
        features: Mapping[str, Any],
        target_field_name: str = "targets",
        mask: np.ndarray | None = None,
        indices_2d: np.ndarray | None = None,
    ) -> MetricCollection:
        """One batch's metrics of the task for this output type."""
        return self._registered(task_name, model_output_type).single_from_model_output(
            inputs=inputs,
            model_output=model_output,
            features=features,
            target_field_name=target_field_name,
            mask=mask,
            indices_2d=indices_2d,
        )

    def merge(
        self, metrics_collection: MetricCollection, task_name: str, model_output_type: ModelOutputType
    ) -> None:
        """Accumulates one batch's metrics into the task's running ones."""
        current = self.output_metrics_collections[task_name][model_output_type]
        self.output_metrics_collections[task_name][model_output_type] = current.merge(metrics_collection)

    def host_gather_and_reduce(self, task_name: str, model_output_type: ModelOutputType) -> None:
        current = self.output_metrics_collections[task_name][model_output_type]
        gathered = self._gather_fn(current) if self._gather_fn is not None else current
        self.output_metrics_collections[task_name][model_output_type] = gathered.reduce()

    def _registered(self, task_name: str, kind: ModelOutputType) -> type[MetricCollection]:
        try:
            return self.metric_registry[task_name][kind]
        except KeyError:
            known = {t: [k.name for k in kinds] for t, kinds in self.metric_registry.items()}
            raise ValueError(
                f"MetricManager: no metrics of type {ModelOutputType(kind).name} for task {task_name!r}; "
                f"registered: {known}"
            ) from None


__all__ = [
    "AllMetricsType",
    "AllOutputAuxValuesType",
    "AllOutputScoresType",
    "AllOutputTokensType",
    "EncDecFeatureConverter",
    "Evaluator",
    "FeatureConverter",
    "JSONLogger",
    "Logger",
    "MetricCollection",
    "MetricManager",
    "MetricsAndOutputsType",
    "ModelFnCallable",
    "ModelOutputType",
    "PredictFnCallable",
    "PredictFnReturnType",
    "PyLoggingLogger",
    "ScoreFnCallable",
    "ScoreFnReturnType",
    "TaskMetricsType",
    "get_valid_eval_tasks",
    "TensorBoardLogger",
]
