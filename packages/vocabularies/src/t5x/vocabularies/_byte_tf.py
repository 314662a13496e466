"""ByteVocabulary's tf path: plain TensorFlow ops, no Python call per batch."""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from t5x.vocabularies import _tf

_OWNER = "ByteVocabulary"


def encode(s: Any, first_byte_id: int) -> tf.Tensor | tf.RaggedTensor:
    """UTF-8 bytes of every string of ``s``, shifted by ``first_byte_id`` (see ``_tf.encode_strings``)."""

    def encode_flat(strings: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        pieces = tf.strings.bytes_split(strings)  # [n, (bytes)] one-byte strings
        raw = tf.reshape(tf.io.decode_raw(pieces.flat_values, tf.uint8), [-1])
        return tf.cast(raw, tf.int32) + first_byte_id, tf.cast(pieces.row_splits, tf.int64)

    return _tf.encode_strings(s, encode_flat, owner=_OWNER)


def decode(ids: Any, *, eos_id: int, first_byte_id: int) -> tf.Tensor | tf.RaggedTensor:
    """Text of every row of ``ids`` under ByteVocabulary's decoding rules (see ``_tf.decode_ids``)."""
    table = tf.constant([bytes([b]) for b in range(256)])

    def decode_rows(values: tf.Tensor, splits: tf.Tensor) -> tf.Tensor:
        values = tf.cast(values, tf.int64)
        keep, row_of, rows = _tf.before_eos(values, splits, eos_id)
        keep &= (values >= first_byte_id) & (values < first_byte_id + 256)
        kept_bytes = tf.gather(table, tf.boolean_mask(values, keep) - first_byte_id)
        joined = tf.strings.unsorted_segment_join(kept_bytes, tf.boolean_mask(row_of, keep), rows)
        # TF's transcoder replaces invalid UTF-8 exactly as Python's errors="replace"
        # does (one U+FFFD per maximal invalid subsequence); the tests check this.
        return tf.strings.unicode_transcode(
            joined,
            "UTF-8",
            "UTF-8",
            errors="replace",
            replacement_char=0xFFFD,
            replace_control_characters=False,
        )

    return _tf.decode_ids(ids, decode_rows, owner=_OWNER)
