"""``seqio.feature_converters``: task features to model features (the core's converters, seqio's names)."""

from __future__ import annotations

from t5x.feature_converters import (
    EncoderFeatureConverter,
    LMFeatureConverter,
    PassThroughFeatureConverter,
    autoregressive_inputs,
    make_autoregressive_inputs,
    non_padding_position,
    trim_and_pack_dataset,
)
from t5x.feature_converters.seqio_extras import (
    DecoderFeatureConverter,
    EncDecFeatureConverter,
    PrefixLMFeatureConverter,
    PrefixSuffixLMFeatureConverter,
    PrePackedEncDecFeatureConverter,
    PrePackedLMFeatureConverter,
    PrePackedPrefixLMFeatureConverter,
)
from t5x.seqio._converter_base import FeatureConverter
from t5x.tasks.seqio_extras import trim_and_pad_dataset

__all__ = [
    "DecoderFeatureConverter",
    "EncDecFeatureConverter",
    "EncoderFeatureConverter",
    "FeatureConverter",
    "LMFeatureConverter",
    "PassThroughFeatureConverter",
    "PrePackedEncDecFeatureConverter",
    "PrePackedLMFeatureConverter",
    "PrePackedPrefixLMFeatureConverter",
    "PrefixLMFeatureConverter",
    "PrefixSuffixLMFeatureConverter",
    "autoregressive_inputs",
    "make_autoregressive_inputs",
    "non_padding_position",
    "trim_and_pack_dataset",
    "trim_and_pad_dataset",
]
