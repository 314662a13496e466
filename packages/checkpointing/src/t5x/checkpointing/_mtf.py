"""Mesh TensorFlow / TF T5 checkpoints (``model.ckpt-N``), read through TensorFlow's own reader."""

from __future__ import annotations

import os
import re
from typing import Any

import numpy as np

_STEP = re.compile(r"model\.ckpt-(\d+)\.index$")


def _tensorflow() -> Any:
    try:
        import tensorflow as tf
    except ImportError as err:  # optional dependency, and slow to import
        raise ImportError(
            "reading Mesh TensorFlow checkpoints needs TensorFlow: "
            "pip install --find-links dist 't5x-checkpointing[mtf]' "
            "(run in the t5x checkout after `python3 -m nox -s wheels`; see docs/installing.md)"
        ) from err
    return tf


def mtf_checkpoint_prefix(path: str | os.PathLike[str]) -> str:
    """The checkpoint prefix (``.../model.ckpt-N``) that ``path`` names.

    Args:
      path: a prefix itself, or a folder (its ``checkpoint`` state file's
        latest entry, else the highest ``model.ckpt-N``).

    Returns:
      The prefix TensorFlow's reader takes.

    Raises:
      FileNotFoundError: when no checkpoint is found there.
    """
    path = os.fspath(path)
    if os.path.isfile(path + ".index"):
        return path
    if not os.path.isdir(path):
        raise FileNotFoundError(
            f"{path}: no Mesh TensorFlow checkpoint (expected a folder or a prefix like model.ckpt-1000000 "
            "with its .index and .data-* files)"
        )
    steps = [int(m.group(1)) for name in os.listdir(path) if (m := _STEP.match(name))]
    if not steps:
        raise FileNotFoundError(f"{path}: the folder holds no model.ckpt-<step>.index file")
    return os.path.join(path, f"model.ckpt-{max(steps)}")


def read_mtf_checkpoint(path: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """Reads every variable of a Mesh TensorFlow / TF T5 checkpoint.

    Args:
      path: a ``model.ckpt-N`` prefix or the folder holding it (latest step).

    Returns:
      ``name -> numpy array`` with TensorFlow's variable names
      (``shared/embedding``, ``encoder/block_000/layer_000/SelfAttention/q``,
      ``..._slot_vr``, ``global_step``, ...); bfloat16 widened to float32.

    Raises:
      FileNotFoundError: no checkpoint at ``path``.
      ImportError: TensorFlow is not installed.
    """
    prefix = mtf_checkpoint_prefix(path)
    tf = _tensorflow()
    reader = tf.train.load_checkpoint(prefix)
    out: dict[str, np.ndarray] = {}
    for name in sorted(reader.get_variable_to_shape_map()):
        if name.startswith("_CHECKPOINTABLE_OBJECT_GRAPH"):
            continue  # object-graph metadata of TF2 checkpoints, not a variable
        value = np.asarray(reader.get_tensor(name))
        if value.dtype.name == "bfloat16":
            value = value.astype(np.float32)
        out[name] = value
    return out
