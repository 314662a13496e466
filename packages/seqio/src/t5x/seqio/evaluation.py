"""``seqio.evaluation``: the Evaluator with seqio's calling convention, and the loggers.

seqio calls ``predict_fn(dataset[, model_feature_lengths])`` once per task with
the whole eval set (a dataset of ``(index, model features)``) and expects
``[(index, output), ...]`` back; ``evaluate`` returns ``(metrics future,
{task: {ModelOutputType: outputs}})``. The core ``t5x.tasks.Evaluator`` instead
calls ``predict_fn(batch)`` on padded fixed-size batches (what compiled model
steps want) and returns the future alone. This class accepts seqio-style
callables and returns seqio's tuple.
"""

from __future__ import annotations

import concurrent.futures
import inspect
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from t5x import tasks as _core
from t5x.seqio.feature_converters import EncDecFeatureConverter, FeatureConverter
from t5x.seqio.loggers import JSONLogger, Logger, PyLoggingLogger, TensorBoardLogger
from t5x.seqio.metrics import ModelOutputType

# seqio's type names for what the model callables take and return.
PredictFnCallable = Callable[..., Any]
ScoreFnCallable = Callable[..., Any]
PredictFnReturnType = (
    Sequence[tuple[int, Sequence[int]]] | tuple[Sequence[tuple[int, Sequence[int]]], Mapping]
)
ScoreFnReturnType = Sequence[tuple[int, float]] | tuple[Sequence[tuple[int, float]], Mapping]
AllOutputTokensType = Mapping[str, Sequence[Sequence[int]]]
AllOutputScoresType = Any
TaskMetricsType = MutableMapping[str, Any]
AllMetricsType = MutableMapping[str, TaskMetricsType]

_OUTPUT_TYPES = {
    "predict_fn": ModelOutputType.PREDICTION,
    "score_fn": ModelOutputType.SCORE,
    "predict_with_aux_fn": ModelOutputType.PREDICTION_WITH_AUX,
}


class _SeqioStyle:
    """Marks a callable as taking (dataset[, model_feature_lengths]) -> [(index, output)]."""

    def __init__(self, fn: Callable[..., Any], lengths: Any):
        self.fn, self.lengths = fn, lengths

    def __call__(self, ds: tf.data.Dataset) -> Any:
        try:
            takes_lengths = "model_feature_lengths" in inspect.signature(self.fn).parameters
        except (TypeError, ValueError):
            takes_lengths = False
        return self.fn(ds, model_feature_lengths=self.lengths) if takes_lengths else self.fn(ds)


class Evaluator(_core.Evaluator):
    """seqio's Evaluator: same constructor, seqio-style ``predict_fn`` / ``score_fn``."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._outputs: dict[str, Any] = {}

    def _rows_owner(self, rows: list[dict[str, Any]]) -> str:
        for task in self._tasks:
            if self._data(task).rows is rows:
                return task.name
        return ""

    @property
    def cached_model_datasets(self) -> dict[str, tf.data.Dataset]:
        """Task name -> dataset of ``(index, model features)``, what seqio-style callables get."""
        return {task.name: self._indexed(self._data(task).rows) for task in self._tasks}

    @staticmethod
    def _indexed(rows: list[dict[str, Any]]) -> tf.data.Dataset:
        columns = {k: np.stack([r[k] for r in rows]) for k in rows[0]} if rows else {}
        return tf.data.Dataset.from_tensor_slices(columns).enumerate()

    def _run(
        self, fn: Any, rows: list[dict[str, Any]], name: str, with_aux: bool = False, progress: Any = None
    ) -> list:
        if not isinstance(fn, _SeqioStyle):
            return super()._run(fn, rows, name, with_aux, progress)
        result = fn(self._indexed(rows))
        aux: Any = None
        if with_aux:
            if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[1], Mapping)):
                raise ValueError(f"Evaluator: {name} must return ([(index, tokens), ...], {{name: values}})")
            result, aux = result
        pairs = list(result)
        if pairs and (not isinstance(pairs[0], (tuple, list)) or len(pairs[0]) != 2):
            raise ValueError(
                f"Evaluator: {name} must return a sequence of (index, output) pairs, got {pairs[0]!r}"
            )
        order = sorted(range(len(pairs)), key=lambda i: int(pairs[i][0]))
        outputs = [pairs[i][1] for i in order]
        if len(outputs) != len(rows):
            raise ValueError(f"Evaluator: {name} returned {len(outputs)} outputs for {len(rows)} examples")
        owner = self._rows_owner(rows)
        if aux is not None:
            sorted_aux = {k: [list(v)[i] for i in order] for k, v in aux.items()}
            self._outputs[f"{name}:{owner}"] = (outputs, sorted_aux)
            return [(o, {k: v[j] for k, v in sorted_aux.items()}) for j, o in enumerate(outputs)]
        self._outputs[f"{name}:{owner}"] = outputs
        return outputs

    def evaluate(  # type: ignore[override]
        self,
        *,
        compute_metrics: bool,
        step: int | None = None,
        predict_fn: PredictFnCallable | None = None,
        score_fn: ScoreFnCallable | None = None,
        predict_with_aux_fn: PredictFnCallable | None = None,
    ) -> tuple[concurrent.futures.Future, dict[str, dict[ModelOutputType, Any]]]:
        """Runs the callables over every task; returns ``(metrics future, all outputs)``, as seqio.

        The future's result is ``{task: {metric: value}}`` (None when
        ``compute_metrics`` is False); the outputs are ``{task: {ModelOutputType:
        outputs in example order}}`` (for PREDICTION_WITH_AUX, ``(tokens, aux)``).
        """
        lengths = getattr(self, "model_feature_lengths", None)
        wrap = lambda f: None if f is None else _SeqioStyle(f, lengths)  # noqa: E731
        self._outputs = {}
        future = super().evaluate(
            compute_metrics=compute_metrics,
            step=step,
            predict_fn=wrap(predict_fn),
            score_fn=wrap(score_fn),
            predict_with_aux_fn=wrap(predict_with_aux_fn),
        )
        if future is None:
            future = concurrent.futures.Future()
            future.set_result(None)
        all_output: dict[str, dict[ModelOutputType, Any]] = {}
        for key, outputs in self._outputs.items():
            fn_name, task_name = key.split(":", 1)
            all_output.setdefault(task_name, {})[_OUTPUT_TYPES[fn_name]] = outputs
        return future, all_output


def get_valid_eval_tasks(tasks: Sequence[Any], split: str) -> list[Any]:
    """The tasks that have ``split`` and at least one metric function (or metric object)."""
    return [
        t
        for t in tasks
        if split in t.splits and (list(getattr(t, "metric_fns", [])) or list(getattr(t, "metric_objs", [])))
    ]


__all__ = [
    "AllMetricsType",
    "AllOutputScoresType",
    "AllOutputTokensType",
    "EncDecFeatureConverter",
    "Evaluator",
    "FeatureConverter",
    "ModelOutputType",
    "PredictFnReturnType",
    "ScoreFnReturnType",
    "TaskMetricsType",
    "get_valid_eval_tasks",
    "JSONLogger",
    "Logger",
    "PredictFnCallable",
    "PyLoggingLogger",
    "ScoreFnCallable",
    "TensorBoardLogger",
]
