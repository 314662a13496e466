"""Upstream t5x's ``t5x.trainer`` names that run gin files configure.

Upstream gin files pass ``trainer_cls = @trainer.Trainer`` with its learning
rate schedule and microbatch count bound; t5x-upstream's train script builds
this record to read those settings, then trains with ``t5x.training.Trainer``.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from typing import Any


class ActionMode(enum.Enum):
    """When an action runs (upstream's names)."""

    TRAIN = 1
    TRAIN_EVAL = 2
    INFER_EVAL = 3


class Trainer:
    """The trainer settings an upstream gin file binds (``learning_rate_fn``, ``num_microbatches``).

    Upstream's constructor arguments that the train script fills in (model,
    state, partitioner, ...) are accepted and unused: t5x-launch builds its own
    ``t5x.training.Trainer`` from these settings.
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
        *,
        learning_rate_fn: Callable[[Any], Any] | None = None,
        num_microbatches: int | None = None,
        weight_metrics_computer: Any = None,
        use_gda: bool = True,
    ) -> None:
        if num_microbatches is not None and num_microbatches < 0:
            raise ValueError(f"trainer.Trainer.num_microbatches must be >= 0 or None, got {num_microbatches}")
        self.learning_rate_fn = learning_rate_fn
        # Upstream treats 0 like None: no microbatching.
        self.num_microbatches = num_microbatches or None
        self.weight_metrics_computer = weight_metrics_computer


class WeightMetricsComputer:
    """Upstream's per-parameter norm summaries: accepted, not computed by t5x-launch."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        del args, kwargs


class BaseAction:
    """Base of the actions upstream's train script runs after train, train-eval or infer-eval.

    Subclass it and define ``run(train_state, metrics_by_task) -> bool``
    (True stops training): t5x-launch's loop passes the train state
    (``t5x.training.TrainState``) and ``{task: {metric: value}}``, where
    values are floats (upstream passes clu metrics; ``.value`` is not needed).
    TRAIN-mode actions find the train metrics under ``"train"``.
    """

    takes_train_state = True  # t5x.training's loop: call run(train_state, ...), not run(step, ...)

    def run(self, train_state: Any, metrics_by_task: Any) -> bool:
        raise NotImplementedError


class TerminateOnNanAction(BaseAction):
    """Stop training when ``task``'s ``metric`` is not finite.

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
        return self._impl.run(0, metrics_by_task)

    def __str__(self) -> str:
        return str(self._impl)


class EarlyStoppingAction(BaseAction):
    """Upstream's early stopping on an eval metric (``metric=(task, name)``), run by t5x.training's loop."""

    def __init__(
        self, metric: tuple[str, str], mode: str, patience: int = 3, atol: float = 0.0, rtol: float = 0.0
    ) -> None:
        from t5x.training import EarlyStoppingAction as Impl

        if mode not in ("min", "max"):
            raise ValueError(f"EarlyStoppingAction.mode must be 'min' or 'max', got {mode!r}")
        self.metric = tuple(metric)
        self.mode = mode
        self.patience = patience
        self.atol = atol
        self.rtol = rtol
        self._impl = Impl(metric=metric, mode=mode, patience=patience, atol=atol, rtol=rtol)

    def run(self, train_state: Any, metrics_by_task: Any) -> bool:
        return self._impl.run(0, metrics_by_task)

    def __str__(self) -> str:
        return str(self._impl)


__all__ = [
    "ActionMode",
    "BaseAction",
    "EarlyStoppingAction",
    "TerminateOnNanAction",
    "Trainer",
    "WeightMetricsComputer",
]
