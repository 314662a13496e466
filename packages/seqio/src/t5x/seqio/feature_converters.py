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
from t5x.seqio._converter_base import FeatureConverter, check_exact_match, check_lengths
from t5x.tasks.seqio_extras import trim_and_pad_dataset

# seqio's private helpers, under their names for code (and seqio's tests) that call them.
_check_exact_match = check_exact_match
_check_lengths = check_lengths

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
