"""PassThroughVocabulary's tf path: plain TensorFlow ops."""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from t5x.vocabularies import _tf

_OWNER = "PassThroughVocabulary"


def encode(s: Any, size: int) -> tf.Tensor | tf.RaggedTensor:
    """Decimal ids of every string of ``s``; integer tensors pass through as int32."""
    if isinstance(s, tf.RaggedTensor | tf.Tensor) and s.dtype.is_integer:
        return s if s.dtype == tf.int32 else tf.cast(s, tf.int32)

    def encode_flat(strings: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        tokens = tf.strings.split(strings)  # [n, (tokens)], on whitespace runs like str.split()
        values = tf.strings.to_number(tokens.flat_values, tf.int32)
        checks = [
            tf.debugging.assert_non_negative(values, message=f"{_OWNER}.encode_tf: negative id"),
            tf.debugging.assert_less(values, size, message=f"{_OWNER}.encode_tf: id >= size={size}"),
        ]
        with tf.control_dependencies(checks):
            values = tf.identity(values)
        return values, tf.cast(tokens.row_splits, tf.int64)

    return _tf.encode_strings(s, encode_flat, owner=_OWNER)


def decode(ids: Any, eos_id: int | None) -> tf.Tensor | tf.RaggedTensor:
    """Every row of ``ids`` written in decimal, cut at EOS, without padding."""

    def decode_rows(values: tf.Tensor, splits: tf.Tensor) -> tf.Tensor:
        keep, row_of, rows = _tf.before_eos(values, splits, eos_id)
        keep &= tf.not_equal(values, 0)
        words = tf.strings.as_string(tf.boolean_mask(values, keep))
        return tf.strings.unsorted_segment_join(words, tf.boolean_mask(row_of, keep), rows, separator=" ")

    return _tf.decode_ids(ids, decode_rows, owner=_OWNER)
