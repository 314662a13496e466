"""The concrete converters: encoder-decoder, LM, prefix LM, decoder, encoder."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import tensorflow as tf

from t5x.feature_converters._base import FeatureConverter, FeatureSpec
from t5x.feature_converters._ops import make_autoregressive_inputs, non_padding_position

_INT = FeatureSpec(dtype=tf.int32)


def _decoder_features(conv: FeatureConverter, rows: Mapping[str, tf.Tensor]) -> dict[str, tf.Tensor]:
    """Decoder targets, shifted inputs, loss weights (and segments when packed)."""
    targets = rows["targets"]
    segments = rows.get("targets_segment_ids")
    out = {
        "decoder_target_tokens": targets,
        "decoder_input_tokens": make_autoregressive_inputs(targets, sequence_id=segments, bos_id=conv.bos_id),
        "decoder_loss_weights": non_padding_position(targets),
    }
    if conv.pack:
        out["decoder_segment_ids"] = segments
        out["decoder_positions"] = rows["targets_positions"]
    return out


class EncDecFeatureConverter(FeatureConverter):
    """Encoder-decoder: ``inputs`` feed the encoder, ``targets`` the decoder.

    Model features: ``encoder_input_tokens``, ``decoder_target_tokens``,
    ``decoder_input_tokens`` (targets shifted right, ``bos_id`` first and at
    every packed segment start), ``decoder_loss_weights`` (1 on non-padding
    targets); when packed also ``encoder_segment_ids``, ``encoder_positions``,
    ``decoder_segment_ids`` and ``decoder_positions``. Lengths: encoder features
    take the ``inputs`` length, decoder features the ``targets`` length.
    """

    TASK_FEATURES: ClassVar[Mapping[str, FeatureSpec]] = {"inputs": _INT, "targets": _INT}
    MODEL_FEATURES: ClassVar[Mapping[str, FeatureSpec]] = {
        "encoder_input_tokens": _INT,
        "decoder_target_tokens": _INT,
        "decoder_input_tokens": _INT,
        "decoder_loss_weights": _INT,
    }
    PACKING_FEATURE_DTYPES: ClassVar[Mapping[str, tf.DType]] = {
        "encoder_segment_ids": tf.int32,
        "decoder_segment_ids": tf.int32,
        "encoder_positions": tf.int32,
        "decoder_positions": tf.int32,
    }

    def _prepare(self, ex, lengths):
        return {k: self._checked(k, ex[k], lengths[k]) for k in ("inputs", "targets")}

    def _packed_lengths(self, lengths):
        return {"inputs": lengths["inputs"], "targets": lengths["targets"]}

    def _convert(self, rows, lengths):
        out = {"encoder_input_tokens": rows["inputs"], **_decoder_features(self, rows)}
        if self.pack:
            out["encoder_segment_ids"] = rows["inputs_segment_ids"]
            out["encoder_positions"] = rows["inputs_positions"]
        return out

    def get_model_feature_lengths(self, task_feature_lengths: Mapping[str, int]) -> dict[str, int]:
        """Encoder features get the ``inputs`` length, decoder ones the ``targets`` length."""
        enc, dec = task_feature_lengths["inputs"], task_feature_lengths["targets"]
        out = {
            "encoder_input_tokens": enc,
            "decoder_target_tokens": dec,
            "decoder_input_tokens": dec,
            "decoder_loss_weights": dec,
        }
        if self.pack:
            out.update(
                encoder_segment_ids=enc, encoder_positions=enc, decoder_segment_ids=dec, decoder_positions=dec
            )
        return out


class LMFeatureConverter(FeatureConverter):
    """Decoder-only language model on ``targets`` alone.

    Model features: ``decoder_target_tokens``, ``decoder_input_tokens``,
    ``decoder_loss_weights``; when packed also ``decoder_segment_ids`` and
    ``decoder_positions``; all of the ``targets`` length.
    """

    TASK_FEATURES: ClassVar[Mapping[str, FeatureSpec]] = {"targets": _INT}
    MODEL_FEATURES: ClassVar[Mapping[str, FeatureSpec]] = {
        "decoder_target_tokens": _INT,
        "decoder_input_tokens": _INT,
        "decoder_loss_weights": _INT,
    }
    PACKING_FEATURE_DTYPES: ClassVar[Mapping[str, tf.DType]] = {
        "decoder_segment_ids": tf.int32,
        "decoder_positions": tf.int32,
    }

    def _prepare(self, ex, lengths):
        return {"targets": self._checked("targets", ex["targets"], lengths["targets"])}

    def _packed_lengths(self, lengths):
        return {"targets": lengths["targets"]}

    def _convert(self, rows, lengths):
        return _decoder_features(self, rows)

    def get_model_feature_lengths(self, task_feature_lengths: Mapping[str, int]) -> dict[str, int]:
        """All decoder features get the ``targets`` length."""
        n = task_feature_lengths["targets"]
        names = ["decoder_target_tokens", "decoder_input_tokens", "decoder_loss_weights"]
        if self.pack:
            names += ["decoder_segment_ids", "decoder_positions"]
        return dict.fromkeys(names, n)


class PrefixLMFeatureConverter(LMFeatureConverter):
    """Decoder-only model on ``inputs`` + ``targets`` as one sequence.

    ``decoder_causal_attention`` is 1 on the prefix, where attention is
    bidirectional: the ``inputs`` tokens plus one more position, the one that
    reads the last input token and predicts the first target (seqio's rule).
    With ``loss_on_targets_only`` the loss weights are 0 on the prefix. An
    example with empty ``targets`` gets one 0 target, as in seqio. The model
    length is the sum of the ``inputs`` and ``targets`` lengths.

    Args:
      loss_on_targets_only: put loss only on the ``targets`` part.
      **kwargs: the ``FeatureConverter`` options.
    """

    TASK_FEATURES: ClassVar[Mapping[str, FeatureSpec]] = {"inputs": _INT, "targets": _INT}
    MODEL_FEATURES: ClassVar[Mapping[str, FeatureSpec]] = {
        **LMFeatureConverter.MODEL_FEATURES,
        "decoder_causal_attention": _INT,
    }
    _ONE_TO_ONE: ClassVar[bool] = False

    def __init__(self, loss_on_targets_only: bool = True, **kwargs: Any) -> None:
        self.loss_on_targets_only = bool(loss_on_targets_only)
        super().__init__(**kwargs)

    def _prepare(self, ex, lengths):
        inputs = self._checked("inputs", ex["inputs"], lengths["inputs"])
        targets = self._checked("targets", ex["targets"], lengths["targets"])
        # seqio concatenates the length-checked (not trimmed) features, then
        # trims the concatenation; that order matters with the check off.
        if not self.apply_length_check:
            inputs, targets = ex["inputs"], ex["targets"]
        targets = tf.cond(tf.size(targets) > 0, lambda: targets, lambda: tf.zeros([1], tf.int32))
        total = self._packed_lengths(lengths)["targets"]
        width = tf.size(inputs)
        size = tf.minimum(width + tf.size(targets), total)
        # seqio's packer measures a feature by its non-zero count, so a zero
        # width is stored as -1 while packing and restored afterwards.
        return {
            "targets": tf.concat([inputs, targets], axis=0)[:total],
            "inputs_width": tf.fill([size], tf.where(width == 0, -1, width)),
            "inputs_width_add_pos": tf.fill([size], width + 1),
        }

    def _packed_lengths(self, lengths):
        total = lengths["inputs"] + lengths["targets"]
        return {"targets": total, "inputs_width": total, "inputs_width_add_pos": total}

    def _convert(self, rows, lengths):
        out = _decoder_features(self, rows)
        targets = rows["targets"]
        if self.pack:
            positions = rows["targets_positions"]
        else:
            positions = tf.range(tf.shape(targets)[-1])
        width = tf.maximum(rows["inputs_width"], 0)
        out["decoder_causal_attention"] = tf.cast(positions < rows["inputs_width_add_pos"], tf.int32)
        if self.loss_on_targets_only:
            in_prefix = positions < width
            out["decoder_loss_weights"] = tf.cast(
                tf.math.logical_xor(in_prefix, tf.not_equal(targets, 0)), tf.int32
            )
        return out

    def get_model_feature_lengths(self, task_feature_lengths: Mapping[str, int]) -> dict[str, int]:
        """Every feature gets ``inputs`` + ``targets`` length."""
        total = task_feature_lengths["inputs"] + task_feature_lengths["targets"]
        out = super().get_model_feature_lengths({"targets": total})
        out["decoder_causal_attention"] = total
        return out


class DecoderFeatureConverter(FeatureConverter):
    """Decoder-only: a prefix LM when ``inputs`` are given, else a plain LM.

    The choice follows the keys of ``task_feature_lengths``.

    Args:
      loss_on_targets_only: for the prefix LM, see ``PrefixLMFeatureConverter``.
      **kwargs: the ``FeatureConverter`` options.
    """

    TASK_FEATURES: ClassVar[Mapping[str, FeatureSpec]] = {"targets": _INT}
    MODEL_FEATURES: ClassVar[Mapping[str, FeatureSpec]] = PrefixLMFeatureConverter.MODEL_FEATURES
    PACKING_FEATURE_DTYPES: ClassVar[Mapping[str, tf.DType]] = LMFeatureConverter.PACKING_FEATURE_DTYPES

    def __init__(self, loss_on_targets_only: bool = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.loss_on_targets_only = bool(loss_on_targets_only)
        self.prefixlm_feature_converter = PrefixLMFeatureConverter(
            loss_on_targets_only=loss_on_targets_only, **kwargs
        )
        self.strictlm_feature_converter = LMFeatureConverter(**kwargs)

    def _delegate(self, task_feature_lengths: Mapping[str, int]) -> FeatureConverter:
        if "inputs" in task_feature_lengths:
            return self.prefixlm_feature_converter
        return self.strictlm_feature_converter

    def __call__(self, ds: tf.data.Dataset, task_feature_lengths: Mapping[str, int]) -> tf.data.Dataset:
        """Converts with the prefix LM if ``inputs`` has a length, else with the LM."""
        return self._delegate(task_feature_lengths)(ds, task_feature_lengths)

    def _prepare(self, ex, lengths):  # pragma: no cover - delegated
        raise NotImplementedError

    def _packed_lengths(self, lengths):  # pragma: no cover - delegated
        raise NotImplementedError

    def _convert(self, rows, lengths):  # pragma: no cover - delegated
        raise NotImplementedError

    def get_model_feature_lengths(self, task_feature_lengths: Mapping[str, int]) -> dict[str, int]:
        """The chosen converter's model lengths."""
        return self._delegate(task_feature_lengths).get_model_feature_lengths(task_feature_lengths)


class EncoderFeatureConverter(FeatureConverter):
    """Encoder-only (BERT-style): aligned ``inputs`` and ``targets``.

    Model features: ``encoder_input_tokens``, ``encoder_target_tokens``,
    ``encoder_loss_weights`` (1 where the input is ``mask_id``); when packed also
    ``encoder_segment_ids`` and ``encoder_positions`` (from ``inputs``).

    Args:
      mask_id: the id of the mask token; loss is taken there.
      **kwargs: the ``FeatureConverter`` options.
    """

    TASK_FEATURES: ClassVar[Mapping[str, FeatureSpec]] = {"inputs": _INT, "targets": _INT}
    MODEL_FEATURES: ClassVar[Mapping[str, FeatureSpec]] = {
        "encoder_target_tokens": _INT,
        "encoder_input_tokens": _INT,
        "encoder_loss_weights": _INT,
    }
    PACKING_FEATURE_DTYPES: ClassVar[Mapping[str, tf.DType]] = {
        "encoder_segment_ids": tf.int32,
        "encoder_positions": tf.int32,
    }

    def __init__(self, mask_id: int, **kwargs: Any) -> None:
        self.mask_id = int(mask_id)
        super().__init__(**kwargs)

    def validate_task_feature_lengths(self, task_feature_lengths: Mapping[str, int]) -> None:
        """Also requires equal ``inputs`` and ``targets`` lengths (they are aligned)."""
        super().validate_task_feature_lengths(task_feature_lengths)
        if task_feature_lengths["inputs"] != task_feature_lengths["targets"]:
            raise ValueError(
                f"{self._name}: inputs and targets are aligned, so their lengths must be equal; got "
                f"inputs={task_feature_lengths['inputs']}, targets={task_feature_lengths['targets']}"
            )

    def _prepare(self, ex, lengths):
        return {k: self._checked(k, ex[k], lengths[k]) for k in ("inputs", "targets")}

    def _packed_lengths(self, lengths):
        return {"inputs": lengths["inputs"], "targets": lengths["targets"]}

    def _convert(self, rows, lengths):
        out = {
            "encoder_input_tokens": rows["inputs"],
            "encoder_target_tokens": rows["targets"],
            "encoder_loss_weights": tf.cast(tf.equal(rows["inputs"], self.mask_id), tf.int32),
        }
        if self.pack:
            out["encoder_segment_ids"] = rows["inputs_segment_ids"]
            out["encoder_positions"] = rows["inputs_positions"]
        return out

    def get_model_feature_lengths(self, task_feature_lengths: Mapping[str, int]) -> dict[str, int]:
        """All encoder features get the ``inputs`` length."""
        n = task_feature_lengths["inputs"]
        names = ["encoder_target_tokens", "encoder_input_tokens", "encoder_loss_weights"]
        if self.pack:
            names += ["encoder_segment_ids", "encoder_positions"]
        return dict.fromkeys(names, n)


class PassThroughFeatureConverter:
    """Returns the dataset unchanged (for data that is already in model form).

    Accepts and ignores the usual converter options, as seqio's does.
    """

    pack = False
    apply_length_check = False

    def __init__(self, **unused_kwargs: Any) -> None:
        del unused_kwargs

    def __call__(self, ds: tf.data.Dataset, task_feature_lengths: Mapping[str, int]) -> tf.data.Dataset:
        """Returns ``ds`` as it is."""
        del task_feature_lengths
        return ds

    def get_model_feature_lengths(self, task_feature_lengths: Mapping[str, int]) -> dict[str, int]:
        """The task lengths, unchanged."""
        return dict(task_feature_lengths)
