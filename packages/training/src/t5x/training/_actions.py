"""Actions the train loop runs after training, train-eval and inference-eval: a small protocol.

An action looks at the metrics of one phase and answers whether training
should stop. :func:`t5x.training.train` runs the actions listed for a mode
(``TRAIN`` after each ``eval_period`` chunk of steps with the chunk's mean
train metrics under ``"train"``; ``TRAIN_EVAL`` with the teacher-forced
metrics by dataset; ``INFER_EVAL`` with the inference metrics by task).
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

MetricsByTask = Mapping[str, Mapping[str, float]]

# The name TRAIN-mode actions find the train metrics under.
TRAIN_METRICS_KEY = "train"


class ActionMode(enum.Enum):
    """When an action runs (upstream's names)."""

    TRAIN = 1
    TRAIN_EVAL = 2
    INFER_EVAL = 3


@runtime_checkable
class TrainAction(Protocol):
    """Anything with ``run(step, metrics_by_task) -> bool``; True stops training."""

    def run(self, step: int, metrics_by_task: MetricsByTask) -> bool: ...


def _value(metrics_by_task: MetricsByTask, metric: tuple[str, str], who: str) -> float:
    task, name = metric
    if task not in metrics_by_task or name not in metrics_by_task[task]:
        found = {t: sorted(m) for t, m in metrics_by_task.items()}
        raise KeyError(f"{who} watches {task}/{name}, but the metrics given were {found}")
    value = metrics_by_task[task][name]
    return float(getattr(value, "value", value))


def improves(value: float, best: float | None, mode: str, atol: float, rtol: float) -> bool:
    """Whether ``value`` beats ``best`` (None: nothing yet) by more than ``atol + rtol * |best|``."""
    sign = 1.0 if mode == "min" else -1.0
    return best is None or sign * (best - value) > atol + rtol * abs(best)


@dataclasses.dataclass
class EarlyStoppingAction:
    """Stops when ``metric`` has not improved for ``patience`` runs.

    Args:
      metric: ``(task or dataset name, metric name)``, e.g. ``("my_task", "loss")``.
      mode: ``"min"`` (lower is better) or ``"max"``.
      patience: runs without an improvement before stopping.
      atol: an improvement must exceed ``atol + rtol * |best|``.
      rtol: see ``atol``.
    """

    metric: tuple[str, str]
    mode: str = "min"
    patience: int = 3
    atol: float = 0.0
    rtol: float = 0.0
    best: float | None = dataclasses.field(default=None, init=False)
    misses: int = dataclasses.field(default=0, init=False)

    def __post_init__(self) -> None:
        if self.mode not in ("min", "max"):
            raise ValueError(f"EarlyStoppingAction.mode must be 'min' or 'max', got {self.mode!r}")
        if self.patience < 1:
            raise ValueError(f"EarlyStoppingAction.patience must be >= 1, got {self.patience}")
        metric = tuple(self.metric)
        if len(metric) != 2:
            raise ValueError(f"EarlyStoppingAction.metric must be (task, metric), got {self.metric!r}")
        self.metric = (str(metric[0]), str(metric[1]))

    def run(self, step: int, metrics_by_task: MetricsByTask) -> bool:
        del step
        value = _value(metrics_by_task, self.metric, "EarlyStoppingAction")
        if improves(value, self.best, self.mode, self.atol, self.rtol):
            self.best, self.misses = value, 0
        else:
            self.misses += 1
        return self.misses >= self.patience

    def __str__(self) -> str:
        return (
            f"EarlyStoppingAction({'/'.join(self.metric)}, mode={self.mode}: no improvement on "
            f"{self.best} in {self.misses} runs)"
        )


@dataclasses.dataclass
class TerminateOnNanAction:
    """Stops when ``task``'s ``metric`` is NaN or infinite (a missing metric does not stop)."""

    task: str
    metric: str = "loss"
    last: float | None = dataclasses.field(default=None, init=False)

    def run(self, step: int, metrics_by_task: MetricsByTask) -> bool:
        del step
        value = metrics_by_task.get(self.task, {}).get(self.metric)
        if value is None:
            return False
        self.last = float(getattr(value, "value", value))
        return not math.isfinite(self.last)

    def __str__(self) -> str:
        return f"TerminateOnNanAction({self.task}/{self.metric} = {self.last})"


def as_mode(mode: Any) -> ActionMode:
    """An ActionMode from itself, its name (``"TRAIN_EVAL"``) or an enum with such a name."""
    if isinstance(mode, ActionMode):
        return mode
    name = getattr(mode, "name", mode)
    if isinstance(name, str) and name.upper() in ActionMode.__members__:
        return ActionMode[name.upper()]
    raise ValueError(f"unknown action mode {mode!r}; expected one of {list(ActionMode.__members__)}")


def normalize_actions(actions: Mapping[Any, Sequence[Any]] | None) -> dict[ActionMode, list[Any]]:
    """``{mode: [action, ...]}`` with ActionMode keys; every action must have ``run``.

    Raises:
      ValueError: an unknown mode.
      TypeError: an action without a ``run`` method (names it and its mode).
    """
    out: dict[ActionMode, list[Any]] = {}
    for mode, listed in (actions or {}).items():
        key = as_mode(mode)
        if not isinstance(listed, Sequence) or isinstance(listed, str):
            raise TypeError(f"actions[{key.name}] must be a list of actions, got {type(listed).__name__}")
        for action in listed:
            if not callable(getattr(action, "run", None)):
                raise TypeError(f"actions[{key.name}]: {action!r} has no run(step, metrics_by_task) method")
        out.setdefault(key, []).extend(listed)
    return out


def run_actions(
    actions: Mapping[ActionMode, Sequence[Any]],
    mode: ActionMode,
    step: int,
    metrics_by_task: MetricsByTask,
    train_state: Callable[[], Any] | None = None,
) -> Any:
    """Runs every action of ``mode``; returns the first that asked to stop, else None.

    Every action runs even after one asked to stop, so that each sees every
    evaluation (as upstream does). An action whose ``takes_train_state``
    attribute is True gets the train state (``train_state()``) in place of
    the step: upstream's ``run(train_state, metrics_by_task)`` signature.
    """
    stopper = None
    for action in actions.get(mode, ()):
        first = step
        if getattr(action, "takes_train_state", False) and train_state is not None:
            first = train_state()
        if action.run(first, metrics_by_task) and stopper is None:
            stopper = action
    return stopper
