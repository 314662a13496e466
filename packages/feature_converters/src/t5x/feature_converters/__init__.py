"""Task features to model features on tf.data, with seqio's semantics and packing.

A converter is built with options and called as ``converter(ds,
task_feature_lengths)``; ``get_model_feature_lengths(task_feature_lengths)``
says the length of every model feature. No JAX, Flax or Optax is imported.
"""

from t5x.feature_converters._base import FeatureConverter, FeatureSpec
from t5x.feature_converters._converters import (
    DecoderFeatureConverter,
    EncDecFeatureConverter,
    EncoderFeatureConverter,
    LMFeatureConverter,
    PassThroughFeatureConverter,
    PrefixLMFeatureConverter,
)
from t5x.feature_converters._ops import (
    autoregressive_inputs,
    make_autoregressive_inputs,
    non_padding_position,
)
from t5x.feature_converters._packing import (
    PACKING_STRATEGIES,
    packing_efficiency,
    trim_and_pack_dataset,
    trim_and_pad_dataset,
)
from t5x.feature_converters._seqio_extras import (
    PrefixSuffixLMFeatureConverter,
    PrePackedEncDecFeatureConverter,
    PrePackedLMFeatureConverter,
    PrePackedPrefixLMFeatureConverter,
)

__all__ = [
    "PACKING_STRATEGIES",
    "DecoderFeatureConverter",
    "EncDecFeatureConverter",
    "EncoderFeatureConverter",
    "FeatureConverter",
    "FeatureSpec",
    "LMFeatureConverter",
    "PassThroughFeatureConverter",
    "PrefixLMFeatureConverter",
    "PrePackedEncDecFeatureConverter",
    "PrePackedLMFeatureConverter",
    "PrePackedPrefixLMFeatureConverter",
    "PrefixSuffixLMFeatureConverter",
    "autoregressive_inputs",
    "make_autoregressive_inputs",
    "non_padding_position",
    "packing_efficiency",
    "trim_and_pack_dataset",
    "trim_and_pad_dataset",
]
