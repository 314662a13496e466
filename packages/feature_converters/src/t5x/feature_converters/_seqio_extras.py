"""seqio's remaining converters: pass-through features, pre-packed data, prefix + suffix LM.

* ``passthrough_features={name: FeatureSpec}`` (EncDec, PrefixLM, Decoder): the
  named task features are trimmed/padded to their task length and copied to
  the model features unchanged. seqio forbids them with packing; so do we.
  Only rank-1 pass-through features are supported.
* ``PrePackedEncDecFeatureConverter``: examples already carry
  ``inputs/targets_segment_ids`` and ``_positions``; they are padded, not packed.
* ``PrePackedLMFeatureConverter`` / ``PrePackedPrefixLMFeatureConverter``:
  examples already are model features; they are filtered and given their
  static length.
* ``PrefixSuffixLMFeatureConverter``: ``inputs`` + ``targets`` + ``suffixes``
  as one decoder sequence; ``target_suffix_weights`` marks the suffix tokens
  (or the targets when an example has no suffix).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import tensorflow as tf

from t5x.feature_converters import _converters as _c
from t5x.feature_converters._base import FeatureConverter, FeatureSpec
from t5x.feature_converters._ops import make_autoregressive_inputs, non_padding_position

_INT = FeatureSpec(dtype=tf.int32)


class _PassThrough:
    """Adds seqio's ``passthrough_features`` to a converter (unpacked only)."""

    _passthrough_features: dict[str, FeatureSpec]

    def _init_passthrough(self, passthrough_features: Mapping[str, Any] | None) -> None:
        self._passthrough_features = dict(passthrough_features or {})
        if self._passthrough_features and self.pack:  # type: ignore[attr-defined]
            raise ValueError(f"{type(self).__name__}: Packing is incompatible with pass-through features.")
        for name, spec in self._passthrough_features.items():
            if getattr(spec, "rank", 1) != 1:
                raise ValueError(f"{type(self).__name__}: pass-through feature {name!r} must be rank 1")

    def _split(self, lengths: Mapping[str, int]) -> tuple[dict[str, int], dict[str, int]]:
        own = {k: v for k, v in lengths.items() if k not in self._passthrough_features}
        extra = {k: v for k, v in lengths.items() if k in self._passthrough_features}
        return own, extra

    def _required_task_features(self, lengths: Mapping[str, int]) -> Mapping[str, FeatureSpec]:
        return {**super()._required_task_features(lengths), **self._passthrough_features}  # type: ignore[misc]

    def _can_batch_directly(self, ds: tf.data.Dataset, lengths: Mapping[str, int]) -> bool:
        return not self._passthrough_features and super()._can_batch_directly(ds, lengths)  # type: ignore[misc]

    def _prepare(self, ex: Mapping[str, tf.Tensor], lengths: Mapping[str, int]) -> dict[str, tf.Tensor]:
        own, extra = self._split(lengths)
        out = super()._prepare(ex, own)  # type: ignore[misc]
        for k, n in extra.items():
            out[k] = self._checked(k, ex[k], n)  # type: ignore[attr-defined]
        return out

    def _packed_lengths(self, lengths: Mapping[str, int]) -> dict[str, int]:
        own, extra = self._split(lengths)
        return {**super()._packed_lengths(own), **extra}  # type: ignore[misc]

    def _convert(self, rows: Mapping[str, tf.Tensor], lengths: Mapping[str, int]) -> dict[str, tf.Tensor]:
        own, extra = self._split(lengths)
        out = super()._convert(rows, own)  # type: ignore[misc]
        out.update({k: rows[k] for k in extra})
        return out

    def get_model_feature_lengths(self, task_feature_lengths: Mapping[str, int]) -> dict[str, int]:
        own, extra = self._split(task_feature_lengths)
        return {**super().get_model_feature_lengths(own), **extra}  # type: ignore[misc]

    def _convert_example(self, features: Mapping[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        """seqio's per-example hook: the model features of one padded (or packed) example.

        ``features`` are what ``_prepare`` produced, padded: for the prefix LM
        the concatenated ``targets``, ``inputs_width`` and ``inputs_width_add_pos``.
        """
        # Only the pass-through names of ``lengths`` matter to _convert.
        return self._convert(features, dict.fromkeys(self._passthrough_features, 0))


class EncDecFeatureConverter(_PassThrough, _c.EncDecFeatureConverter):
    """The encoder-decoder converter, with seqio's ``passthrough_features``."""

    def __init__(self, *args: Any, passthrough_features: Mapping[str, Any] | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._init_passthrough(passthrough_features)


class PrefixLMFeatureConverter(_PassThrough, _c.PrefixLMFeatureConverter):
    """The prefix-LM converter, with seqio's ``passthrough_features``."""

    def __init__(
        self,
        loss_on_targets_only: bool = True,
        passthrough_features: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ):
        super().__init__(loss_on_targets_only=loss_on_targets_only, **kwargs)
        self._init_passthrough(passthrough_features)


class PrefixSuffixLMFeatureConverter(_c.PrefixLMFeatureConverter):
    """Prefix LM over ``inputs`` + ``targets`` + ``suffixes``, marking the suffix.

    Model features: the prefix LM's, plus ``target_suffix_weights`` (1 on the
    ``suffixes`` tokens; when an example's suffix is empty, 1 on its targets).
    The loss (with ``loss_on_targets_only``) covers targets and suffix. Every
    model feature has length ``inputs + targets + suffixes``.
    """

    TASK_FEATURES: ClassVar[Mapping[str, FeatureSpec]] = {"inputs": _INT, "targets": _INT, "suffixes": _INT}
    MODEL_FEATURES: ClassVar[Mapping[str, FeatureSpec]] = {
        **_c.PrefixLMFeatureConverter.MODEL_FEATURES,
        "target_suffix_weights": _INT,
    }

    def _prepare(self, ex, lengths):
        inputs = self._checked("inputs", ex["inputs"], lengths["inputs"])
        targets = self._checked("targets", ex["targets"], lengths["targets"])
        suffixes = self._checked("suffixes", ex["suffixes"], lengths["suffixes"])
        if not self.apply_length_check:
            inputs, targets, suffixes = ex["inputs"], ex["targets"], ex["suffixes"]
        rest = tf.concat([targets, suffixes], axis=0)
        rest = tf.cond(tf.size(rest) > 0, lambda: rest, lambda: tf.zeros([1], tf.int32))
        total = self._packed_lengths(lengths)["targets"]
        width = tf.size(inputs)
        size = tf.minimum(width + tf.size(rest), total)
        # 1 on inputs (and targets when there is a suffix), 2 on what target_suffix_weights marks.
        with_suffix = tf.concat(
            [tf.ones_like(inputs), tf.ones_like(targets), tf.fill([tf.size(suffixes)], 2)], 0
        )
        without_suffix = tf.concat([tf.ones_like(inputs), tf.fill([tf.size(rest)], 2)], 0)
        marks = tf.cond(tf.size(suffixes) > 0, lambda: with_suffix, lambda: without_suffix)
        return {
            "targets": tf.concat([inputs, rest], axis=0)[:total],
            "inputs_width": tf.fill([size], tf.where(width == 0, -1, width)),
            "inputs_width_add_pos": tf.fill([size], width + 1),
            "target_suffix_weights": marks[:total],
        }

    def _packed_lengths(self, lengths):
        total = lengths["inputs"] + lengths["targets"] + lengths["suffixes"]
        return {
            k: total for k in ("targets", "inputs_width", "inputs_width_add_pos", "target_suffix_weights")
        }

    def _convert(self, rows, lengths):
        out = super()._convert(rows, lengths)
        out["target_suffix_weights"] = tf.cast(tf.equal(rows["target_suffix_weights"], 2), tf.int32)
        return out

    def get_model_feature_lengths(self, task_feature_lengths: Mapping[str, int]) -> dict[str, int]:
        total = sum(task_feature_lengths[k] for k in ("inputs", "targets", "suffixes"))
        out = _c.LMFeatureConverter.get_model_feature_lengths(self, {"targets": total})
        out["decoder_causal_attention"] = total
        out["target_suffix_weights"] = total
        return out


class DecoderFeatureConverter(_c.DecoderFeatureConverter):
    """Decoder-only: prefix+suffix LM with ``suffixes``, prefix LM with ``inputs``, else LM."""

    def __init__(
        self,
        loss_on_targets_only: bool = True,
        passthrough_features: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ):
        super().__init__(loss_on_targets_only=loss_on_targets_only, **kwargs)
        if passthrough_features and self.pack:
            raise ValueError("DecoderFeatureConverter: Packing is incompatible with pass-through features.")
        self.prefixlm_feature_converter = PrefixLMFeatureConverter(
            loss_on_targets_only=loss_on_targets_only, passthrough_features=passthrough_features, **kwargs
        )
        self.prefixsuffixlm_feature_converter = PrefixSuffixLMFeatureConverter(
            loss_on_targets_only=loss_on_targets_only, **kwargs
        )

    def _delegate(self, task_feature_lengths: Mapping[str, int]) -> FeatureConverter:
        if "suffixes" in task_feature_lengths:
            return self.prefixsuffixlm_feature_converter
        return super()._delegate(task_feature_lengths)


class PrePackedEncDecFeatureConverter(_c.EncDecFeatureConverter):
    """Encoder-decoder on examples that are packed already (segment ids and positions given).

    Raises:
      ValueError: constructed with ``pack=True``.
    """

    TASK_FEATURES: ClassVar[Mapping[str, FeatureSpec]] = {
        "inputs": _INT,
        "targets": _INT,
        "inputs_positions": _INT,
        "inputs_segment_ids": _INT,
        "targets_positions": _INT,
        "targets_segment_ids": _INT,
    }
    MODEL_FEATURES: ClassVar[Mapping[str, FeatureSpec]] = {
        **_c.EncDecFeatureConverter.MODEL_FEATURES,
        **{k: _INT for k in _c.EncDecFeatureConverter.PACKING_FEATURE_DTYPES},
    }
    _ONE_TO_ONE: ClassVar[bool] = False

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("pack", False)
        super().__init__(**kwargs)
        if self.pack:
            raise ValueError("PrePackedEncDecFeatureConverter: pack=True is not allowed (the data is packed)")

    def _prepare(self, ex, lengths):
        return {k: self._checked(k, ex[k], lengths[k]) for k in self.TASK_FEATURES}

    def _packed_lengths(self, lengths):
        return {k: lengths[k] for k in self.TASK_FEATURES}

    def _convert(self, rows, lengths):
        targets = rows["targets"]
        return {
            "encoder_input_tokens": rows["inputs"],
            "decoder_target_tokens": targets,
            "decoder_input_tokens": make_autoregressive_inputs(
                targets, sequence_id=rows["targets_segment_ids"], bos_id=self.bos_id
            ),
            "decoder_loss_weights": non_padding_position(targets),
            "encoder_segment_ids": rows["inputs_segment_ids"],
            "decoder_segment_ids": rows["targets_segment_ids"],
            "encoder_positions": rows["inputs_positions"],
            "decoder_positions": rows["targets_positions"],
        }

    def get_model_feature_lengths(self, task_feature_lengths: Mapping[str, int]) -> dict[str, int]:
        enc, dec = task_feature_lengths["inputs"], task_feature_lengths["targets"]
        return {
            "encoder_input_tokens": enc,
            "decoder_target_tokens": dec,
            "decoder_input_tokens": dec,
            "decoder_loss_weights": dec,
            "encoder_segment_ids": enc,
            "decoder_segment_ids": dec,
            "encoder_positions": enc,
            "decoder_positions": dec,
        }


class PrePackedLMFeatureConverter:
    """Examples that are decoder model features already: keeps ``BATCH_FEATURES`` at the targets length."""

    BATCH_FEATURES: ClassVar[tuple[str, ...]] = (
        "decoder_input_tokens",
        "decoder_loss_weights",
        "decoder_positions",
        "decoder_segment_ids",
        "decoder_target_tokens",
    )

    def __init__(self, **unused_kwargs: Any) -> None:
        pass

    def _length(self, task_feature_lengths: Mapping[str, int]) -> int:
        return task_feature_lengths["targets"]

    def __call__(self, ds: tf.data.Dataset, task_feature_lengths: Mapping[str, int]) -> tf.data.Dataset:
        """Filters each example to ``BATCH_FEATURES`` and sets their static length.

        Raises:
          ValueError: a batch feature is missing from the dataset (names it).
        """
        missing = [k for k in self.BATCH_FEATURES if k not in ds.element_spec]
        if missing:
            raise ValueError(
                f"{type(self).__name__}: the dataset lacks {missing} (it has {sorted(ds.element_spec)})"
            )
        n = self._length(task_feature_lengths)
        return ds.map(lambda ex: {k: tf.ensure_shape(ex[k], [n]) for k in self.BATCH_FEATURES})

    def get_model_feature_lengths(self, task_feature_lengths: Mapping[str, int]) -> dict[str, int]:
        n = self._length(task_feature_lengths)
        return dict.fromkeys(self.BATCH_FEATURES, n)


class PrePackedPrefixLMFeatureConverter(PrePackedLMFeatureConverter):
    """Prefix-LM variant: adds ``decoder_causal_attention``; the length is inputs + targets."""

    BATCH_FEATURES: ClassVar[tuple[str, ...]] = (
        *PrePackedLMFeatureConverter.BATCH_FEATURES,
        "decoder_causal_attention",
    )

    def _length(self, task_feature_lengths: Mapping[str, int]) -> int:
        return task_feature_lengths["inputs"] + task_feature_lengths["targets"]


__all__ = [
    "DecoderFeatureConverter",
    "EncDecFeatureConverter",
    "PrePackedEncDecFeatureConverter",
    "PrePackedLMFeatureConverter",
    "PrePackedPrefixLMFeatureConverter",
    "PrefixLMFeatureConverter",
    "PrefixSuffixLMFeatureConverter",
]
