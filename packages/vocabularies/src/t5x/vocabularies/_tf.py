"""Shape plumbing that lets a flat tokenizer serve any tf string/id tensor, dense or ragged.

Importing this module imports TensorFlow, so only the ``*_tf`` methods import it.
Python tokenizers run through ``tf.numpy_function`` on one flat batch per call
(so ``batch -> map(encode_tf) -> unbatch`` pays one Python round trip per batch,
not per string), and the tokenizer itself
(SentencePiece, Hugging Face ``tokenizers``) releases the GIL while it works, so
``Dataset.map(..., num_parallel_calls=AUTOTUNE)`` runs calls side by side.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf

# [n] strings -> ([total] int32 ids, [n + 1] int64 row splits), as tf tensors.
EncodeFlat = Callable[[tf.Tensor], tuple[tf.Tensor, tf.Tensor]]
# ([total] ids, [n + 1] row splits) -> [n] strings, as tf tensors.
DecodeRows = Callable[[tf.Tensor, tf.Tensor], tf.Tensor]


def numpy_encoder(fn: Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]) -> EncodeFlat:
    """Wraps a numpy ``[n] bytes -> (ids, row splits)`` function as an EncodeFlat."""

    def encode_flat(strings: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        values, splits = tf.numpy_function(fn, [strings], [tf.int32, tf.int64], stateful=False, name="encode")
        values.set_shape([None])
        splits.set_shape([None])
        return values, splits

    return encode_flat


def numpy_decoder(fn: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> DecodeRows:
    """Wraps a numpy ``(ids, row splits) -> [n] bytes`` function as a DecodeRows."""

    def decode_rows(values: tf.Tensor, splits: tf.Tensor) -> tf.Tensor:
        strings = tf.numpy_function(fn, [values, splits], tf.string, stateful=False, name="decode")
        strings.set_shape([None])
        return strings

    return decode_rows


def string_tensor(s: Any, owner: str) -> tf.Tensor | tf.RaggedTensor:
    """Converts ``s`` to a string tensor, raising TypeError naming ``owner`` otherwise."""
    if not isinstance(s, tf.RaggedTensor):
        try:
            s = tf.convert_to_tensor(s)
        except (TypeError, ValueError) as e:
            raise TypeError(f"{owner}.encode_tf: s must be a tf.string tensor, got {type(s).__name__}") from e
    if s.dtype != tf.string:
        raise TypeError(f"{owner}.encode_tf: s must be a tf.string tensor, got dtype {s.dtype.name}")
    return s


def id_tensor(ids: Any, owner: str) -> tf.Tensor | tf.RaggedTensor:
    """Converts ``ids`` to an integer tensor of rank >= 1, naming ``owner`` on failure."""
    if not isinstance(ids, tf.RaggedTensor):
        try:
            ids = tf.convert_to_tensor(ids)
        except (TypeError, ValueError) as e:
            raise TypeError(
                f"{owner}.decode_tf: ids must be an integer tensor, got {type(ids).__name__}"
            ) from e
    if not ids.dtype.is_integer:
        raise TypeError(f"{owner}.decode_tf: ids must be an integer tensor, got dtype {ids.dtype.name}")
    if ids.shape.rank == 0:
        raise ValueError(f"{owner}.decode_tf: ids must have a token dimension, got a scalar")
    return ids


def with_outer_shape(rt: tf.RaggedTensor, shape: tf.Tensor, rank: int) -> tf.RaggedTensor:
    """Reshapes a ``[prod(shape), (length)]`` ragged tensor to ``shape + [(length)]``."""
    for d in range(rank - 1, 0, -1):
        rt = tf.RaggedTensor.from_uniform_row_length(rt, shape[d], validate=False)
    return rt


def encode_strings(s: Any, encode_flat: EncodeFlat, *, owner: str) -> tf.Tensor | tf.RaggedTensor:
    """Applies ``encode_flat`` to every string of ``s``.

    Args:
      s: ``tf.string`` tensor of any rank, dense or ragged.
      encode_flat: ``[n]`` strings -> (``[total]`` int32 ids, ``[n + 1]`` int64 row splits).
      owner: the vocabulary's name, for error messages.

    Returns:
      ``[length]`` int32 for a scalar, else a ragged ``s.shape + [(length)]``.
    """
    s = string_tensor(s, owner)
    if isinstance(s, tf.RaggedTensor):
        return s.with_flat_values(encode_strings(s.flat_values, encode_flat, owner=owner))
    rank = s.shape.rank
    if rank is None:
        raise ValueError(f"{owner}.encode_tf: the rank of s must be known when the graph is built")
    values, splits = encode_flat(tf.reshape(s, [-1]))
    if rank == 0:
        return values
    rt = tf.RaggedTensor.from_row_splits(values, splits, validate=False)
    return with_outer_shape(rt, tf.shape(s, out_type=tf.int64), rank)


def _decode_dense(ids: tf.Tensor, decode_rows: DecodeRows) -> tf.Tensor:
    shape = tf.shape(ids, out_type=tf.int64)
    rows = tf.reduce_prod(shape[:-1])
    splits = tf.range(rows + 1, dtype=tf.int64) * shape[-1]
    strings = decode_rows(tf.reshape(ids, [-1]), splits)
    return tf.reshape(strings, shape[:-1])


def decode_ids(ids: Any, decode_rows: DecodeRows, *, owner: str) -> tf.Tensor | tf.RaggedTensor:
    """Applies ``decode_rows`` to every row of the last dimension of ``ids``.

    Args:
      ids: ``[..., length]`` integer tensor, dense or ragged.
      decode_rows: (``[total]`` ids, ``[n + 1]`` row splits) -> ``[n]`` strings.
      owner: the vocabulary's name, for error messages.

    Returns:
      ``tf.string`` tensor shaped ``ids.shape[:-1]`` (ragged where ``ids`` has
      ragged outer dimensions).
    """
    ids = id_tensor(ids, owner)
    if not isinstance(ids, tf.RaggedTensor):
        return _decode_dense(ids, decode_rows)
    outer = list(ids.nested_row_splits)
    if ids.flat_values.shape.rank == 1:
        strings = decode_rows(ids.flat_values, outer.pop())
    else:
        strings = _decode_dense(ids.flat_values, decode_rows)
    if not outer:
        return strings
    return tf.RaggedTensor.from_nested_row_splits(strings, outer, validate=False)


def before_eos(
    values: tf.Tensor, splits: tf.Tensor, eos_id: int | None
) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """Marks the ids that come before their row's first EOS.

    Args:
      values: ``[total]`` ids of all rows, concatenated.
      splits: ``[n + 1]`` row splits.
      eos_id: the EOS id, or None (then every id is kept).

    Returns:
      (``[total]`` bool mask, ``[total]`` int64 row of each id, int64 scalar ``n``).
    """
    splits = tf.cast(splits, tf.int64)
    rows = tf.size(splits, out_type=tf.int64) - 1
    row_of = tf.ragged.row_splits_to_segment_ids(splits, out_type=tf.int64)
    if eos_id is None:
        return tf.ones_like(values, tf.bool), row_of, rows
    position = tf.range(tf.size(values, out_type=tf.int64), dtype=tf.int64)
    # Each row's first EOS position; int64 max for rows without one (and empty rows).
    first_eos = tf.math.unsorted_segment_min(
        tf.where(tf.equal(values, tf.cast(eos_id, values.dtype)), position, position.dtype.max), row_of, rows
    )
    return position < tf.gather(first_eos, row_of), row_of, rows
