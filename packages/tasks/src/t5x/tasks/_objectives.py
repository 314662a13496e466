"""Dataset-level T5 pretraining preprocessors (span corruption and friends).

Each follows the T5 library's algorithm and defaults; random choices draw
stateless per-example seeds from the task's seed (see ``map_over_dataset``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from t5x.tasks._lazy_tf import tf
from t5x.tasks._noise import (
    drop_noise_tokens,
    drop_nonnoise_tokens,
    iid_noise_mask,
    noise_span_to_unique_sentinel,
    nonnoise_span_to_unique_sentinel,
    num_noise_spans,
    random_prefix_noise_mask,
    random_spans_helper,
    random_spans_noise_mask,
)
from t5x.tasks._preprocessors import OutputFeatures, append_eos
from t5x.tasks._utils import AUTOTUNE, map_over_dataset


def _check_sentinels(vocabulary: Any, needed: int, what: str) -> None:
    available = getattr(vocabulary, "extra_ids", 0) or 0
    if needed > available:
        raise ValueError(
            f"{what} needs up to {needed} sentinel ids per example but the vocabulary "
            f"({type(vocabulary).__name__}) has extra_ids={available}; use a vocabulary with at least "
            f"{needed} extra ids or shorter sequences / a larger mean noise span"
        )


def select_random_chunk(
    dataset: tf.data.Dataset,
    output_features: OutputFeatures,
    max_length: int | None = None,
    feature_key: str = "targets",
    additional_feature_keys: Sequence[str] | None = None,
    passthrough_feature_keys: Sequence[str] | None = None,
    sequence_length: Mapping[str, int] | None = None,
    uniform_random_start: bool = False,
    min_length: int | None = None,
) -> tf.data.Dataset:
    """Keeps one random chunk of at most ``max_length`` tokens per example.

    Empty examples are dropped. Without ``uniform_random_start`` the chunk is one
    of the aligned windows ``[k * length, (k + 1) * length)``.
    """
    if max_length is None and sequence_length is not None:
        max_length = sequence_length[feature_key] - int(output_features[feature_key].add_eos)
    if max_length is None:
        raise ValueError("select_random_chunk: give max_length or sequence_length")
    overlap = set([feature_key, *(additional_feature_keys or ())]) & set(passthrough_feature_keys or ())
    if overlap:
        raise ValueError(
            f"select_random_chunk: chunked features {sorted(overlap)} are also passthrough features"
        )

    @map_over_dataset(num_seeds=1)
    def chunk(x: Mapping[str, Any], seed: tf.Tensor) -> dict[str, Any]:
        seeds = tf.unstack(tf.random.experimental.stateless_split(seed))
        tokens = x[feature_key]
        n = tf.shape(tokens)[0]
        if min_length is not None:
            length = tf.random.stateless_uniform(
                [], minval=min_length, maxval=max_length, dtype=tf.int32, seed=seeds[0]
            )
        else:
            length = max_length
        if uniform_random_start:
            start = tf.random.stateless_uniform(
                [], minval=-length + 1, maxval=n, dtype=tf.int32, seed=seeds[1]
            )
            end = tf.minimum(start + length, n)
            start = tf.maximum(start, 0)
        else:
            num_segments = tf.cast(
                tf.math.ceil(tf.cast(n, tf.float32) / tf.cast(length, tf.float32)), tf.int32
            )
            start = length * tf.random.stateless_uniform(
                [], maxval=num_segments, dtype=tf.int32, seed=seeds[1]
            )
            end = tf.minimum(start + length, n)
        out = {feature_key: tokens[start:end]}
        for k in additional_feature_keys or ():
            out[k] = x[k][start:end]
        for k in passthrough_feature_keys or ():
            out[k] = x[k]
        return out

    dataset = dataset.filter(lambda x: tf.not_equal(tf.size(x[feature_key]), 0))
    return chunk(dataset)


def reduce_concat_tokens(
    dataset: tf.data.Dataset, feature_key: str = "targets", batch_size: int = 128
) -> tf.data.Dataset:
    """Concatenates the tokens of every ``batch_size`` consecutive examples.

    Only ``feature_key`` is kept; padding ids (0) are dropped.
    """
    dataset = dataset.map(lambda x: {feature_key: x[feature_key]}, num_parallel_calls=AUTOTUNE)
    dataset = dataset.padded_batch(batch_size, padded_shapes={feature_key: [-1]})

    def concat(x: Mapping[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        tokens = tf.reshape(x[feature_key], [-1])
        return {feature_key: tf.boolean_mask(tokens, tf.cast(tokens, tf.bool))}

    return dataset.map(concat, num_parallel_calls=AUTOTUNE)


def split_tokens(
    dataset: tf.data.Dataset,
    min_tokens_per_segment: int | None = None,
    max_tokens_per_segment: int | None = None,
    feature_key: str = "targets",
    additional_feature_keys: Sequence[str] | None = None,
    passthrough_feature_keys: Sequence[str] | None = None,
) -> tf.data.Dataset:
    """Splits each example into segments of ``max_tokens_per_segment`` tokens.

    With ``min_tokens_per_segment`` the segment length of each example is drawn
    log-uniformly from [min, max). The last segment may be shorter. Empty
    examples are dropped.
    """
    if max_tokens_per_segment is None:
        raise ValueError("split_tokens: max_tokens_per_segment is required")
    split_keys = [feature_key, *(additional_feature_keys or ())]
    passthrough = list(passthrough_feature_keys or ())
    if set(split_keys) & set(passthrough):
        raise ValueError(
            f"split_tokens: split features {split_keys} overlap passthrough features {passthrough}"
        )

    @map_over_dataset(num_seeds=1)
    def split(x: Mapping[str, Any], seed: tf.Tensor) -> tuple[dict[str, Any], dict[str, Any]]:
        tokens = x[feature_key]
        n = tf.shape(tokens)[0]
        if min_tokens_per_segment is None:
            length = tf.constant(max_tokens_per_segment, tf.int32)
        else:
            log_length = tf.random.stateless_uniform(
                [],
                minval=math.log(min_tokens_per_segment),
                maxval=math.log(max_tokens_per_segment),
                seed=seed,
            )
            length = tf.cast(tf.exp(log_length), tf.int32)
        num_segments = tf.cast(tf.math.ceil(tf.cast(n, tf.float32) / tf.cast(length, tf.float32)), tf.int32)
        padding = num_segments * length - n
        segments, lengths = {}, {}
        for k in split_keys:
            value = x[k]
            rest = tf.shape(value)[1:]
            pads = tf.concat([[[0, padding]], tf.zeros([value.shape.rank - 1, 2], tf.int32)], axis=0)
            segments[k] = tf.reshape(tf.pad(value, pads), tf.concat([[-1, length], rest], axis=0))
            lengths[k] = tf.concat([tf.repeat(length, num_segments - 1), [length - padding]], axis=0)
        for k in passthrough:
            segments[k] = tf.repeat(tf.expand_dims(x[k], 0), num_segments, axis=0)
        return segments, lengths

    def strip(segments: Mapping[str, Any], lengths: Mapping[str, Any]) -> dict[str, Any]:
        return {k: v[: lengths[k]] if k in lengths else v for k, v in segments.items()}

    dataset = dataset.filter(lambda x: tf.not_equal(tf.size(x[feature_key]), 0))
    return split(dataset).unbatch().map(strip, num_parallel_calls=AUTOTUNE)


def split_tokens_to_inputs_length(
    dataset: tf.data.Dataset,
    sequence_length: Mapping[str, int],
    output_features: OutputFeatures,
    **kwargs: Any,
) -> tf.data.Dataset:
    """``split_tokens`` to the inputs length (less one when inputs get EOS)."""
    max_tokens = sequence_length["inputs"] - int(output_features["inputs"].add_eos)
    return split_tokens(dataset, max_tokens_per_segment=max_tokens, **kwargs)


def split_tokens_to_targets_length(
    dataset: tf.data.Dataset,
    sequence_length: Mapping[str, int],
    output_features: OutputFeatures,
    **kwargs: Any,
) -> tf.data.Dataset:
    """``split_tokens`` to the targets length (less one when targets get EOS)."""
    max_tokens = sequence_length["targets"] - int(output_features["targets"].add_eos)
    return split_tokens(dataset, max_tokens_per_segment=max_tokens, **kwargs)


def denoise(
    dataset: tf.data.Dataset,
    output_features: OutputFeatures,
    noise_density: float,
    noise_mask_fn: Callable[..., tf.Tensor],
    inputs_fn: Callable[..., tf.Tensor],
    targets_fn: Callable[..., tf.Tensor] | None = None,
    passthrough_feature_keys: Sequence[str] | None = None,
    input_feature_key: str = "inputs",
) -> tf.data.Dataset:
    """Builds (inputs, targets) from the ``targets`` tokens with a noise mask.

    Raises:
      ValueError: inputs and targets use different vocabularies.
    """
    vocabulary = output_features["targets"].vocabulary
    if input_feature_key in output_features and output_features[input_feature_key].vocabulary != vocabulary:
        raise ValueError(
            f"denoise builds {input_feature_key!r} from 'targets' tokens, but the two features use different "
            "vocabularies"
        )
    passthrough = list(passthrough_feature_keys or ())
    if {input_feature_key, "targets"} & set(passthrough):
        raise ValueError(f"denoise: passthrough features cannot include {input_feature_key!r} or 'targets'")

    @map_over_dataset(num_seeds=1)
    def fn(x: Mapping[str, Any], seed: tf.Tensor) -> dict[str, Any]:
        seeds = tf.unstack(tf.random.experimental.stateless_split(seed, 6))
        tokens = x["targets"]
        mask = noise_mask_fn(tf.size(tokens), noise_density, seeds=seeds[:2])
        inputs = inputs_fn(tokens, mask, vocabulary, seeds=seeds[2:4])
        targets = targets_fn(tokens, mask, vocabulary, seeds=seeds[4:6]) if targets_fn else tokens
        return {input_feature_key: inputs, "targets": targets, **{k: x[k] for k in passthrough}}

    return fn(dataset)


def span_corruption(
    dataset: tf.data.Dataset,
    sequence_length: Mapping[str, int],
    output_features: OutputFeatures,
    mean_noise_span_length: float = 3.0,
    noise_density: float = 0.15,
    input_feature_key: str = "inputs",
    merge_examples_to_reduce_padding: bool = True,
    reserved_for_packing: int | None = None,
) -> tf.data.Dataset:
    """T5's final pretraining objective: unique sentinels for random spans.

    Takes tokenized ``targets`` (no EOS yet; follow with ``append_eos_after_trim``).
    With inputs length 512 the raw chunks hold 568 tokens, giving 512 inputs and
    114 targets after EOS.

    Raises:
      ValueError: ``sequence_length["targets"]`` is shorter than the objective
        produces, or the vocabulary has too few sentinel ids.
    """
    inputs_length = sequence_length[input_feature_key] - (reserved_for_packing or 0)
    tokens_length, targets_length = random_spans_helper(inputs_length, noise_density, mean_noise_span_length)
    if sequence_length["targets"] < targets_length:
        raise ValueError(
            f"span_corruption produces targets of {targets_length} tokens for inputs of {inputs_length}, "
            f"but sequence_length['targets'] is {sequence_length['targets']}"
        )
    _check_sentinels(
        output_features["targets"].vocabulary,
        num_noise_spans(tokens_length, noise_density, mean_noise_span_length),
        "span_corruption",
    )
    ds = select_random_chunk(dataset, output_features, feature_key="targets", max_length=65536)
    if merge_examples_to_reduce_padding:
        ds = reduce_concat_tokens(ds, feature_key="targets", batch_size=128)
    ds = split_tokens(ds, feature_key="targets", max_tokens_per_segment=tokens_length)
    return denoise(
        ds,
        output_features,
        noise_density=noise_density,
        noise_mask_fn=functools.partial(
            random_spans_noise_mask, mean_noise_span_length=mean_noise_span_length
        ),
        inputs_fn=noise_span_to_unique_sentinel,
        targets_fn=nonnoise_span_to_unique_sentinel,
        input_feature_key=input_feature_key,
    )


def iid_denoising(
    dataset: tf.data.Dataset, sequence_length: Mapping[str, int], output_features: OutputFeatures
) -> tf.data.Dataset:
    """T5's baseline objective: i.i.d. 15% noise, spans replaced by unique sentinels.

    Raises:
      ValueError: the expected number of noise spans at this inputs length
        exceeds the vocabulary's sentinel ids.
    """
    length = sequence_length["inputs"] - int(output_features["inputs"].add_eos)
    _check_sentinels(
        output_features["targets"].vocabulary,
        math.ceil(length * 0.15 * 0.85),
        "iid_denoising (expected spans)",
    )
    ds = select_random_chunk(dataset, output_features, feature_key="targets", max_length=65536)
    ds = reduce_concat_tokens(ds, feature_key="targets", batch_size=128)
    ds = split_tokens_to_inputs_length(ds, sequence_length=sequence_length, output_features=output_features)
    return denoise(
        ds,
        output_features,
        noise_density=0.15,
        noise_mask_fn=iid_noise_mask,
        inputs_fn=noise_span_to_unique_sentinel,
        targets_fn=nonnoise_span_to_unique_sentinel,
    )


def prefix_lm(
    dataset: tf.data.Dataset,
    sequence_length: Mapping[str, int],
    output_features: OutputFeatures,
    noise_density: float = 0.5,
) -> tf.data.Dataset:
    """Prefix LM: a random prefix becomes the inputs, the rest the targets."""
    ds = select_random_chunk(dataset, output_features, feature_key="targets", max_length=65536)
    ds = split_tokens_to_inputs_length(ds, sequence_length=sequence_length, output_features=output_features)
    return denoise(
        ds,
        output_features,
        noise_density=noise_density,
        noise_mask_fn=random_prefix_noise_mask,
        inputs_fn=drop_nonnoise_tokens,
        targets_fn=drop_noise_tokens,
    )


def full_lm(
    dataset: tf.data.Dataset, sequence_length: Mapping[str, int], output_features: OutputFeatures
) -> tf.data.Dataset:
    """Language modelling on concatenated documents with EOS at document ends."""
    ds = select_random_chunk(dataset, output_features, feature_key="targets", max_length=65536)
    ds = append_eos(ds, output_features)
    ds = reduce_concat_tokens(ds, feature_key="targets", batch_size=128)
    return split_tokens(ds, max_tokens_per_segment=sequence_length["targets"])


def random_split_text(
    dataset: tf.data.Dataset,
    text_key: str = "text",
    min_words_per_segment: int = 16,
    max_words_per_segment: int = 512,
    max_words_total: int = 8192,
) -> tf.data.Dataset:
    """Splits each text into segments of a random (log-uniform) number of words.

    A text longer than ``max_words_total`` words is first cut to one random
    chunk of that many words.
    """

    @map_over_dataset(num_seeds=2)
    def fn(x: Mapping[str, Any], seeds: tf.Tensor) -> dict[str, Any]:
        words = tf.strings.split([x[text_key]]).values
        if max_words_total:
            size = tf.size(words)
            num_chunks = tf.maximum(1, (size - 1) // max_words_total + 1)
            chunk = tf.random.stateless_uniform(
                [], seed=seeds[0], minval=0, maxval=num_chunks, dtype=tf.int32
            )
            words = words[max_words_total * chunk : max_words_total * (chunk + 1)]
        n_words = tf.size(words)
        log_length = tf.random.stateless_uniform(
            [], minval=math.log(min_words_per_segment), maxval=math.log(max_words_per_segment), seed=seeds[1]
        )
        length = tf.cast(tf.exp(log_length), tf.int32)
        num_segments = tf.cast(
            tf.math.ceil(tf.cast(n_words, tf.float32) / tf.cast(length, tf.float32)), tf.int32
        )
        words = tf.pad(words, [[0, num_segments * length - n_words]])
        words = tf.reshape(words, [-1, length])
        return {text_key: tf.strings.strip(tf.strings.reduce_join(words, axis=1, separator=" "))}

    return fn(dataset).unbatch()
