"""``seqio.preprocessors``: rekey, tokenize, EOS handling and friends, with seqio's semantics.

``tokenize`` calls each vocabulary's ``encode_tf`` once per example with that
example's string tensor (a scalar for a plain text feature), as seqio does, so
a custom vocabulary whose ``_encode_tf`` handles one string works. (The core's
``t5x.tasks.tokenize`` encodes 64 examples per call, which is faster for the
built-in vocabularies; see docs/differences.md.)
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import tensorflow as tf

from t5x.seqio import utils
from t5x.tasks import append_eos, append_eos_after_trim, rekey
from t5x.tasks.seqio_extras import (
    apply_feature_converter,
    preprocess_tensorflow_examples,
    truncate_inputs_left,
)

OutputFeaturesType = Mapping[str, Any]
SequenceLengthType = Mapping[str, int]


def _eos_on_last_item(ids: Any, eos_id: int) -> Any:
    """Appends EOS to the last item of every innermost sequence (rank-1: just at the end)."""
    ids = tf.expand_dims(ids, 0)
    if isinstance(ids, tf.Tensor):
        ids = tf.RaggedTensor.from_tensor(ids)
    eos_shape = tf.concat([ids.bounding_shape()[:-2], [1, 1]], axis=0)
    eos = tf.broadcast_to(tf.cast(eos_id, ids.dtype), eos_shape)
    last = tf.concat([ids[..., -1:, :], eos], axis=-1)
    return tf.concat([ids[..., :-1, :], last], axis=-2)[0]


def tokenize_impl(
    features: Mapping[str, Any],
    output_features: OutputFeaturesType,
    copy_pretokenized: bool = True,
    with_eos: bool = False,
) -> dict[str, Any]:
    """Encodes one example's output features with their vocabularies (others pass through)."""
    out: dict[str, Any] = {}
    for key, value in features.items():
        if key in output_features:
            if copy_pretokenized:
                out[f"{key}_pretokenized"] = value
            vocab = output_features[key].vocabulary
            value = vocab.encode_tf(value)
            if with_eos and output_features[key].add_eos:
                value = _eos_on_last_item(value, vocab.eos_id)
        out[key] = value
    return out


def tokenize(
    dataset: tf.data.Dataset,
    output_features: OutputFeaturesType,
    copy_pretokenized: bool = True,
    with_eos: bool = False,
) -> tf.data.Dataset:
    """Tokenizes the features named in ``output_features``, one example per vocabulary call.

    With ``with_eos``, features whose Feature has ``add_eos`` get EOS after their
    last token (for a list of strings: after the last string's tokens only).
    """
    fn = functools.partial(
        tokenize_impl, output_features=output_features, copy_pretokenized=copy_pretokenized, with_eos=with_eos
    )
    return utils.map_over_dataset(fn=fn)(dataset)


def tokenize_and_append_eos(
    dataset: tf.data.Dataset, output_features: OutputFeaturesType, copy_pretokenized: bool = True
) -> tf.data.Dataset:
    """``tokenize(..., with_eos=True)``."""
    return tokenize(dataset, output_features, copy_pretokenized, with_eos=True)


def append_eos_after_trim_impl(
    features: dict[str, Any],
    output_features: OutputFeaturesType,
    sequence_length: SequenceLengthType | None = None,
) -> dict[str, Any]:
    """One example of ``append_eos_after_trim``."""
    ds = tf.data.Dataset.from_tensors(features)
    return next(iter(append_eos_after_trim(ds, output_features, sequence_length)))


@utils.map_over_dataset
def print_dataset(features: Mapping[str, Any], summarize: int = 3) -> dict[str, Any]:
    """Prints every feature as examples pass (for debugging)."""
    return {
        k: tf.raw_ops.Print(input=v, data=[v], message=f"{k}: ", summarize=summarize)
        for k, v in features.items()
    }


__all__ = [
    "append_eos",
    "append_eos_after_trim",
    "append_eos_after_trim_impl",
    "apply_feature_converter",
    "preprocess_tensorflow_examples",
    "print_dataset",
    "rekey",
    "tokenize",
    "tokenize_and_append_eos",
    "tokenize_impl",
    "truncate_inputs_left",
]
