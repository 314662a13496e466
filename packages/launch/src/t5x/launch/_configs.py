"""Plain configuration records that gin files fill in (upstream's names)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping


@dataclasses.dataclass(frozen=True)
class DatasetConfig:
    """Which data a job reads and how.

    Attributes:
      mixture_or_task_name: a registered Task or Mixture.
      task_feature_lengths: task feature -> length, e.g. ``{"inputs": 512, "targets": 114}``.
      split: the split to read.
      batch_size: the global batch size (all processes together).
      shuffle: shuffle the examples (training).
      seed: the data seed (None: the job's random seed).
      use_cached: read the task's offline cache.
      pack: pack several examples per row.
      module: a module to import first, to register the task (like seqio's
        ``--module_import``).
    """

    mixture_or_task_name: str
    task_feature_lengths: Mapping[str, int]
    split: str = "train"
    batch_size: int = 32
    shuffle: bool = True
    seed: int | None = None
    use_cached: bool = False
    pack: bool = True
    module: str | None = None


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
    """When to save checkpoints and what to start from.

    Attributes:
      period: steps between saves (the last step is always saved).
      keep: keep only the newest ``keep`` checkpoints (None: all).
      keep_every: also keep every step divisible by this.
      initial_checkpoint_path: a checkpoint (step folder or model folder) whose
        parameters start a new run with a fresh optimizer, when the model
        folder has no checkpoint yet (fine-tuning, adaptation).
      keep_initial_step: the new run counts steps on from the initial
        checkpoint's step (upstream fine-tuning's behaviour: the learning-rate
        schedule continues, and ``total_steps`` is absolute, i.e. the
        checkpoint's step plus the steps to run); False starts at step 0.
      dtype: the dtype parameters are saved in (None: as they are).
    """

    period: int = 1000
    keep: int | None = None
    keep_every: int | None = None
    initial_checkpoint_path: str | None = None
    keep_initial_step: bool = False
    dtype: str | None = None
