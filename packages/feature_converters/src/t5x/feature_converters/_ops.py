"""Small tensor ops shared by the converters: shifting, padding, masks."""

from __future__ import annotations

import tensorflow as tf


def non_padding_position(tensor: tf.Tensor, dtype: tf.DType = tf.int32, pad_id: int = 0) -> tf.Tensor:
    """Marks the positions of ``tensor`` that are not padding.

    Args:
      tensor: token ids, any shape.
      dtype: dtype of the returned mask.
      pad_id: the padding id.

    Returns:
      A tensor shaped like ``tensor``: 1 where ``tensor != pad_id``, else 0.
    """
    return tf.cast(tf.not_equal(tensor, pad_id), dtype)


def _shift_right(x: tf.Tensor, fill: int | tf.Tensor) -> tf.Tensor:
    """Shifts the last axis of ``x`` right by one, filling position 0 with ``fill``."""
    first = tf.fill(tf.shape(x[..., :1]), tf.cast(fill, x.dtype))
    return tf.concat([first, x[..., :-1]], axis=-1)


def make_autoregressive_inputs(
    targets: tf.Tensor,
    sequence_id: tf.Tensor | None = None,
    output_dtype: tf.DType | None = None,
    bos_id: int = 0,
) -> tf.Tensor:
    """Makes decoder inputs from targets: shifted right by one, BOS first.

    With ``sequence_id`` (packed rows), every position whose segment id differs
    from the previous position's (the previous of position 0 counting as segment
    0) gets ``bos_id`` instead of the previous token, so no packed segment sees
    the end of the one before it. This is seqio's rule, including its treatment
    of padding: the first padding position after a segment also gets ``bos_id``.

    Args:
      targets: integer token ids, shape ``[..., length]``.
      sequence_id: optional segment ids, same shape as ``targets``.
      output_dtype: dtype of the result; defaults to ``targets.dtype``.
      bos_id: the id fed at the start of every sequence.

    Returns:
      The decoder inputs, shape ``[..., length]``.

    Raises:
      ValueError: ``targets`` is not numeric or ``sequence_id`` is not integer.
    """
    if not (targets.dtype.is_integer or targets.dtype.is_floating):
        raise ValueError(
            f"make_autoregressive_inputs: targets must be numeric, got dtype {targets.dtype.name}"
        )
    output_dtype = output_dtype or targets.dtype
    inputs = tf.cast(_shift_right(targets, bos_id), output_dtype)
    if sequence_id is None:
        return inputs
    if not sequence_id.dtype.is_integer:
        raise ValueError(
            f"make_autoregressive_inputs: sequence_id must be an integer tensor, got dtype {sequence_id.dtype.name}"
        )
    first_in_segment = tf.not_equal(sequence_id, _shift_right(sequence_id, 0))
    return tf.where(first_in_segment, tf.cast(bos_id, output_dtype), inputs)


# seqio's old name for the same function.
autoregressive_inputs = make_autoregressive_inputs


def pad_to_length(x: tf.Tensor, length: int) -> tf.Tensor:
    """Trims or zero-pads the first axis of ``x`` to ``length`` (static).

    Args:
      x: a tensor of rank >= 1, shape ``[n, ...]``.
      length: the target length.

    Returns:
      Shape ``[length, ...]``.
    """
    x = x[:length]
    paddings = [[0, length - tf.shape(x)[0]]] + [[0, 0]] * (x.shape.rank - 1)
    out = tf.pad(x, paddings)
    out.set_shape([length, *x.shape.as_list()[1:]])
    return out
