"""Expanding a multiple-choice example into one row per answer option (T5's rank classification)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from t5x.tasks._lazy_tf import tf

_MODES = ("train", "eval", "fewshot_eval")


def rank_classification(
    dataset: tf.data.Dataset,
    inputs_fn: Callable[[Mapping[str, tf.Tensor]], tf.Tensor],
    targets_fn: Callable[[Mapping[str, tf.Tensor]], tf.Tensor],
    is_correct_fn: Callable[[Mapping[str, tf.Tensor]], tf.Tensor],
    weight_fn: Callable[[Mapping[str, tf.Tensor]], tf.Tensor] | None = None,
    mode: str = "eval",
    passthrough_feature_keys: Sequence[str] = (),
) -> tf.data.Dataset:
    """Turns each multiple-choice example into one example per answer option.

    Example n with options k = 0..K-1 becomes K rows
    ``{"idx": [n, k], "inputs": inputs_fn(ex)[k], "targets": targets_fn(ex)[k],
    "is_correct": is_correct_fn(ex)[k]}`` (plus ``"weight"`` with ``weight_fn``).
    A model then scores every row and :func:`t5x.tasks.metrics.rank_classification`
    picks the best option per example.

    Args:
      dataset: examples (dicts of tensors), unbatched.
      inputs_fn: example -> string tensor ``[K]`` of each option's input.
      targets_fn: example -> string tensor ``[K]`` of each option's target.
      is_correct_fn: example -> bool or int tensor ``[K]``.
      weight_fn: example -> float scalar weight of the example.
      mode: ``"eval"`` (every option, one row each), ``"train"`` (only the
        correct options) or ``"fewshot_eval"`` (one row per example holding
        all options as ``[K]`` features).
      passthrough_feature_keys: features copied to every row.

    Returns:
      the expanded dataset.

    Raises:
      ValueError: an unknown mode, or a passthrough key that clashes with an
        output feature.
    """
    if mode not in _MODES:
        raise ValueError(f"rank_classification: mode must be one of {_MODES}, got {mode!r}")
    clash = set(passthrough_feature_keys) & {"idx", "inputs", "targets", "is_correct", "weight"}
    if clash:
        raise ValueError(f"rank_classification: passthrough keys {sorted(clash)} clash with output features")

    def expand(index: tf.Tensor, ex: Mapping[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        inputs, targets = inputs_fn(ex), targets_fn(ex)
        is_correct = tf.cast(is_correct_fn(ex), tf.bool)
        n = tf.size(is_correct)
        with tf.control_dependencies(
            [
                tf.debugging.assert_equal(
                    tf.stack([tf.size(inputs), tf.size(targets)]),
                    tf.stack([n, n]),
                    message="rank_classification: inputs_fn, targets_fn and is_correct_fn must give one value per option",
                )
            ]
        ):
            idx = tf.stack([tf.fill([n], tf.cast(index, tf.int32)), tf.range(n, dtype=tf.int32)], axis=1)
        out = {"idx": idx, "inputs": inputs, "targets": targets, "is_correct": is_correct}
        if weight_fn is not None:
            out["weight"] = tf.fill([n], tf.cast(weight_fn(ex), tf.float32))
        for key in passthrough_feature_keys:
            value = tf.convert_to_tensor(ex[key])
            out[key] = tf.tile(value[tf.newaxis], tf.concat([[n], tf.ones([tf.rank(value)], tf.int32)], 0))
        return out

    ds = dataset.enumerate().map(expand, num_parallel_calls=tf.data.AUTOTUNE)
    if mode == "fewshot_eval":
        return ds
    ds = ds.unbatch()
    if mode == "train":
        ds = ds.filter(lambda ex: ex["is_correct"])
    return ds


def rank_classification_postprocessor(
    output: Any, example: Mapping[str, Any] | None = None, is_target: bool = False, **unused: Any
) -> Any:
    """Postprocess function of a rank-classification task.

    For targets it returns ``(idx, is_correct, weight, target_length)`` from the
    cached example, which is what :func:`t5x.tasks.metrics.rank_classification`
    takes; for model outputs (scores) it returns them unchanged.

    Raises:
      ValueError: ``is_target`` without the example it came from.
    """
    if not is_target:
        return output
    if example is None:
        raise ValueError("rank_classification_postprocessor: is_target=True needs the example (example=...)")
    weight = float(np.asarray(example["weight"])) if "weight" in example else 1.0
    return (
        tuple(int(i) for i in np.asarray(example["idx"]).reshape(-1)),
        bool(np.asarray(example["is_correct"])),
        weight,
        len(np.asarray(example["targets"])),
    )
