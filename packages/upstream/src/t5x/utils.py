"""Upstream t5x's ``t5x.utils`` names that gin files configure, as plain records.

The records keep upstream's field names and defaults; ``t5x.upstream`` turns them
into t5x-launch's own configuration when a job runs, refusing by name what would
change a run's meaning here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from t5x import training

_SAVE_DTYPES = (None, "float32", "bfloat16")
_RESTORE_DTYPES = (None, "float32", "bfloat16", "float16")
_RESTORE_MODES = ("specific", "latest", "all")


@dataclasses.dataclass
class DatasetConfig:
    """Which Task or Mixture a job reads, and how (upstream's fields and defaults).

    ``task_feature_lengths=None`` (upstream's "use the longest example") is allowed
    for evaluation and inference.
    """

    mixture_or_task_name: Any
    task_feature_lengths: Mapping[str, int] | None
    split: str
    batch_size: int
    shuffle: bool
    seed: int | None
    use_cached: bool = False
    pack: bool = False
    use_custom_packing_ops: bool = False
    module: str | None = None
    use_memory_cache: bool = True
    trim_output_features: bool = True


@dataclasses.dataclass
class SaveCheckpointConfig:
    """When and how checkpoints are saved (upstream's fields and defaults)."""

    dtype: str | None = "float32"
    period: int | None = None
    keep: int | None = None
    keep_dataset_checkpoints: int | None = None
    save_dataset: bool = False
    checkpointer_cls: Any = None
    state_transformation_fns: Sequence[Callable[..., Any]] = ()
    use_gda: bool = True
    checkpoint_manager_cls: Any = None
    checkpoint_steps: Sequence[int] | None = None  # further steps to save at

    def __post_init__(self) -> None:
        if self.dtype not in _SAVE_DTYPES:
            raise ValueError(f"SaveCheckpointConfig.dtype must be one of {_SAVE_DTYPES}, got {self.dtype!r}")


@dataclasses.dataclass
class RestoreCheckpointConfig:
    """Which checkpoint a job starts from (upstream's fields and defaults).

    ``path`` is a checkpoint folder or a model folder; an empty list (upstream
    pretraining's value) means "start from scratch".
    """

    path: str | Sequence[str]
    mode: str = "latest"
    assignment_map: Sequence[tuple[str, str | None]] | None = None
    strict: bool = True
    fallback_to_scratch: bool = False
    dtype: str | None = None
    restore_dataset: bool = False
    checkpointer_cls: Any = None
    state_transformation_fns: Sequence[Callable[..., Any]] = ()
    use_gda: bool = True
    checkpoint_manager_cls: Any = None

    def __post_init__(self) -> None:
        if self.mode not in _RESTORE_MODES:
            raise ValueError(
                f"RestoreCheckpointConfig.mode must be one of {_RESTORE_MODES}, got {self.mode!r}"
            )
        if self.dtype not in _RESTORE_DTYPES:
            raise ValueError(
                f"RestoreCheckpointConfig.dtype must be one of {_RESTORE_DTYPES}, got {self.dtype!r}"
            )


@dataclasses.dataclass
class CheckpointConfig:
    """Saving and restoring together, as upstream's train script takes them."""

    save: SaveCheckpointConfig | None = None
    restore: RestoreCheckpointConfig | None = None


def create_learning_rate_scheduler(
    factors: str = "constant * linear_warmup * rsqrt_decay",
    base_learning_rate: float = 0.5,
    warmup_steps: int = 1000,
    decay_factor: float = 0.5,
    steps_per_decay: int = 20000,
    steps_per_cycle: int = 100000,
    step_offset: int = 0,
    min_learning_rate: float = 1e-8,
) -> Callable[[Any], Any]:
    """Upstream's factor-string schedule (``t5x.training.create_learning_rate_scheduler``).

    A function of its own rather than the same object, so that gin registers the
    upstream name separately from t5x-launch's configs.
    """
    return training.create_learning_rate_scheduler(
        factors=factors,
        base_learning_rate=base_learning_rate,
        warmup_steps=warmup_steps,
        decay_factor=decay_factor,
        steps_per_decay=steps_per_decay,
        steps_per_cycle=steps_per_cycle,
        step_offset=step_offset,
        min_learning_rate=min_learning_rate,
    )


def get_dataset(*args: Any, **kwargs: Any) -> Any:
    """Upstream's default ``get_dataset_fn``; named in gin files, never called here.

    t5x-launch builds its input pipeline itself: a train script configured with
    this function (the default) reads data as t5x-launch does.

    Raises:
      NotImplementedError: always, when called directly.
    """
    raise NotImplementedError(
        "t5x.utils.get_dataset is accepted as upstream's default get_dataset_fn, but t5x-launch builds "
        "the input pipeline itself; read a task with seqio.get_dataset (t5x.seqio) instead"
    )


__all__ = [
    "CheckpointConfig",
    "DatasetConfig",
    "RestoreCheckpointConfig",
    "SaveCheckpointConfig",
    "create_learning_rate_scheduler",
    "get_dataset",
]
