"""``seqio.evaluation``: the Evaluator with seqio's calling convention, and the loggers.

seqio calls ``predict_fn(dataset[, model_feature_lengths])`` once per task with
the whole eval set (a dataset of ``(index, model features)``) and expects
``[(index, output), ...]`` back; ``evaluate`` returns ``(metrics future,
tokens by task, scores by task)``. The core ``t5x.tasks.Evaluator`` instead
calls ``predict_fn(batch)`` on padded fixed-size batches (what compiled model
steps want) and returns the future alone. This class accepts seqio-style
callables and returns seqio's tuple.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf

from t5x import tasks as _core
from t5x.tasks import JSONLogger, Logger, PyLoggingLogger, TensorBoardLogger

PredictFnCallable = Callable[..., Any]
ScoreFnCallable = Callable[..., Any]


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
        self._outputs: dict[str, list[Any]] = {}

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

    def _run(self, fn: Any, rows: list[dict[str, Any]], name: str, with_aux: bool = False) -> list:
        if not isinstance(fn, _SeqioStyle):
            return super()._run(fn, rows, name, with_aux)
        pairs = list(fn(self._indexed(rows)))
        if pairs and (not isinstance(pairs[0], (tuple, list)) or len(pairs[0]) != 2):
            raise ValueError(
                f"Evaluator: {name} must return a sequence of (index, output) pairs, got {pairs[0]!r}"
            )
        outputs = [o for _, o in sorted(pairs, key=lambda p: int(p[0]))]
        if len(outputs) != len(rows):
            raise ValueError(f"Evaluator: {name} returned {len(outputs)} outputs for {len(rows)} examples")
        self._outputs[f"{name}:{self._rows_owner(rows)}"] = outputs
        return outputs

    def evaluate(  # type: ignore[override]
        self,
        *,
        compute_metrics: bool,
        step: int | None = None,
        predict_fn: PredictFnCallable | None = None,
        score_fn: ScoreFnCallable | None = None,
        predict_with_aux_fn: PredictFnCallable | None = None,
    ) -> tuple[Any, dict[str, list[Any]], dict[str, list[Any]]]:
        """Runs the callables over every task; returns ``(metrics future or None, tokens, scores)``."""
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
        tokens = {k.split(":", 1)[1]: v for k, v in self._outputs.items() if not k.startswith("score_fn:")}
        scores = {k.split(":", 1)[1]: v for k, v in self._outputs.items() if k.startswith("score_fn:")}
        return future, tokens, scores


__all__ = [
    "Evaluator",
    "JSONLogger",
    "Logger",
    "PredictFnCallable",
    "PyLoggingLogger",
    "ScoreFnCallable",
    "TensorBoardLogger",
]
