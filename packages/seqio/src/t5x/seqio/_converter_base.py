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


def _exact_match(
    expected: Sequence[str], actual: Sequence[str], expected_name: str, actual_name: str
) -> None:
    extra, missing = set(actual) - set(expected), set(expected) - set(actual)
    if extra:
        raise ValueError(
            f"The {actual_name} contains extra features not specified in the {expected_name}: {sorted(extra)}"
        )
    if missing:
        raise ValueError(
            f"The {actual_name} is missing features specified in the {expected_name}: {set(missing)}"
        )


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
        limits = {
            k: v for k, v in expected_lengths.items() if k in expected_features and expected_features[k].rank
        }
        axes = {k: expected_features[k].sequence_dim for k in limits}

        def check(name: str, value: Any) -> Any:
            if name not in limits:
                return value
            length = tf.shape(value, out_type=tf.int64)[axes[name]]
            assertion = tf.debugging.assert_equal if strict else tf.debugging.assert_less_equal
            relation = "equal to" if strict else "less than or equal to"
            op = assertion(
                length,
                tf.constant(limits[name], tf.int64),
                message=f"Feature '{name}' has length not {relation} the expected length of {limits[name]} "
                f"during {error_label} validation",
            )
            with tf.control_dependencies([op]):
                return tf.identity(value)

        return ds.map(lambda ex: {k: check(k, v) for k, v in ex.items()}, num_parallel_calls=tf.data.AUTOTUNE)

    def __call__(self, ds: tf.data.Dataset, task_feature_lengths: Mapping[str, int]) -> tf.data.Dataset:
        """Converts task features to model features, with seqio's five checks."""
        task_features = {**self.TASK_FEATURES, **self._passthrough_features}
        _exact_match(list(task_features), list(task_feature_lengths), "TASK_FEATURES", "task_feature_lengths")
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
        _exact_match(list(expected), list(model_lengths), "model_feature_names", "model_feature_lengths")
        ds = self._validate_dataset(ds, expected, model_lengths, True, "output_validation")
        _exact_match(list(expected), list(ds.element_spec), "model_feature_names", "output_dataset")
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
