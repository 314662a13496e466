"""Noise masks and span-to-sentinel functions of the T5 denoising objectives.

The algorithms follow the T5 library (Raffel et al., 2019) exactly, so that
given the same stateless seeds they produce the same masks and ids.
"""

from __future__ import annotations

from typing import Any

from t5x.tasks._lazy_tf import tf
from t5x.tasks._utils import stateless_shuffle


def random_spans_helper(
    inputs_length: int,
    noise_density: float,
    mean_noise_span_length: float,
    extra_tokens_per_span_inputs: int = 1,
    extra_tokens_per_span_targets: int = 1,
) -> tuple[int, int]:
    """Finds how many raw tokens to corrupt so the inputs fill ``inputs_length``.

    Returns:
      (tokens_length, targets_length): raw tokens to cut per example, and the
      resulting targets length (sentinels and EOS included). For 512 inputs at
      density 0.15 and mean span 3 this is (568, 114).
    """

    def lengths(tokens_length: int) -> tuple[int, int]:
        num_noise = round(tokens_length * noise_density)
        num_nonnoise = tokens_length - num_noise
        num_spans = round(num_noise / mean_noise_span_length)
        # Inputs keep the non-noise tokens, one sentinel per span and EOS.
        return (
            num_nonnoise + num_spans * extra_tokens_per_span_inputs + 1,
            num_noise + num_spans * extra_tokens_per_span_targets + 1,
        )

    if inputs_length < 2:
        raise ValueError(f"random_spans_helper: inputs_length must be >= 2, got {inputs_length}")
    tokens_length = inputs_length - 1
    while lengths(tokens_length + 1)[0] <= inputs_length:
        tokens_length += 1
    _, targets_length = lengths(tokens_length)
    # At density 0.5 the targets would be one longer than the inputs.
    if noise_density == 0.5 and targets_length > inputs_length:
        tokens_length -= 1
        targets_length -= 1
    return tokens_length, targets_length


def num_noise_spans(length: int, noise_density: float, mean_noise_span_length: float) -> int:
    """How many noise spans ``random_spans_noise_mask`` makes for ``length`` tokens."""
    length = max(length, 2)
    num_noise = min(max(round(length * noise_density), 1), length - 1)
    return max(round(num_noise / mean_noise_span_length), 1)


def random_spans_noise_mask(
    length: Any,
    noise_density: float,
    seeds: Any,
    mean_noise_span_length: float = 3.0,
    random_roll: bool = False,
) -> tf.Tensor:
    """Marks about ``noise_density`` of ``length`` tokens as noise, in spans.

    The number of noise tokens and spans is fixed by ``length``; span lengths
    are a random composition of those numbers. Noise spans and non-noise spans
    alternate, starting with non-noise.

    Args:
      length: int32 scalar, the number of tokens.
      noise_density: the fraction of noise tokens.
      seeds: int [2, 2] stateless seeds.
      mean_noise_span_length: the mean length of a noise span.
      random_roll: roll the mask by a random offset (removes the bias towards
        non-noise at the start).

    Returns:
      a bool tensor of shape [length].
    """
    if noise_density == 0.0:
        return tf.zeros([length], tf.bool)
    orig_length = length
    # Lengths 0 and 1 would give no room for both noise and non-noise.
    length = tf.maximum(length, 2)
    num_noise = tf.cast(tf.round(tf.cast(length, tf.float32) * noise_density), tf.int32)
    num_noise = tf.minimum(tf.maximum(num_noise, 1), length - 1)
    num_spans = tf.cast(tf.round(tf.cast(num_noise, tf.float32) / mean_noise_span_length), tf.int32)
    num_spans = tf.maximum(num_spans, 1)
    num_nonnoise = length - num_noise

    def segment_lengths(num_items: tf.Tensor, num_segments: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
        starts = tf.cast(tf.range(num_items - 1) < num_segments - 1, tf.int32)
        first_in_segment = tf.pad(stateless_shuffle(starts, seed), [[1, 0]])
        segment_id = tf.cumsum(first_in_segment)
        return tf.math.segment_sum(tf.ones_like(segment_id), segment_id)

    noise_lengths = segment_lengths(num_noise, num_spans, seeds[0])
    nonnoise_lengths = segment_lengths(num_nonnoise, num_spans, seeds[1])
    interleaved = tf.reshape(tf.stack([nonnoise_lengths, noise_lengths], axis=1), [num_spans * 2])
    span_starts = tf.cumsum(interleaved)[:-1]
    indicator = tf.math.unsorted_segment_sum(tf.ones_like(span_starts), span_starts, length)
    is_noise = tf.equal(tf.cumsum(indicator) % 2, 1)
    mask = is_noise[:orig_length]
    if random_roll:
        roll_seed = (seeds[0][0] + seeds[1][1], seeds[0][1] - seeds[1][0])
        offset = tf.random.stateless_uniform([1], seed=roll_seed, dtype=tf.int32, minval=0, maxval=length)[0]
        mask = tf.roll(mask, shift=offset, axis=0)
    return mask


def iid_noise_mask(length: Any, noise_density: float, seeds: Any) -> tf.Tensor:
    """Marks each token as noise independently with probability ``noise_density``."""
    return tf.random.stateless_uniform([length], seed=seeds[0]) < noise_density


def random_prefix_noise_mask(length: Any, noise_density: float, seeds: Any) -> tf.Tensor:
    """Marks a random-length prefix as noise (the prefix LM split).

    The prefix holds between ``round((1 - 2 * noise_density) * (length - 1))``
    (at least 1) and ``length - 1`` tokens, uniformly.
    """
    if noise_density > 0.5:
        raise ValueError(f"random_prefix_noise_mask: noise_density must be <= 0.5, got {noise_density}")
    max_input = length - 1
    min_input = tf.minimum(
        max_input,
        tf.maximum(
            1, tf.cast(tf.math.round((1 - 2 * noise_density) * tf.cast(max_input, tf.float32)), tf.int32)
        ),
    )
    num_input = tf.random.stateless_uniform(
        [], minval=min_input, maxval=max_input + 1, dtype=tf.int32, seed=seeds[0]
    )
    return tf.range(length, dtype=tf.int32) < num_input


def sentinel_id(vocabulary: Any) -> int:
    """The first sentinel id: the top of the vocabulary (``<extra_id_0>``)."""
    return vocabulary.vocab_size - 1


def noise_span_to_unique_sentinel(
    tokens: tf.Tensor, noise_mask: tf.Tensor, vocabulary: Any, seeds: Any
) -> tf.Tensor:
    """Replaces each noise span by one sentinel, counting down from the top id."""
    del seeds
    prev_is_noise = tf.pad(noise_mask[:-1], [[1, 0]])
    first_noise = tf.logical_and(noise_mask, tf.logical_not(prev_is_noise))
    subsequent_noise = tf.logical_and(noise_mask, prev_is_noise)
    sentinel = sentinel_id(vocabulary) + 1 - tf.cumsum(tf.cast(first_noise, tokens.dtype))
    tokens = tf.where(first_noise, sentinel, tokens)
    return tf.boolean_mask(tokens, tf.logical_not(subsequent_noise))


def nonnoise_span_to_unique_sentinel(
    tokens: tf.Tensor, noise_mask: tf.Tensor, vocabulary: Any, seeds: Any
) -> tf.Tensor:
    """Replaces each non-noise span by one sentinel (the targets of span corruption)."""
    return noise_span_to_unique_sentinel(tokens, tf.logical_not(noise_mask), vocabulary, seeds)


def drop_noise_tokens(tokens: tf.Tensor, noise_mask: tf.Tensor, vocabulary: Any, seeds: Any) -> tf.Tensor:
    """Keeps the non-noise tokens."""
    del vocabulary, seeds
    return tf.boolean_mask(tokens, tf.logical_not(noise_mask))


def drop_nonnoise_tokens(tokens: tf.Tensor, noise_mask: tf.Tensor, vocabulary: Any, seeds: Any) -> tf.Tensor:
    """Keeps the noise tokens."""
    del vocabulary, seeds
    return tf.boolean_mask(tokens, noise_mask)
