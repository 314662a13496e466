"""Plain configuration records that gin files fill in (upstream's names)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

_SAVE_DTYPES = (None, "float32", "bfloat16")
_RESTORE_DTYPES = (None, "float32", "bfloat16", "float16")
_RESTORE_MODES = ("latest", "specific", "all")
_METRIC_MODES = ("max", "min")


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
class SaveCheckpointConfig:
    """When checkpoints are saved and which are kept (upstream's field names).

    Attributes:
      dtype: the dtype floating parameters are saved in (None: as they are).
      period: steps between saves (None: only at the end; the last step is
        always saved).
      keep: keep only the newest ``keep`` checkpoints (None: all).
      checkpoint_steps: further steps to save at (kept like any other).
      keep_every: also keep every step divisible by this.
      metric_name_to_monitor: keep, besides the newest ``keep``, the
        checkpoint with the best value of this metric, named as it is written
        to ``metrics.jsonl`` / TensorBoard: ``<dataset>/<metric>`` for
        teacher-forced evaluation (``my_task/loss``) and
        ``inference_eval/<task>/<metric>`` for inference evaluation (upstream's
        ``SaveBestCheckpointer``). Needs ``keep``.
      metric_mode: ``"max"`` or ``"min"``: which value is best.
      keep_checkpoints_without_metrics: checkpoints of steps that were not
        evaluated are kept (upstream's default) rather than counted among the
        ``keep`` newest.
    """

    dtype: str | None = None
    period: int | None = None
    keep: int | None = None
    checkpoint_steps: Sequence[int] | None = None
    keep_every: int | None = None
    metric_name_to_monitor: str | None = None
    metric_mode: str = "max"
    keep_checkpoints_without_metrics: bool = True

    def __post_init__(self) -> None:
        if self.dtype not in _SAVE_DTYPES:
            raise ValueError(f"SaveCheckpointConfig.dtype must be one of {_SAVE_DTYPES}, got {self.dtype!r}")
        for name in ("period", "keep", "keep_every"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"SaveCheckpointConfig.{name} must be None or an int >= 1, got {value!r}")
        if self.metric_mode not in _METRIC_MODES:
            raise ValueError(
                f"SaveCheckpointConfig.metric_mode must be 'max' or 'min', got {self.metric_mode!r}"
            )
        if self.metric_name_to_monitor and self.keep is None:
            raise ValueError(
                "SaveCheckpointConfig.metric_name_to_monitor needs keep (how many newest checkpoints "
                "to keep besides the best); with keep=None every checkpoint is kept anyway"
            )


@dataclasses.dataclass(frozen=True)
class RestoreCheckpointConfig:
    """Which checkpoint a new run starts from, and how (upstream's field names and meanings).

    The whole train state is restored (parameters, optimizer state, step), as
    upstream does; ``assignment_map`` drops or renames parts of it. A model
    folder with checkpoints of its own always resumes from its newest one
    instead.

    Attributes:
      path: a ``checkpoint_<step>`` folder or a model folder, or a list of
        them: the first that holds a checkpoint is used.
      mode: ``"latest"`` (a model folder's newest checkpoint, or the named
        ``checkpoint_<step>`` folder) or ``"specific"`` (``path`` must be a
        ``checkpoint_<step>`` folder). ``"all"`` is for evaluation, not training.
      assignment_map: ``(regex, replacement)`` pairs over the model's
        slash-joined state names (``target/encoder/...`` for parameters,
        ``state/param_states/...`` for optimizer slots, ``state/step``); the
        first rule whose regex matches the whole name gives the checkpoint name
        (``re.sub`` replacement) or, for ``None``, keeps the fresh value
        (``[(r"state/.*", None)]``: parameters only, a fresh optimizer, step 0).
      strict: every optimizer slot of the model must be in the checkpoint with
        its shape; False keeps a fresh slot for each one that is not (e.g. a
        checkpoint saved with another optimizer).
      fallback_to_scratch: parameters the checkpoint lacks (after
        ``assignment_map``) keep their fresh initialisation, and a ``path``
        holding no checkpoint at all trains from scratch (one warning line
        each); False refuses both, naming what is missing.
      dtype: cast floating parameters to this dtype as they are read.
    """

    path: str | Sequence[str]
    mode: str = "latest"
    assignment_map: Sequence[tuple[str, str | None]] | None = None
    strict: bool = True
    fallback_to_scratch: bool = False
    dtype: str | None = None

    def __post_init__(self) -> None:
        if self.mode not in _RESTORE_MODES:
            raise ValueError(
                f"RestoreCheckpointConfig.mode must be one of {_RESTORE_MODES}, got {self.mode!r}"
            )
        if self.dtype not in _RESTORE_DTYPES:
            raise ValueError(
                f"RestoreCheckpointConfig.dtype must be one of {_RESTORE_DTYPES}, got {self.dtype!r}"
            )
        for rule in self.assignment_map or ():
            if (
                not isinstance(rule, (tuple, list))
                or len(rule) != 2
                or not isinstance(rule[0], str)
                or not (rule[1] is None or isinstance(rule[1], str))
            ):
                raise ValueError(
                    "RestoreCheckpointConfig.assignment_map must be a list of (regex, replacement or None) "
                    f"pairs, got the entry {rule!r}"
                )

    @property
    def paths(self) -> list[str]:
        """``path`` as a list (empty entries dropped)."""
        listed = [self.path] if isinstance(self.path, str) else list(self.path or ())
        return [str(p) for p in listed if p]


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
    """When to save checkpoints and what to start from.

    ``save`` and ``restore`` (upstream's records) say it in full; the older
    fields stay for the run files that set them and mean what they did:
    ``period``/``keep``/``keep_every``/``dtype`` are a ``SaveCheckpointConfig``
    when ``save`` is None, and ``initial_checkpoint_path`` is a
    ``RestoreCheckpointConfig`` restoring parameters only.

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
      save: a SaveCheckpointConfig (replaces the four save fields above).
      restore: a RestoreCheckpointConfig (instead of ``initial_checkpoint_path``).
    """

    period: int = 1000
    keep: int | None = None
    keep_every: int | None = None
    initial_checkpoint_path: str | None = None
    keep_initial_step: bool = False
    dtype: str | None = None
    save: SaveCheckpointConfig | None = None
    restore: RestoreCheckpointConfig | None = None

    def __post_init__(self) -> None:
        if self.restore is not None and self.initial_checkpoint_path:
            raise ValueError(
                "CheckpointConfig: give either initial_checkpoint_path "
                f"({self.initial_checkpoint_path!r}) or restore, not both"
            )
        if self.save is not None and not isinstance(self.save, SaveCheckpointConfig):
            raise TypeError(f"CheckpointConfig.save must be a SaveCheckpointConfig, got {self.save!r}")
        if self.restore is not None and not isinstance(self.restore, RestoreCheckpointConfig):
            raise TypeError(
                f"CheckpointConfig.restore must be a RestoreCheckpointConfig, got {self.restore!r}"
            )

    def save_config(self) -> SaveCheckpointConfig:
        """The saving rules: ``save``, else the older fields."""
        if self.save is not None:
            return self.save
        return SaveCheckpointConfig(
            dtype=self.dtype, period=self.period, keep=self.keep, keep_every=self.keep_every
        )

    def restore_config(self) -> RestoreCheckpointConfig | None:
        """What a new run starts from: ``restore``, else ``initial_checkpoint_path`` (parameters only)."""
        if self.restore is not None:
            return self.restore
        if not self.initial_checkpoint_path:
            return None
        dropped = [(r"state/param_states(/.*)?", None)]
        if not self.keep_initial_step:
            dropped.append((r"state/step", None))
        return RestoreCheckpointConfig(path=self.initial_checkpoint_path, assignment_map=dropped)
