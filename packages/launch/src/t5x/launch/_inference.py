"""Inference evaluation: decode a split, postprocess, and compute each task's metrics."""

from __future__ import annotations

import dataclasses
import json
import pathlib
import sys
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, TextIO

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


# Not on a terminal, a decoding progress line at most this often (and after the first and last batch).
DECODE_PROGRESS_SECONDS = 10.0


class DecodeProgress:
    """Iterates over ``batches``, telling how many examples were decoded so far.

    A batch counts as decoded when the next one is asked for (decoding is
    sequential). On a terminal the count is one live line; otherwise (logs of
    nohup, SLURM, CI) it is a plain, flushed ``[decode] LABEL: decoded N/TOTAL
    examples`` line after the first batch, at most every
    ``DECODE_PROGRESS_SECONDS`` after that, and after the last. Only process 0
    prints. ``get_state`` / ``set_state`` reach the wrapped iterator, so
    resumable inference stays resumable.
    """

    def __init__(
        self,
        batches: Iterable[Mapping[str, np.ndarray]],
        label: str,
        *,
        total: int | None = None,
        verb: str = "decoded",
        stream: TextIO | None = None,
    ):
        import jax

        self._iterator = iter(batches)
        self.label, self.total, self.verb = label, total, verb
        self.stream = stream if stream is not None else sys.stdout
        self.active = jax.process_index() == 0
        isatty = getattr(self.stream, "isatty", None)
        self.live = self.active and bool(isatty and isatty())
        self.decoded = 0
        self._last_line: float | None = None
        self._done = False

    def __getattr__(self, name: str) -> Any:
        if name in ("get_state", "set_state"):
            return getattr(self._iterator, name)
        raise AttributeError(name)

    def __iter__(self) -> DecodeProgress:
        return self

    def __next__(self) -> Mapping[str, np.ndarray]:
        try:
            batch = next(self._iterator)
        except StopIteration:
            if self.decoded and not self._done:
                self._show(final=True)
            self._done = True
            raise
        if self.decoded:  # the previous batch is decoded now
            self._show(final=False)
        first = next(iter(batch.values()), None)
        self.decoded += 0 if first is None else int(np.shape(first)[0])
        return batch

    def advance_to(self, decoded: int, *, final: bool = False) -> None:
        """Tells the count when the caller decodes batches itself (not by iterating this object)."""
        self.decoded = decoded
        if final and self._done:
            return
        self._done = self._done or final
        self._show(final=final)

    def line(self, final: bool = False) -> str:
        count = min(self.decoded, self.total) if self.total is not None else self.decoded
        # A split shorter than ``total`` ends with its own count alone.
        total = f"/{self.total}" if self.total is not None and not (final and count < self.total) else ""
        return f"[decode] {self.label}: {self.verb} {count}{total} examples"

    def _show(self, final: bool) -> None:
        if not self.active:
            return
        now = time.monotonic()
        if self.live:
            self.stream.write("\r\x1b[2K" + self.line(final) + ("\n" if final else ""))
        elif final or self._last_line is None or now - self._last_line >= DECODE_PROGRESS_SECONDS:
            self.stream.write(self.line(final) + "\n")
        else:
            return
        self.stream.flush()
        self._last_line = now


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
            DecodeProgress(_recording(batches, record, max_examples), task.name, total=max_examples),
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
