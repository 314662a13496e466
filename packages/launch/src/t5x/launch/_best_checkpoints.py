"""Keeping the best checkpoint by an evaluation metric, besides the newest ones (upstream's SaveBestCheckpointer)."""

from __future__ import annotations

import json
import logging
import math
import pathlib
from collections.abc import Mapping
from typing import Any

_LOG = logging.getLogger("t5x.launch")


class MetricRecorder:
    """A MetricWriter that remembers one scalar by step (and reads what earlier runs wrote)."""

    def __init__(self, name: str, metrics_file: pathlib.Path | None = None) -> None:
        self.name = name
        self.values: dict[int, float] = {}
        if metrics_file is not None and metrics_file.exists():
            for line in metrics_file.read_text(encoding="utf-8").splitlines():
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a line cut short by a crash
                if isinstance(record, dict) and name in record and "step" in record:
                    self.values[int(record["step"])] = float(record[name])

    def write_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
        if self.name in scalars:
            self.values[int(step)] = float(scalars[self.name])

    def write_texts(self, step: int, texts: Mapping[str, str]) -> None:
        del step, texts

    def write_hparams(self, hparams: Mapping[str, Any]) -> None:
        del hparams

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


class BestCheckpointKeeper:
    """A Checkpointer wrapper: after each save keeps the newest ``keep`` steps and the best one.

    The wrapped Checkpointer must keep every step itself (``keep=None``); this
    deletes the others through ``Checkpointer.delete_step``. A step without a
    value of the metric is kept when ``keep_without_metrics`` (upstream's
    default), else it is treated as any other old step. Steps divisible by
    ``keep_every`` and pinned steps are never deleted.
    """

    def __init__(
        self,
        checkpointer: Any,
        recorder: MetricRecorder,
        *,
        keep: int,
        mode: str,
        keep_without_metrics: bool,
        keep_every: int | None = None,
    ) -> None:
        self._inner = checkpointer
        self.recorder = recorder
        self.keep = keep
        self.mode = mode
        self.keep_without_metrics = keep_without_metrics
        self.keep_every = keep_every
        self._pending: int | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def best_step(self, steps: list[int]) -> int | None:
        """The step with the best finite value of the metric among ``steps``."""
        scored = [
            (v, s) for s in steps if (v := self.recorder.values.get(s)) is not None and math.isfinite(v)
        ]
        if not scored:
            return None
        pick = max if self.mode == "max" else min
        return pick(scored)[1]

    def prune(self) -> list[int]:
        """Deletes the complete steps the rule does not keep; returns them."""
        complete = self._inner.all_steps()
        steps = sorted(set(complete) | ({self._pending} if self._pending is not None else set()))
        kept = set(steps[-self.keep :])
        best = self.best_step(steps)
        if best is not None:
            kept.add(best)
        removed = []
        for step in complete:
            if step in kept or (self.keep_every and step % self.keep_every == 0):
                continue
            if step not in self.recorder.values and self.keep_without_metrics:
                continue
            try:
                self._inner.delete_step(step)
            except ValueError as pinned:
                _LOG.info("%s", pinned)
                continue
            removed.append(step)
        return removed

    def save(self, step: int, train_state: Any, input_state: Any = None) -> None:
        self._inner.save(step, train_state, input_state)  # waits for the previous save first
        self._pending = int(step)
        self.prune()

    def wait_until_finished(self) -> None:
        self._inner.wait_until_finished()
        self._pending = None
        self.prune()
