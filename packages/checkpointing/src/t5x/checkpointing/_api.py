"""Model-free loading and saving of T5X checkpoints (analysis, conversion)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from t5x.checkpointing import _checkpointer, _reader, _restore


def load_t5x_checkpoint(
    path: str | os.PathLike[str],
    step: int | None = None,
    restore_dtype: Any = None,
    lazy: bool = False,
    *,
    verify: bool = True,
) -> dict[str, Any]:
    """Loads a whole checkpoint as a nested state dict, without a model.

    Args:
      path: a model folder (then ``step``, or the latest step), a
        ``checkpoint_<step>`` folder in the T5X or the Orbax layout, or its
        ``checkpoint`` index file.
      step: the step to load from a model folder.
      restore_dtype: cast floating parameters (``target``) to this dtype.
      lazy: return :class:`LazyArray` leaves, read on ``get()`` / ``np.asarray``
        (and verified then).
      verify: check every array against the step's checksums (the default); a
        checkpoint without checksums loads unverified with a warning.

    Returns:
      ``{"target": params, "state": {"step": ..., "param_states": ...}}`` with
      numpy leaves (or lazy ones).

    Raises:
      FileNotFoundError: no checkpoint at ``path`` (names it and the newest step).
      CorruptIndexError: the index cannot be decoded.
      CheckpointIntegrityError: a chunk, array folder or metadata file is missing
        or changed (names the parameter, the file, expected and found).
    """
    step_dir, _ = _reader.locate(os.fspath(path), step)
    sources = _reader.read_sources(step_dir, verify=verify)
    chosen = _restore.select(sources, step_dir, None, restore_dtype=restore_dtype)
    return _restore.materialize(chosen, lazy=lazy)


def save_t5x_checkpoint(
    model_dir: str | os.PathLike[str], step: int, state_dict: Mapping[str, Any], *, compression: str = "zstd"
) -> str:
    """Writes ``state_dict`` as ``model_dir/checkpoint_<step>/`` and waits for it.

    Args:
      model_dir: the model folder.
      step: the step number of the folder.
      state_dict: a T5X state dict with numpy / jax leaves.
      compression: ``"zstd"`` (default), ``"gzip"`` (as upstream writes) or ``"none"``.

    Returns:
      The step folder's path.
    """
    checkpointer = _checkpointer.Checkpointer(model_dir, compression=compression, async_save=False)
    try:
        checkpointer.save(step, state_dict)
    finally:
        checkpointer.close()
    return checkpointer.step_dir(step)
