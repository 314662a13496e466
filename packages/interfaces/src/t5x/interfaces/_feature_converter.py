"""The FeatureConverter contract: task features -> model features on tf.data."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class FeatureConverter(Protocol):
    """Turns a task's examples into the fixed-length features a model consumes.

    Called as ``converter(ds, task_feature_lengths)`` on a ``tf.data.Dataset``
    whose elements are dicts of 1-D integer tensors (e.g. ``"inputs"``,
    ``"targets"``) and returns a dataset of dicts of model features (e.g.
    ``"encoder_input_tokens"``, ``"decoder_target_tokens"``), each an ``int32``
    tensor of static length ``get_model_feature_lengths(task_feature_lengths)
    [name]`` (padded with 0). Output elements are unbatched.

    Attributes:
      pack: whether several examples are packed into one row; then segment-id and
        position features are added for each packed sequence.
      apply_length_check: if True, a task feature longer than its length raises
        ``tf.errors.InvalidArgumentError`` naming the feature; if False, it is
        trimmed.
    """

    pack: bool
    apply_length_check: bool

    def __call__(self, ds: Any, task_feature_lengths: Mapping[str, int]) -> Any:
        """Converts ``ds`` (a ``tf.data.Dataset``) and returns the model dataset.

        Raises:
          ValueError: a feature the converter needs is missing from ``ds`` or
            ``task_feature_lengths``, or has the wrong dtype or rank; the message
            names the converter and the feature.
        """
        ...

    def get_model_feature_lengths(self, task_feature_lengths: Mapping[str, int]) -> dict[str, int]:
        """Returns the length of every model feature for these task lengths."""
        ...
