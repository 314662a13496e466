"""seqio's FeatureConverter base class, for converters written against seqio's hooks.

A seqio-style converter defines ``TASK_FEATURES``, ``MODEL_FEATURES``,
``PACKING_FEATURE_DTYPES``, ``_convert_features(ds, task_feature_lengths)`` and
``get_model_feature_lengths``, and calls ``self._pack_or_pad``. ``__call__``
runs seqio's checks around it: the task lengths name exactly the task features,
the input features have the right dtype and rank and are no longer than their
lengths, and the output has exactly the model features at exactly their lengths.

The core's converters are registered as virtual subclasses, so
``isinstance(seqio.EncDecFeatureConverter(), seqio.FeatureConverter)`` holds.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import tensorflow as tf

from t5x import feature_converters as _core
from t5x.feature_converters import FeatureSpec as _Spec
from t5x.feature_converters import trim_and_pack_dataset
from t5x.tasks.seqio_extras import trim_and_pad_dataset


def check_exact_match(
    expected_features: Sequence[str],
    actual_features: Sequence[str],
    expected_feature_source: str,
    actual_feature_source: str,
) -> None:
    """Raises ValueError unless both collections name the same features (seqio's wording)."""
    extra = set(actual_features) - set(expected_features)
    missing = set(expected_features) - set(actual_features)
    if extra:
        raise ValueError(
            f"The {actual_feature_source} contains extra features not specified in the "
            f"{expected_feature_source}: {extra}"
        )
    if missing:
        raise ValueError(
            f"The {actual_feature_source} is missing features specified in the "
            f"{expected_feature_source}: {missing}"
        )


def _length_along(name: str, value: Any, axis: int, strict: bool) -> tuple[tf.Tensor, list[tf.Operation]]:
    """The length of ``value`` on ``axis`` (a ragged one's bounding length) and any extra asserts."""
    if not isinstance(value, tf.RaggedTensor):
        return tf.shape(value, out_type=tf.int64)[axis], []
    ops = []
    if strict:
        # An exact length only means something when every row has it; axis 0
        # gives a scalar, which the multiply turns into a 1-vector.
        lengths = tf.cast(value.row_lengths(axis), tf.int64) * tf.constant([1], tf.int64)
        ops.append(
            tf.debugging.Assert(
                tf.equal(tf.size(tf.unique(lengths)[0]), 1),
                [
                    f"Strict length check requires all RaggedTensor dimensions to be equal, got {name}:",
                    lengths,
                ],
            )
        )
    return value.bounding_shape(axis=axis, out_type=tf.int64), ops


def check_lengths(
    ds: tf.data.Dataset,
    expected_lengths: Mapping[str, int],
    sequence_axis_mapping: Mapping[str, int],
    strict: bool,
    error_label: str,
) -> tf.data.Dataset:
    """Attaches to each listed feature an assert: its length ``==`` (strict) or ``<=`` the expected one.

    Features not in ``expected_lengths`` pass unchecked. The asserts run while
    iterating, when the lengths are known; the messages are seqio's.
    """

    def check(name: str, value: Any) -> Any:
        if name not in expected_lengths:
            return value
        want = expected_lengths[name]
        length, ops = _length_along(name, value, sequence_axis_mapping[name], strict)
        if strict:
            assertion, relation = tf.debugging.assert_equal, "equal to"
        else:
            assertion, relation = tf.debugging.assert_less_equal, "less than or equal to"
        message = (
            f"Feature '{name}' has length not {relation} the expected length of {want} "
            f"during {error_label} validation"
        )
        ops.append(assertion(length, tf.constant(want, tf.int64), message=message))
        with tf.control_dependencies(ops):
            if isinstance(value, tf.RaggedTensor):
                return value.with_flat_values(tf.identity(value.flat_values))
            return tf.identity(value)

    return ds.map(lambda ex: {k: check(k, v) for k, v in ex.items()}, num_parallel_calls=tf.data.AUTOTUNE)


class FeatureConverter(metaclass=abc.ABCMeta):
    """Base of seqio-style converters (see the module docstring).

    Args:
      pack: pack examples (adds ``PACKING_FEATURE_DTYPES`` features).
      use_custom_packing_ops: seqio's denser packer; here the ``first_fit`` strategy.
      apply_length_check: assert input lengths <= task lengths, outputs == model lengths.
      bos_id: first decoder input id.
      passthrough_features: name -> FeatureSpec of task features copied to the output
        (your ``_convert_features`` copies them; not with packing).
    """

    FeatureSpec: ClassVar[type[_Spec]] = _Spec
    TASK_FEATURES: ClassVar[Mapping[str, _Spec]]
    MODEL_FEATURES: ClassVar[Mapping[str, _Spec]]
    PACKING_FEATURE_DTYPES: ClassVar[Mapping[str, tf.DType]]

    def __init__(
        self,
        pack: bool = True,
        use_custom_packing_ops: bool = False,
        apply_length_check: bool = True,
        bos_id: int = 0,
        passthrough_features: Mapping[str, _Spec] | None = None,
    ):
        self._pack = pack
        self._use_custom_packing_ops = use_custom_packing_ops
        self._apply_length_check = apply_length_check
        self._bos_id = bos_id
        for attr in ("TASK_FEATURES", "MODEL_FEATURES"):
            if getattr(self, attr, None) is None:
                raise ValueError(f"{type(self).__name__}: {attr} must be defined in the subclass")
        if pack and getattr(self, "PACKING_FEATURE_DTYPES", None) is None:
            raise ValueError(f"{type(self).__name__}: PACKING_FEATURE_DTYPES must be defined when pack=True")
        if passthrough_features and pack:
            raise ValueError("Packing is incompatible with pass-through features.")
        self._passthrough_features = dict(passthrough_features or {})

    @property
    def pack(self) -> bool:
        return self._pack

    @property
    def bos_id(self) -> int:
        return self._bos_id

    def _validate_dataset(
        self,
        ds: tf.data.Dataset,
        expected_features: Mapping[str, _Spec],
        expected_lengths: Mapping[str, int],
        strict: bool,
        error_label: str,
    ) -> tf.data.Dataset:
        spec = ds.element_spec
        for name, want in expected_features.items():
            if name not in spec:
                raise ValueError(
                    f"Dataset is missing an expected feature during {error_label} validation: '{name}'"
                )
            if want.dtype != spec[name].dtype:
                raise ValueError(
                    f"Dataset has incorrect type for feature '{name}' during {error_label} validation: "
                    f"Got {spec[name].dtype.name}, expected {want.dtype.name}"
                )
            if want.rank != spec[name].shape.rank:
                raise ValueError(
                    f"Dataset has incorrect rank for feature '{name}' during {error_label} validation: "
                    f"Got {spec[name].shape.rank}, expected {want.rank}"
                )
        if not self._apply_length_check:
            return ds
        ranked = {k for k, v in expected_features.items() if v.rank}
        limits = {k: v for k, v in expected_lengths.items() if k in ranked}
        axes = {k: expected_features[k].sequence_dim for k in limits}
        return check_lengths(ds, limits, axes, strict, error_label)

    def __call__(self, ds: tf.data.Dataset, task_feature_lengths: Mapping[str, int]) -> tf.data.Dataset:
        """Converts task features to model features, with seqio's five checks."""
        task_features = {**self.TASK_FEATURES, **self._passthrough_features}
        check_exact_match(
            list(task_features), list(task_feature_lengths), "TASK_FEATURES", "task_feature_lengths"
        )
        ds = self._validate_dataset(ds, task_features, task_feature_lengths, False, "input_validation")
        ds = self._convert_features(ds, task_feature_lengths)
        expected = {**self.MODEL_FEATURES, **self._passthrough_features}
        if self.pack:
            for name, spec in expected.items():
                if spec.rank != 1 and not self._use_custom_packing_ops:
                    raise ValueError(
                        "When packing is enabled, expected ranks must be 1 or use_custom_packing_ops must be "
                        f"set. Got expected rank {spec.rank} for feature {name}."
                    )
            expected.update({k: _Spec(dtype=v) for k, v in self.PACKING_FEATURE_DTYPES.items()})
        model_lengths = self.get_model_feature_lengths(task_feature_lengths)
        check_exact_match(list(expected), list(model_lengths), "model_feature_names", "model_feature_lengths")
        ds = self._validate_dataset(ds, expected, model_lengths, True, "output_validation")
        check_exact_match(list(expected), list(ds.element_spec), "model_feature_names", "output_dataset")
        return ds

    def _pack_or_pad(self, ds: tf.data.Dataset, packed_lengths: Mapping[str, Any]) -> tf.data.Dataset:
        """Packs (``pack=True``) or trims and pads the listed features."""
        if self.pack:
            return trim_and_pack_dataset(ds, packed_lengths, self._use_custom_packing_ops)
        return trim_and_pad_dataset(ds, packed_lengths)

    @abc.abstractmethod
    def _convert_features(
        self, ds: tf.data.Dataset, task_feature_lengths: Mapping[str, int]
    ) -> tf.data.Dataset:
        """Maps task features to model features (trimming, padding or packing them)."""

    @abc.abstractmethod
    def get_model_feature_lengths(self, task_feature_lengths: Mapping[str, int]) -> Mapping[str, int]:
        """The length of every model feature."""


# The core's converters (and the pre-packed ones, which are not core subclasses) count as seqio converters.
FeatureConverter.register(_core.FeatureConverter)  # type: ignore[type-abstract]
FeatureConverter.register(_core.PassThroughFeatureConverter)
FeatureConverter.register(_core.PrePackedLMFeatureConverter)
