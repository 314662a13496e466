"""The FeatureConverter base class: validation, length checks, pad or pack."""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Mapping
from typing import ClassVar

import tensorflow as tf

from t5x.feature_converters._packing import PACKING_STRATEGIES, _padded_batch_all, packed_rows


@dataclasses.dataclass(frozen=True)
class FeatureSpec:
    """Dtype and rank a feature must have.

    Attributes:
      dtype: the tf dtype.
      rank: number of dimensions.
      sequence_dim: the axis that is trimmed, padded and packed.
    """

    dtype: tf.DType
    rank: int = 1
    sequence_dim: int = 0


# Examples converted together when not packing (vectorisation only; no effect on outputs).
_UNPACKED_BATCH = 64


class FeatureConverter(abc.ABC):
    """Converts a task's examples into fixed-length model features.

    Called as ``converter(ds, task_feature_lengths)``. Subclasses declare
    ``TASK_FEATURES`` (what they read), ``MODEL_FEATURES`` (what they write) and
    ``PACKING_FEATURE_DTYPES`` (the segment-id and position features added when
    packing), and implement ``_prepare``, ``_packed_lengths``, ``_convert`` and
    ``get_model_feature_lengths``.

    The work is one per-example map (validation, length check, trimming and any
    per-example rearrangement) and then either padding plus conversion in the
    same map, or packing plus conversion of a whole window of rows in one map.

    Args:
      pack: pack several examples into each row (adds segment ids/positions).
      use_custom_packing_ops: seqio's switch for its denser custom-op packer;
        here it selects ``packing_strategy="first_fit"``.
      apply_length_check: raise when a task feature is longer than its task
        feature length; if False, trim it.
      bos_id: the id that starts every decoder input sequence.
      packing_strategy: ``"greedy"`` (seqio's exact layout; the default) or
        ``"first_fit"`` (denser). Overrides ``use_custom_packing_ops``.
      packing_window: examples per packing window; defaults to seqio's, the
        largest packed length.

    Raises:
      ValueError: an unknown packing strategy or a non-positive window.
    """

    TASK_FEATURES: ClassVar[Mapping[str, FeatureSpec]]
    MODEL_FEATURES: ClassVar[Mapping[str, FeatureSpec]]
    PACKING_FEATURE_DTYPES: ClassVar[Mapping[str, tf.DType]]

    def __init__(
        self,
        pack: bool = True,
        use_custom_packing_ops: bool = False,
        apply_length_check: bool = True,
        bos_id: int = 0,
        *,
        packing_strategy: str | None = None,
        packing_window: int | None = None,
    ) -> None:
        self.pack = bool(pack)
        self.use_custom_packing_ops = bool(use_custom_packing_ops)
        self.apply_length_check = bool(apply_length_check)
        self.bos_id = int(bos_id)
        strategy = packing_strategy or ("first_fit" if use_custom_packing_ops else "greedy")
        if strategy not in PACKING_STRATEGIES:
            raise ValueError(
                f"{type(self).__name__}: packing_strategy must be one of {PACKING_STRATEGIES}, got {strategy!r}"
            )
        if packing_window is not None and packing_window < 1:
            raise ValueError(f"{type(self).__name__}: packing_window must be >= 1, got {packing_window}")
        self.packing_strategy = strategy
        self.packing_window = packing_window

    @property
    def _name(self) -> str:
        return type(self).__name__

    def _required_task_features(self, task_feature_lengths: Mapping[str, int]) -> Mapping[str, FeatureSpec]:
        return self.TASK_FEATURES

    def validate_task_feature_lengths(self, task_feature_lengths: Mapping[str, int]) -> None:
        """Checks that ``task_feature_lengths`` names exactly the task features.

        Raises:
          ValueError: a feature is missing or extra, or a length is not a
            positive int; the message names the converter and the feature.
        """
        expected = set(self._required_task_features(task_feature_lengths))
        given = set(task_feature_lengths)
        if given - expected:
            raise ValueError(
                f"{self._name}: task_feature_lengths has features {sorted(given - expected)} that it does not "
                f"convert; expected exactly {sorted(expected)}"
            )
        if expected - given:
            raise ValueError(
                f"{self._name}: task_feature_lengths is missing features {sorted(expected - given)}; "
                f"expected exactly {sorted(expected)}"
            )
        for k, v in task_feature_lengths.items():
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(
                    f"{self._name}: task feature length of {k!r} must be a positive int, got {v!r}"
                )

    def validate_dataset(self, ds: tf.data.Dataset, task_feature_lengths: Mapping[str, int]) -> None:
        """Checks that ``ds`` has each needed feature with the right dtype and rank.

        Raises:
          ValueError: naming the converter, the feature, the expected and the
            actual value.
        """
        spec = ds.element_spec
        if not isinstance(spec, Mapping):
            raise ValueError(f"{self._name}: dataset elements must be dicts of features, got {spec}")
        for k, want in self._required_task_features(task_feature_lengths).items():
            if k not in spec:
                raise ValueError(
                    f"{self._name}: the dataset has no feature {k!r} (it has {sorted(spec)}); "
                    f"expected {sorted(self._required_task_features(task_feature_lengths))}"
                )
            if spec[k].dtype != want.dtype:
                raise ValueError(
                    f"{self._name}: feature {k!r} has dtype {spec[k].dtype.name}, expected {want.dtype.name}"
                )
            if spec[k].shape.rank != want.rank:
                raise ValueError(
                    f"{self._name}: feature {k!r} has rank {spec[k].shape.rank}, expected {want.rank}"
                )

    def _checked(self, feature: str, x: tf.Tensor, limit: int) -> tf.Tensor:
        """Returns ``x``, after asserting (or trimming to) ``limit`` tokens."""
        if not self.apply_length_check:
            return x[:limit]
        n = tf.shape(x)[0]
        with tf.control_dependencies([self._assert_fits(feature, n, limit)]):
            return tf.identity(x)

    def _assert_fits(self, feature: str, n: tf.Tensor, limit: int) -> tf.Operation:
        # seqio's wording first (code that matches on it keeps working), then
        # the converter, the actual length and what to do about it.
        return tf.debugging.Assert(
            n <= limit,
            [
                f"Feature '{feature}' has length not less than or equal to the expected length of "
                f"{limit} during input_validation:",
                f"{self._name} got length",
                n,
                "; shorten it earlier or construct the converter with apply_length_check=False to trim it",
            ],
        )

    def __call__(self, ds: tf.data.Dataset, task_feature_lengths: Mapping[str, int]) -> tf.data.Dataset:
        """Converts ``ds`` into a dataset of model features.

        Args:
          ds: unbatched task examples, dicts of 1-D int32 tensors.
          task_feature_lengths: task feature -> maximum length.

        Returns:
          Unbatched model examples; each feature int32 of static length
          ``get_model_feature_lengths(task_feature_lengths)[name]``.

        Raises:
          ValueError: a missing or extra task feature, a wrong dtype or rank.
          tf.errors.InvalidArgumentError: (while iterating) an example longer
            than its task feature length when ``apply_length_check``.
        """
        self.validate_task_feature_lengths(task_feature_lengths)
        self.validate_dataset(ds, task_feature_lengths)
        lengths = dict(task_feature_lengths)
        packed_lengths = self._packed_lengths(lengths)
        window = self.packing_window or max(packed_lengths.values())
        if self._can_batch_directly(ds, lengths):
            # Fast path: no per-example map at all. A padded batch is as wide as
            # its longest example, so checking the width checks every example.
            def prepare(batch):
                return {k: self._checked_batch(k, batch[k], n) for k, n in lengths.items()}
        else:
            ds = ds.map(lambda ex: self._prepare(ex, lengths), num_parallel_calls=tf.data.AUTOTUNE)

            def prepare(batch):
                return batch

        if self.pack:
            return packed_rows(
                ds,
                packed_lengths,
                self.packing_strategy,
                window,
                convert=lambda rows: self._convert(rows, lengths),
                prepare=prepare,
            )

        def pad_and_convert(batch):
            batch = prepare(batch)
            rows = {}
            for k, n in packed_lengths.items():
                x = batch[k][:, :n]
                rows[k] = tf.ensure_shape(tf.pad(x, [[0, 0], [0, n - tf.shape(x)[1]]]), [None, n])
            return self._convert(rows, lengths)

        # Unpacked rows are independent: the batch only vectorises the work.
        ds = _padded_batch_all(ds, _UNPACKED_BATCH)
        return ds.map(pad_and_convert, num_parallel_calls=tf.data.AUTOTUNE).unbatch()

    # Converters whose packed features are their task features, unchanged.
    _ONE_TO_ONE: ClassVar[bool] = True

    def _can_batch_directly(self, ds: tf.data.Dataset, lengths: Mapping[str, int]) -> bool:
        if not (self._ONE_TO_ONE and self.apply_length_check):
            return False
        return all(
            isinstance(s, tf.TensorSpec) and s.shape.rank is not None for s in ds.element_spec.values()
        )

    def _checked_batch(self, feature: str, x: tf.Tensor, limit: int) -> tf.Tensor:
        """Asserts that a padded ``[n, width]`` batch has ``width <= limit``."""
        width = tf.shape(x)[1]
        with tf.control_dependencies([self._assert_fits(feature, width, limit)]):
            return tf.identity(x)

    @abc.abstractmethod
    def _prepare(self, ex: Mapping[str, tf.Tensor], lengths: Mapping[str, int]) -> dict[str, tf.Tensor]:
        """Per example: length-checks task features and returns the 1-D features to pad or pack."""

    @abc.abstractmethod
    def _packed_lengths(self, lengths: Mapping[str, int]) -> dict[str, int]:
        """Length of each feature that ``_prepare`` returns, once padded or packed."""

    @abc.abstractmethod
    def _convert(self, rows: Mapping[str, tf.Tensor], lengths: Mapping[str, int]) -> dict[str, tf.Tensor]:
        """Maps padded (``[L]``) or packed (``[rows, L]``) features to model features.

        When packed, ``rows`` also has ``<k>_segment_ids`` and ``<k>_positions``.
        """

    @abc.abstractmethod
    def get_model_feature_lengths(self, task_feature_lengths: Mapping[str, int]) -> dict[str, int]:
        """Returns the length of every model feature for these task lengths."""


# seqio spells it FeatureConverter.FeatureSpec.
FeatureConverter.FeatureSpec = FeatureSpec  # type: ignore[attr-defined]
