"""Evaluator: run a model's predict/score callables over a task's eval split and compute its metrics."""

from __future__ import annotations

import concurrent.futures
import inspect
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from t5x.interfaces import ShardInfo
from t5x.tasks._lazy_tf import tf
from t5x.tasks._loggers import Logger
from t5x.tasks._registry import get_mixture_or_task, get_subtasks
from t5x.tasks._task import Task

_log = logging.getLogger("t5x.tasks.evaluation")

Batch = Mapping[str, np.ndarray]
PredictFn = Callable[[Batch], Sequence[Sequence[int]]]
ScoreFn = Callable[[Batch], Sequence[float]]
PredictWithAuxFn = Callable[[Batch], tuple[Sequence[Sequence[int]], Mapping[str, Sequence[Any]]]]
GatherFn = Callable[[list[tuple[int, Any]]], list[tuple[int, Any]]]


# seqio's ModelOutputType values (the core takes metric objects duck-typed, without importing seqio).
_PREDICTION, _SCORE, _PREDICTION_WITH_AUX = 1, 2, 3


def _metric_objects(task: Task) -> list[Any]:
    """A task's metric objects beyond its metric functions (seqio's ``metric_objs=``), or none."""
    return list(getattr(task, "extra_metric_objs", None) or ())


def _object_kinds(task: Task) -> set[int]:
    return {int(obj.model_output_type) for obj in _metric_objects(task)}


def _as_text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _accepts(fn: Callable[..., Any], name: str) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


class _TaskData:
    """One task's cached eval examples, postprocessed targets and model-feature rows."""

    def __init__(
        self, task: Task, examples: list[dict[str, Any]], targets: list[Any], rows: list[dict[str, Any]]
    ):
        self.task, self.examples, self.targets, self.rows = task, examples, targets, rows


class Evaluator:
    """Evaluates a task or mixture with framework-agnostic predict / score callables (seqio's Evaluator).

    Eval examples are read once (never packed, never shuffled unless asked),
    converted to model features, and fed to the callables in batches of
    ``batch_size`` rows; the last batch is padded with all-zero rows so that
    every call sees the same shape, and padded rows' outputs are dropped.
    With ``shard_info`` this host feeds only examples ``index::num_shards``
    (every host makes the same number of calls) and ``gather_fn`` collects the
    ``(example index, output)`` pairs of all hosts; outputs are then put back
    in dataset order by index.

    Args:
      mixture_or_task_name: a registered name, or a Task / Mixture.
      feature_converter: turns task features into model features; must not pack.
      eval_split: the split to evaluate.
      use_cached: read the task's offline cache.
      seed: seed of the eval dataset (random preprocessors, shuffling).
      sequence_length: task feature lengths; None uses each task's longest example.
      num_examples: evaluate at most this many examples per task.
      shuffle: shuffle the eval examples (once, with ``seed``).
      logger_cls: Logger classes, each constructed with ``output_dir=log_dir``.
      log_dir: where loggers write.
      use_memory_cache: keep the examples in memory between ``evaluate`` calls
        (False re-reads them each call).
      target_field_name: the task feature holding targets.
      batch_size: rows per call of the callables (per host).
      shard_info: this host's share of the examples (None: all of them).
      gather_fn: with ``shard_info``, an all-gather of ``(index, output)`` lists
        across hosts.

    Raises:
      ValueError: a packing feature converter, or ``shard_info`` without ``gather_fn``.
    """

    def __init__(
        self,
        mixture_or_task_name: str | Any,
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
        target_field_name: str = "targets",
        *,
        batch_size: int = 8,
        shard_info: ShardInfo | None = None,
        gather_fn: GatherFn | None = None,
    ):
        if getattr(feature_converter, "pack", False):
            raise ValueError(
                f"Evaluator: feature_converter {type(feature_converter).__name__} packs examples; "
                "evaluation needs one example per row (construct it with pack=False)"
            )
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"Evaluator: batch_size must be a positive int, got {batch_size!r}")
        if shard_info is not None and shard_info.num_shards > 1 and gather_fn is None:
            raise ValueError(
                "Evaluator: shard_info with several shards needs gather_fn to collect all hosts' outputs"
            )
        provider = (
            get_mixture_or_task(mixture_or_task_name)
            if isinstance(mixture_or_task_name, str)
            else mixture_or_task_name
        )
        self._feature_converter = feature_converter
        self._split = eval_split
        self._use_cached, self._seed, self._shuffle = use_cached, seed, shuffle
        self._sequence_length = dict(sequence_length) if sequence_length else None
        self._num_examples = num_examples
        self._use_memory_cache = use_memory_cache
        self._target_field = target_field_name
        self._batch_size = batch_size
        self._shard_info = shard_info
        self._gather_fn = gather_fn
        self._loggers = [cls(output_dir=log_dir) for cls in logger_cls]
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="t5x-eval-metrics"
        )
        self._tasks: list[Task] = []
        for task in get_subtasks(provider):
            if eval_split not in task.splits:
                _log.info("Evaluator: skipping task %s, which has no split %r", task.name, eval_split)
            elif not task.metric_fns and not _metric_objects(task):
                _log.info("Evaluator: skipping task %s, which has no metric_fns", task.name)
            else:
                self._tasks.append(task)
        if not self._tasks:
            _log.warning("Evaluator: no task of %s has split %r and metric_fns", provider.name, eval_split)
        self._cache: dict[str, _TaskData] = {}
        self.last_inferences: dict[str, dict[str, list]] = {}

    @property
    def eval_tasks(self) -> list[Task]:
        """The tasks that will be evaluated."""
        return list(self._tasks)

    def cached_targets(self) -> dict[str, list[Any]]:
        """Task name -> postprocessed targets, in dataset order."""
        return {t.name: self._data(t).targets for t in self._tasks}

    def cached_examples(self) -> dict[str, list[dict[str, Any]]]:
        """Task name -> eval examples (numpy dicts of task features), in dataset order."""
        return {t.name: self._data(t).examples for t in self._tasks}

    def _data(self, task: Task) -> _TaskData:
        if task.name in self._cache:
            return self._cache[task.name]
        data = self._load(task)
        if self._use_memory_cache:
            self._cache[task.name] = data
        return data

    def _load(self, task: Task) -> _TaskData:
        ds = task.get_dataset(
            self._sequence_length,
            split=self._split,
            num_epochs=1,
            trim_output_features=True,
            use_cached=self._use_cached,
            shuffle=self._shuffle,
            seed=self._seed,
        )
        if self._num_examples is not None:
            ds = ds.take(self._num_examples)
        examples = list(ds.as_numpy_iterator())
        if not examples:
            raise ValueError(f"Evaluator: task {task.name!r} split {self._split!r} gave no examples")
        feature = task.output_features.get(self._target_field)
        if feature is None:
            raise ValueError(
                f"Evaluator: task {task.name!r} has no output feature {self._target_field!r} "
                f"(it has {', '.join(task.output_features)}); set target_field_name"
            )
        targets = []
        for ex in examples:
            text_key = f"{self._target_field}_pretokenized"
            raw = ex[text_key] if text_key in ex else ex[self._target_field]
            text = _as_text(raw) if text_key in ex else feature.vocabulary.decode([int(i) for i in raw])
            targets.append(task.postprocess_fn(text, example=ex, is_target=True))
        return _TaskData(task, examples, targets, self._model_rows(task, examples))

    def _model_rows(self, task: Task, examples: list[dict[str, Any]]) -> list[dict[str, Any]]:
        keys = [
            k for k, f in task.output_features.items() if k in examples[0] and np.ndim(examples[0][k]) == 1
        ]
        if self._sequence_length:
            lengths = {k: self._sequence_length[k] for k in keys if k in self._sequence_length}
        else:
            lengths = {k: max(1, max(len(ex[k]) for ex in examples)) for k in keys}
        signature = {k: tf.TensorSpec([None], tf.as_dtype(examples[0][k].dtype)) for k in keys}
        ds = tf.data.Dataset.from_generator(
            lambda: ({k: ex[k] for k in keys} for ex in examples), output_signature=signature
        )
        rows = list(self._feature_converter(ds, lengths).as_numpy_iterator())
        if len(rows) != len(examples):
            raise ValueError(
                f"Evaluator: feature converter {type(self._feature_converter).__name__} turned "
                f"{len(examples)} examples of task {task.name!r} into {len(rows)} rows; it must keep one row per example"
            )
        return rows

    def _run(
        self,
        fn: Callable[[Batch], Any],
        rows: list[dict[str, Any]],
        name: str,
        with_aux: bool = False,
        progress: Callable[[int, int], None] | None = None,
    ) -> list:
        """Calls ``fn`` over padded batches of this host's rows; returns outputs in dataset order.

        ``progress(rows done, rows)`` is called after each batch, counting this host's real rows.
        """
        n, shard = len(rows), self._shard_info or ShardInfo(0, 1)
        local = list(range(shard.index, n, shard.num_shards))
        per_host = math.ceil(n / shard.num_shards)
        num_batches = math.ceil(per_host / self._batch_size)
        padded = local + [-1] * (num_batches * self._batch_size - len(local))
        zeros = {k: np.zeros_like(v) for k, v in rows[0].items()}
        pairs: list[tuple[int, Any]] = []
        for b in range(num_batches):
            indices = padded[b * self._batch_size : (b + 1) * self._batch_size]
            batch = {k: np.stack([rows[i][k] if i >= 0 else zeros[k] for i in indices]) for k in zeros}
            out = fn(batch)
            if with_aux:
                out, aux = out
                aux_rows = [{k: v[j] for k, v in aux.items()} for j in range(len(indices))]
                out = list(zip(list(out), aux_rows, strict=True))
            if len(out) != len(indices):
                raise ValueError(
                    f"Evaluator: {name} returned {len(out)} outputs for a batch of {len(indices)} rows; "
                    "it must return one per row (padding rows included)"
                )
            pairs.extend((i, o) for i, o in zip(indices, out, strict=True) if i >= 0)
            if progress is not None:
                progress(min((b + 1) * self._batch_size, len(local)), len(local))
        if self._gather_fn is not None:
            pairs = list(self._gather_fn(pairs))
        got = sorted(i for i, _ in pairs)
        if got != list(range(n)):
            raise ValueError(
                f"Evaluator: {name} outputs cover examples {got[:10]}... but expected each of 0..{n - 1} once"
            )
        return [o for _, o in sorted(pairs, key=lambda p: p[0])]

    def evaluate(
        self,
        *,
        compute_metrics: bool,
        step: int | None = None,
        predict_fn: PredictFn | None = None,
        score_fn: ScoreFn | None = None,
        predict_with_aux_fn: PredictWithAuxFn | None = None,
        on_batch: Callable[[str, str, int, int], None] | None = None,
    ) -> concurrent.futures.Future | None:
        """Runs the callables over every eval task and (optionally) computes metrics.

        Args:
          compute_metrics: compute and log metrics (False: only run the model,
            e.g. on hosts other than the one that reports).
          step: the training step, for the loggers.
          predict_fn: batch (dict of ``[batch, length]`` arrays) -> token ids
            of one prediction per row.
          score_fn: batch -> one float (log-likelihood of the targets) per row.
          predict_with_aux_fn: batch -> (token ids per row, {name: [batch, ...]});
            replaces ``predict_fn`` and passes the aux values to metric
            functions that accept ``aux_values``.
          on_batch: called as ``on_batch(task name, "predict" or "score",
            rows done, rows)`` after each call of a callable (for progress
            lines; rows are this host's, padding left out).

        The postprocessed predictions, scores and aux values of the last call
        stay in ``last_inferences`` (task name -> ``"predictions"`` /
        ``"scores"`` / ``"aux_values"`` -> one entry per example).

        Returns:
          a Future of ``{task name: {metric: value}}`` computed and logged in a
          background thread (``.result()`` waits and re-raises errors), or None
          when ``compute_metrics`` is False.

        Raises:
          ValueError: a task needs a callable that was not given.
        """
        outputs: dict[str, dict[str, list]] = {}
        for task in self._tasks:
            data = self._data(task)
            inferences: dict[str, list] = {}

            def progress(kind: str, name: str = task.name) -> dict[str, Any]:
                # Only when asked: subclasses (seqio's) override _run without the keyword.
                if on_batch is None:
                    return {}
                return {"progress": lambda done, total: on_batch(name, kind, done, total)}

            kinds = _object_kinds(task)
            if _PREDICTION_WITH_AUX in kinds and predict_with_aux_fn is None:
                raise ValueError(
                    f"Evaluator: task {task.name!r} has metric objects of aux values but no predict_with_aux_fn"
                )
            if task.predict_metric_fns or kinds & {_PREDICTION, _PREDICTION_WITH_AUX}:
                if predict_with_aux_fn is not None:
                    pairs = self._run(
                        predict_with_aux_fn,
                        data.rows,
                        "predict_with_aux_fn",
                        with_aux=True,
                        **progress("predict"),
                    )
                    tokens = [p for p, _ in pairs]
                    inferences["aux_values"] = [a for _, a in pairs]
                elif predict_fn is not None:
                    tokens = self._run(predict_fn, data.rows, "predict_fn", **progress("predict"))
                else:
                    raise ValueError(
                        f"Evaluator: task {task.name!r} has prediction metrics but no predict_fn was given"
                    )
                if kinds & {_PREDICTION, _PREDICTION_WITH_AUX}:
                    inferences["tokens"] = list(tokens)  # raw ids, for the metric objects
                vocab = task.output_features[self._target_field].vocabulary
                inferences["predictions"] = [
                    task.postprocess_fn(
                        vocab.decode([int(i) for i in np.asarray(t).reshape(-1)]), example=ex, is_target=False
                    )
                    for t, ex in zip(tokens, data.examples, strict=True)
                ]
            if task.score_metric_fns or _SCORE in kinds:
                if score_fn is None:
                    raise ValueError(
                        f"Evaluator: task {task.name!r} has score metrics but no score_fn was given"
                    )
                scores = self._run(score_fn, data.rows, "score_fn", **progress("score"))
                inferences["scores"] = [float(s) for s in scores]
            outputs[task.name] = inferences
        self.last_inferences = outputs
        if not compute_metrics:
            return None
        return self._executor.submit(self._compute_and_log, step, outputs)

    def _compute_and_log(
        self, step: int | None, outputs: dict[str, dict[str, list]]
    ) -> dict[str, dict[str, Any]]:
        results: dict[str, dict[str, Any]] = {}
        for task in self._tasks:
            data, inferences = self._data(task), outputs[task.name]
            metrics: dict[str, Any] = {}
            for fn in task.predict_metric_fns:
                kwargs = {}
                if "aux_values" in inferences and _accepts(fn, "aux_values"):
                    kwargs["aux_values"] = inferences["aux_values"]
                metrics.update(_check_result(fn, fn(data.targets, inferences["predictions"], **kwargs), task))
            for fn in task.score_metric_fns:
                metrics.update(_check_result(fn, fn(data.targets, scores=inferences["scores"]), task))
            for obj in _metric_objects(task):
                metrics.update(_check_result(obj, self._compute_object(obj, task, data, inferences), task))
            shown = {k: v for k, v in inferences.items() if k != "tokens"}
            for logger in self._loggers:
                logger(task.name, step, metrics, data.examples, shown, data.targets)
            results[task.name] = metrics
        return results

    def _compute_object(self, obj: Any, task: Task, data: _TaskData, inferences: dict[str, list]) -> Any:
        """One metric object's values (seqio's protocol: ``from_model_output`` then compute)."""
        kind = int(obj.model_output_type)
        if kind == _SCORE:
            output: Any = np.array(inferences["scores"])
        elif kind == _PREDICTION_WITH_AUX:
            aux = inferences["aux_values"]
            output = (np.array(inferences["tokens"]), {k: np.array([a[k] for a in aux]) for k in aux[0]})
        else:
            output = np.array(inferences["tokens"])
        built = obj.from_model_output(data.examples, output, task.output_features, self._target_field)
        if hasattr(built, "actual_compute"):  # seqio's collecting metrics
            return built.actual_compute(data.examples, task.output_features, self._target_field)[0]
        return built.compute()

    def close(self) -> None:
        """Waits for pending metric computations and stops the background thread."""
        self._executor.shutdown(wait=True)


def _check_result(fn: Callable[..., Any], result: Any, task: Task) -> Mapping[str, Any]:
    if not isinstance(result, Mapping):
        raise TypeError(
            f"Evaluator: metric function {getattr(fn, '__name__', fn)!r} of task {task.name!r} "
            f"must return a dict of metric name -> value, got {type(result).__name__}"
        )
    return result
