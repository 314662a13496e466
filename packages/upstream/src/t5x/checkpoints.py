"""Upstream t5x's ``t5x.checkpoints`` API over t5x.checkpointing.

``Checkpointer(train_state, partitioner, checkpoints_dir, ...)`` saves and
restores upstream train state objects (anything with ``state_dict()`` and
``restore_state()``, e.g. ``t5x.train_state.FlaxOptimTrainState``) in upstream's
layout: ``checkpoints_dir/checkpoint_<step>/checkpoint`` (msgpack index) plus
TensorStore zarr arrays, written with gzip as upstream does. The files are
written by ``t5x.checkpointing.Checkpointer``; this module adapts the calling
convention (the step comes from the train state, restore returns a train
state, dataset iterators are checkpointed beside the arrays).

Every process restores whole arrays: the partitioner is kept for upstream's
signature, but per-host slicing is left to the caller's sharding.
``SaveBestCheckpointer`` and ``CheckpointManager`` remain names gin binds.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import jax
import numpy as np

from t5x import checkpointing
from t5x.checkpointing import LazyArray, load_t5x_checkpoint

# The index format version upstream writes and this package reads.
VERSION = 3
_STEP_DIR = re.compile(r"^checkpoint_(\d+)$")
_INDEX = "checkpoint"

StateTransformation = Callable[..., Mapping[str, Any]]


def all_steps(checkpoints_dir: str) -> list[int]:
    """The steps under ``checkpoints_dir`` whose ``checkpoint`` index exists, ascending.

    Temporary folders (``checkpoint_<step>.tmp-...``) and step folders without
    an index file are not steps.
    """
    checkpoints_dir = os.fspath(checkpoints_dir)
    try:
        names = os.listdir(checkpoints_dir)
    except FileNotFoundError:
        return []
    steps = []
    for name in names:
        match = _STEP_DIR.match(name)
        if match and os.path.isfile(os.path.join(checkpoints_dir, name, _INDEX)):
            steps.append(int(match.group(1)))
    return sorted(steps)


def latest_step(checkpoints_dir: str) -> int | None:
    """The newest step under ``checkpoints_dir``, or None when there is none."""
    steps = all_steps(checkpoints_dir)
    return steps[-1] if steps else None


def get_checkpoint_dir(checkpoints_dir: str, step: int) -> str:
    """``checkpoints_dir/checkpoint_<step>`` (whether or not it exists)."""
    return os.path.join(os.fspath(checkpoints_dir), f"checkpoint_{int(step)}")


def find_checkpoint(path: str, step: int | None = None) -> str:
    """The ``checkpoint`` index file that ``path`` (and ``step``) mean.

    Args:
      path: the index file itself (``step`` is then ignored), a step folder
        (``step`` must then be None), or a folder of step folders (``step``,
        or the latest one when None).
      step: the step to pick from a folder of step folders.

    Raises:
      ValueError: nothing at ``path`` is a checkpoint, or ``step`` is given for
        a step folder, or the folder has no such step.
    """
    path = os.fspath(path)
    if os.path.isfile(path):
        return path
    index = os.path.join(path, _INDEX)
    if os.path.isfile(index):
        if step is not None:
            raise ValueError(f"{path} is a step folder; step must be None, got {step}")
        return index
    if os.path.isdir(path):
        steps = all_steps(path)
        if step is None:
            if not steps:
                raise ValueError(f"Path is not a valid T5X checkpoint: no checkpoint_<step> folder in {path}")
            step = steps[-1]
        index = os.path.join(get_checkpoint_dir(path, step), _INDEX)
        if not os.path.isfile(index):
            raise ValueError(f"No checkpoint for step {step} in {path}; steps there: {steps}")
        return index
    raise ValueError(f"Path is not a valid T5X checkpoint: {path} does not exist")


def _cast_params(tree: Any, dtype: Any) -> Any:
    def cast(leaf: Any) -> Any:
        if isinstance(leaf, np.ndarray | jax.Array) and jax.dtypes.issubdtype(leaf.dtype, np.inexact):
            return np.asarray(leaf).astype(dtype)
        return leaf

    return jax.tree.map(cast, tree)


def _check_shapes(restored: Mapping[str, Any], wanted: Mapping[str, Any], prefix: str = "") -> None:
    for key, value in wanted.items():
        name = f"{prefix}{key}"
        if key not in restored:
            continue
        got = restored[key]
        if isinstance(value, Mapping):
            if isinstance(got, Mapping):
                _check_shapes(got, value, name + "/")
            continue
        want_shape = getattr(value, "shape", None)
        got_shape = getattr(got, "shape", None)
        if want_shape is not None and got_shape is not None and tuple(got_shape) != tuple(want_shape):
            raise ValueError(
                f"Shape of `{name}` in checkpoint {tuple(got_shape)} does not match expected {tuple(want_shape)}."
            )


def _merge_fallback(
    restored: Mapping[str, Any], wanted: Mapping[str, Any], fallback: Any, prefix: str = ""
) -> Any:
    merged: dict[str, Any] = {}
    for key, value in wanted.items():
        name = f"{prefix}{key}"
        sub_fallback = fallback.get(key) if isinstance(fallback, Mapping) else None
        if isinstance(value, Mapping):
            got = restored.get(key, {})
            merged[key] = _merge_fallback(
                got if isinstance(got, Mapping) else {}, value, sub_fallback, name + "/"
            )
        elif key in restored:
            merged[key] = restored[key]
        elif value is None:
            merged[key] = None
        elif isinstance(fallback, Mapping) and key in fallback:
            merged[key] = fallback[key]
        else:
            raise ValueError(f"`{name}` is not in the checkpoint and fallback_state has no value for it")
    return merged


class Checkpointer:
    """Saves and restores an upstream train state under ``checkpoints_dir``.

    Args:
      train_state: a train state with ``state_dict()`` / ``restore_state()``;
        its structure, shapes and dtypes are what ``restore`` returns.
      partitioner: upstream's partitioner (kept; see the module docstring).
      checkpoints_dir: the folder of ``checkpoint_<step>`` folders.
      dataset_iterator: a ``tf.data`` iterator saved beside each step as
        ``train_ds-<shard>-of-<shards>`` (a ``tf.train.Checkpoint``) and restored
        with it; None skips it.
      save_dtype: floating parameters are written as this dtype.
      restore_dtype: floating parameters are returned as this dtype (None: the
        train state's dtypes).
      keep: keep this many newest steps (None keeps all; pinned ones stay).
      keep_dataset_checkpoints: keep the dataset files of only this many
        newest steps (None keeps all).
      use_gda: accepted for upstream's signature; the files are the same.
    """

    def __init__(
        self,
        train_state: Any,
        partitioner: Any,
        checkpoints_dir: str,
        dataset_iterator: Any = None,
        *,
        keep: int | None = None,
        save_dtype: Any = np.float32,
        restore_dtype: Any = None,
        keep_dataset_checkpoints: int | None = None,
        use_gda: bool = False,
    ) -> None:
        if not hasattr(train_state, "state_dict") or not hasattr(train_state, "restore_state"):
            raise TypeError(
                "train_state must have state_dict() and restore_state() (an upstream train state), "
                f"got {type(train_state).__name__}"
            )
        if keep is not None and keep < 1:
            raise ValueError(f"keep must be None or >= 1, got {keep}")
        if keep_dataset_checkpoints is not None and keep_dataset_checkpoints < 1:
            raise ValueError(f"keep_dataset_checkpoints must be None or >= 1, got {keep_dataset_checkpoints}")
        self._train_state = train_state
        self._partitioner = partitioner
        self.checkpoints_dir = os.fspath(checkpoints_dir)
        self._dataset_iterator = dataset_iterator
        self.keep = keep
        self.keep_dataset_checkpoints = keep_dataset_checkpoints
        self.save_dtype = save_dtype
        self.restore_dtype = restore_dtype
        self.use_gda = use_gda

    # ---- listing ---------------------------------------------------------
    def all_steps(self) -> list[int]:
        """The complete steps, ascending."""
        return all_steps(self.checkpoints_dir)

    def latest_step(self) -> int | None:
        """The newest complete step, or None."""
        return latest_step(self.checkpoints_dir)

    def all_dataset_checkpoint_steps(self) -> list[int]:
        """The complete steps that also hold dataset iterator files, ascending."""
        return [step for step in self.all_steps() if self._dataset_files(step)]

    def _dataset_prefix(self, step: int) -> str:
        index, count = jax.process_index(), jax.process_count()
        return os.path.join(
            get_checkpoint_dir(self.checkpoints_dir, step), f"train_ds-{index:03}-of-{count:03}"
        )

    def _dataset_files(self, step: int) -> list[str]:
        return glob.glob(os.path.join(get_checkpoint_dir(self.checkpoints_dir, step), "train_ds-*"))

    # ---- saving ----------------------------------------------------------
    def save(
        self,
        train_state: Any,
        state_transformation_fns: Sequence[StateTransformation] = (),
        *,
        concurrent_gb: int = 128,
    ) -> None:
        """Writes ``train_state`` as ``checkpoint_<its step>`` and waits for it.

        ``state_transformation_fns`` are applied in turn to the state dict
        (``fn(state_dict)``) before it is written; ``concurrent_gb`` is accepted
        for upstream's signature.
        """
        del concurrent_gb
        state_dict = train_state.state_dict()
        for fn in state_transformation_fns:
            state_dict = fn(state_dict)
        state_dict = jax.tree.map(lambda x: x.get() if isinstance(x, LazyArray) else x, state_dict)
        step = int(np.asarray(state_dict["state"]["step"]))
        writer = checkpointing.Checkpointer(
            self.checkpoints_dir,
            keep=self.keep,
            save_dtype=self.save_dtype,
            compression="gzip",
            async_save=False,
        )
        try:
            writer.save(step, state_dict)
        finally:
            writer.close()
        if self._dataset_iterator is not None:
            import tensorflow as tf

            tf.train.Checkpoint(ds=self._dataset_iterator).write(self._dataset_prefix(step))
            if self.keep_dataset_checkpoints is not None:
                with_data = self.all_dataset_checkpoint_steps()
                for old in with_data[: -self.keep_dataset_checkpoints]:
                    for name in self._dataset_files(old):
                        os.remove(name)

    # ---- restoring -------------------------------------------------------
    def restore(
        self,
        step: int | None = None,
        path: str | None = None,
        state_transformation_fns: Sequence[StateTransformation] = (),
        fallback_state: Mapping[str, Any] | None = None,
        lazy_parameters: bool = False,
    ) -> Any:
        """Loads a checkpoint into a train state like the constructor's.

        Args:
          step: the step under ``checkpoints_dir`` (the latest when both this
            and ``path`` are None).
          path: a checkpoint elsewhere (see :func:`find_checkpoint`).
          state_transformation_fns: ``fn(checkpoint_state_dict, model_state_dict)``
            each returning the state dict to continue with (e.g.
            ``state_utils.apply_assignment_map``).
          fallback_state: values for keys the (transformed) checkpoint lacks.
          lazy_parameters: leave the arrays as :class:`LazyArray` leaves.

        Raises:
          ValueError: no checkpoint there, a shape differs from the train
            state's, or a key is in neither the checkpoint nor fallback_state.
        """
        if path is None and step is None and self.latest_step() is None:
            raise ValueError(f"No checkpoint to restore in {self.checkpoints_dir}")
        index = find_checkpoint(self.checkpoints_dir if path is None else path, step)
        step_dir = os.path.dirname(index)
        restored = load_t5x_checkpoint(step_dir, lazy=lazy_parameters)
        wanted = self._train_state.state_dict()
        for fn in state_transformation_fns:
            restored = dict(fn(restored, wanted))
        _check_shapes(restored, wanted)
        merged = _merge_fallback(restored, wanted, fallback_state)
        if not lazy_parameters:
            merged["target"] = self._restore_dtypes(merged["target"], wanted["target"])
            step_value = merged.get("state", {}).get("step")
            if step_value is not None:
                merged["state"]["step"] = np.asarray(step_value, dtype=np.int32)
        if self._dataset_iterator is not None:
            import tensorflow as tf

            prefix = os.path.join(step_dir, os.path.basename(self._dataset_prefix(0)))
            tf.train.Checkpoint(ds=self._dataset_iterator).read(prefix).assert_consumed()
        return self._train_state.restore_state(merged)

    def _restore_dtypes(self, restored: Any, wanted: Any) -> Any:
        if self.restore_dtype is not None:
            return _cast_params(restored, self.restore_dtype)

        def cast(got: Any, want: Any) -> Any:
            dtype = getattr(want, "dtype", None)
            if dtype is None or got is None:
                return got
            return np.asarray(got).astype(dtype)

        return jax.tree.map(cast, restored, wanted)


class SaveBestCheckpointer(Checkpointer):
    """Upstream's keep-the-best-by-metric checkpointer, as a name gin binds keywords to.

    ``utils.SaveCheckpointConfig.checkpointer_cls = @checkpoints.SaveBestCheckpointer``
    with ``metric_name_to_monitor``, ``metric_mode`` and
    ``keep_checkpoints_without_metrics`` bound: t5x-upstream's ``train`` reads
    those bindings into ``t5x.launch.SaveCheckpointConfig`` (the newest ``keep``
    checkpoints plus the best one are kept). It is never built itself.
    """

    # Upstream's defaults for the keywords gin may bind.
    DEFAULTS: ClassVar[dict[str, Any]] = {
        "metric_name_to_monitor": "train/accuracy",
        "metric_mode": "max",
        "keep_checkpoints_without_metrics": True,
        "force_keep_period": None,
    }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError(
            "checkpoints.SaveBestCheckpointer is a gin name here: set it as "
            "utils.SaveCheckpointConfig.checkpointer_cls and t5x-upstream's train keeps the best "
            "checkpoint by its metric_name_to_monitor"
        )


class CheckpointManager:
    """Upstream's Orbax-backed checkpoint manager, as a name to subclass or refer to.

    ``t5x.utils.restore`` and ``TrainStateInitializer`` call a subclass's
    ``restore(path=..., fallback_state=..., state_transformation_fns=...)``. This
    base is not built here: t5x-launch saves and restores with ``Checkpointer``.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError(
            "checkpoints.CheckpointManager (upstream's Orbax manager) is not implemented here: "
            "t5x-launch saves and restores checkpoints with t5x.checkpointing.Checkpointer"
        )

    def restore(self, path: str, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__}.restore is not implemented (asked for {path})")


__all__ = [
    "VERSION",
    "CheckpointManager",
    "Checkpointer",
    "LazyArray",
    "SaveBestCheckpointer",
    "all_steps",
    "find_checkpoint",
    "get_checkpoint_dir",
    "latest_step",
    "load_t5x_checkpoint",
]
