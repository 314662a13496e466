"""Inference evaluation: decode a split, postprocess, and compute each task's metrics."""

from __future__ import annotations

import dataclasses
import json
import pathlib
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from t5x.launch._assembly import feature_converter_for, get_provider
from t5x.launch._configs import DatasetConfig


@dataclasses.dataclass
class InferenceReport:
    """One task's inference metrics and its decoded examples (in split order)."""

    task: str
    metrics: dict[str, float]
    num_examples: int
    examples: list[dict[str, str]]


def _target_ids(batch: Mapping[str, np.ndarray], row: int) -> list[int]:
    targets = batch["decoder_target_tokens"][row]
    weights = batch.get("decoder_loss_weights")
    keep = (weights[row] > 0) if weights is not None else (targets > 0)
    return [int(t) for t in targets[keep]]


def _input_ids(batch: Mapping[str, np.ndarray], row: int) -> list[int]:
    if "encoder_input_tokens" in batch:
        return [int(t) for t in batch["encoder_input_tokens"][row] if t > 0]
    weights = batch.get("decoder_loss_weights")
    if weights is None:
        return []
    targets = batch["decoder_target_tokens"][row]
    return [int(t) for t in targets[(weights[row] == 0) & (targets > 0)]]


def _recording(
    batches: Any, record: list[tuple[list[int], list[int]]], max_examples: int | None
) -> Iterator[dict[str, np.ndarray]]:
    """Yields ``batches``, remembering each real example's input and target ids."""

    def full() -> bool:
        return max_examples is not None and len(record) >= max_examples

    for batch in batches:
        if full():
            return
        for row in range(batch["decoder_target_tokens"].shape[0]):
            if full():
                break  # the rest of this batch is decoded too, and left out of the metrics
            if batch["decoder_target_tokens"][row].any():
                record.append((_input_ids(batch, row), _target_ids(batch, row)))
        yield batch


def inference_metrics(
    model: Any,
    params: Any,
    partitioner: Any,
    cfg: DatasetConfig,
    output_dir: pathlib.Path,
    *,
    step: int,
    max_examples: int | None = None,
    writer: Any = None,
) -> list[InferenceReport]:
    """Decodes ``cfg``'s split for each task it names and computes the task's metrics.

    Predictions are written as JSON Lines to ``output_dir/<task>-<step>.jsonl``
    (through ``t5x.training.infer``); metrics go to ``writer`` as
    ``inference_eval/<task>/<metric>`` at ``step``.
    """
    import t5x.tasks
    import t5x.training

    provider = get_provider(cfg)
    converter = feature_converter_for(model, pack=False)
    layout = partitioner.get_data_layout(cfg.batch_size)
    vocabulary = model.output_vocabulary
    reports = []
    for task in provider.tasks:
        record: list[tuple[list[int], list[int]]] = []
        batches = t5x.tasks.get_input_iterator(
            task,
            converter,
            cfg.task_feature_lengths,
            layout.per_shard_batch_size,
            split=cfg.split,
            shard_info=layout.shard_info,
            shuffle=False,
            num_epochs=1,
            drop_remainder=False,
        )
        output = output_dir / f"{task.name}-{step}.jsonl"
        for stale in (output, output.with_name(output.name + ".COMPLETED")):
            stale.unlink(missing_ok=True)
        output_dir.mkdir(parents=True, exist_ok=True)
        written = t5x.training.infer(
            model,
            params,
            partitioner,
            _recording(batches, record, max_examples),
            str(output),
            batch_size=cfg.batch_size,
            mode="predict",
        )
        rows = [json.loads(line) for line in pathlib.Path(written).read_text().splitlines()]
        rows.sort(key=lambda r: r["index"])
        examples, targets, predictions = [], [], []
        for (input_ids, target_ids), row in zip(record, rows, strict=False):
            target_text = vocabulary.decode(target_ids)
            prediction_text = vocabulary.decode([int(t) for t in row["prediction"]])
            targets.append(task.postprocess_fn(target_text, is_target=True))
            predictions.append(task.postprocess_fn(prediction_text, is_target=False))
            examples.append(
                {"input": vocabulary.decode(input_ids), "target": target_text, "prediction": prediction_text}
            )
        metrics: dict[str, float] = {}
        for metric_fn in task.predict_metric_fns:
            metrics.update({k: float(v) for k, v in metric_fn(targets, predictions).items()})
        reports.append(InferenceReport(task.name, metrics, len(examples), examples))
        if writer is not None and metrics:
            writer.write_scalars(step, {f"inference_eval/{task.name}/{k}": v for k, v in metrics.items()})
    return reports
