"""Where evaluation results go: JSON Lines files, TensorBoard event files, Python logging."""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

_log = logging.getLogger("t5x.tasks.evaluation")


def to_jsonable(value: Any) -> Any:
    """Converts numpy values, bytes and tuples into plain JSON values (recursively)."""
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, np.ndarray):
        return to_jsonable(value.tolist())
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return repr(value)


class Logger:
    """Receives the results of evaluating one task at one step.

    Subclasses implement ``__call__``; the Evaluator constructs each logger
    class with ``output_dir=log_dir``.

    Args:
      output_dir: where to write (None for loggers that write no files).
    """

    def __init__(self, output_dir: str | None = None):
        self.output_dir = output_dir

    def __call__(
        self,
        task_name: str,
        step: int | None,
        metrics: Mapping[str, Any],
        examples: Sequence[Mapping[str, Any]],
        inferences: Mapping[str, Sequence[Any]],
        targets: Sequence[Any],
    ) -> None:
        """Records one task's results.

        Args:
          task_name: the evaluated task.
          step: the training step (None when unknown).
          metrics: metric name -> value.
          examples: the cached task examples (numpy dicts), in dataset order.
          inferences: ``"predictions"`` / ``"scores"`` / ``"aux_values"`` ->
            one entry per example, where computed.
          targets: the postprocessed targets, one per example.
        """
        raise NotImplementedError

    def _require_dir(self) -> str:
        if not self.output_dir:
            raise ValueError(
                f"{type(self).__name__} writes files and needs output_dir (the Evaluator's log_dir), got None"
            )
        return self.output_dir


class JSONLogger(Logger):
    """Writes ``{task}-metrics.jsonl`` (one line per step) and ``{task}-{step:06d}.jsonl``.

    The per-step file holds one line per example with its ``inputs`` and
    ``targets`` (text where the task kept it, ``*_pretokenized``), the
    postprocessed ``target``, the ``prediction`` and/or ``score``, and each aux
    value of a prediction as ``aux_<name>`` (``aux_scores``: its log-likelihood).

    Args:
      output_dir: the folder (created if needed).
      write_n_results: how many examples to write per step (None: all).
    """

    def __init__(self, output_dir: str | None = None, write_n_results: int | None = None):
        super().__init__(output_dir)
        self.write_n_results = write_n_results

    def __call__(self, task_name, step, metrics, examples, inferences, targets) -> None:
        out_dir = self._require_dir()
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, f"{task_name}-metrics.jsonl"), "a", encoding="utf-8") as f:
            f.write(json.dumps({"step": step, **to_jsonable(dict(metrics))}, sort_keys=True) + "\n")
        n = len(targets) if self.write_n_results is None else min(self.write_n_results, len(targets))
        step_name = "none" if step is None else f"{step:06d}"
        with open(os.path.join(out_dir, f"{task_name}-{step_name}.jsonl"), "w", encoding="utf-8") as f:
            for i in range(n):
                ex = examples[i]
                record: dict[str, Any] = {
                    "inputs": to_jsonable(ex.get("inputs_pretokenized", ex.get("inputs"))),
                    "targets": to_jsonable(ex.get("targets_pretokenized", ex.get("targets"))),
                    "target": to_jsonable(targets[i]),
                }
                if "predictions" in inferences:
                    record["prediction"] = to_jsonable(inferences["predictions"][i])
                if "scores" in inferences:
                    record["score"] = to_jsonable(inferences["scores"][i])
                if "aux_values" in inferences:
                    # seqio's layout: one ``aux_<name>`` field per aux value (e.g. the prediction's score).
                    for name, value in dict(inferences["aux_values"][i]).items():
                        record[f"aux_{name}"] = to_jsonable(value)
                f.write(json.dumps(record, sort_keys=True) + "\n")


class TensorBoardLogger(Logger):
    """Writes each numeric metric as a TensorBoard scalar ``eval/{metric}`` under ``{output_dir}/{task}``."""

    def __init__(self, output_dir: str | None = None):
        super().__init__(output_dir)
        self._writers: dict[str, Any] = {}

    def __call__(self, task_name, step, metrics, examples, inferences, targets) -> None:
        import tensorflow as tf
        from tensorflow.core.framework import summary_pb2

        if task_name not in self._writers:
            self._writers[task_name] = tf.summary.create_file_writer(
                os.path.join(self._require_dir(), task_name)
            )
        writer = self._writers[task_name]
        # The scalar plugin's metadata, written through the core op so that the
        # tensorboard package need not be installed.
        metadata = summary_pb2.SummaryMetadata(
            plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars")
        )
        with writer.as_default():
            for name, value in metrics.items():
                if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool):
                    tf.summary.write(
                        f"eval/{name}",
                        tf.constant(float(value), tf.float32),
                        step=step or 0,
                        metadata=metadata,
                    )
        writer.flush()


class PyLoggingLogger(Logger):
    """Logs one line per metric through Python logging (logger ``t5x.tasks.evaluation``)."""

    def __init__(self, output_dir: str | None = None, level: int = logging.INFO):
        super().__init__(output_dir)
        self.level = level

    def __call__(self, task_name, step, metrics, examples, inferences, targets) -> None:
        for name, value in sorted(metrics.items()):
            shown = f"{value:.4f}" if isinstance(value, float) else repr(value)
            _log.log(self.level, "%s/%s at step %s: %s", task_name, name, step, shown)
