"""seqio's flavour of the converters (pass-through features) and its pre-packed converters.

``t5x.seqio.feature_converters`` exposes these under seqio's names; the core
``t5x.feature_converters`` names stay the plain converters.
"""

from t5x.feature_converters._seqio_extras import (
    DecoderFeatureConverter,
    EncDecFeatureConverter,
    PrefixLMFeatureConverter,
    PrefixSuffixLMFeatureConverter,
    PrePackedEncDecFeatureConverter,
    PrePackedLMFeatureConverter,
    PrePackedPrefixLMFeatureConverter,
)

__all__ = [
    "DecoderFeatureConverter",
    "EncDecFeatureConverter",
    "PrePackedEncDecFeatureConverter",
    "PrePackedLMFeatureConverter",
    "PrePackedPrefixLMFeatureConverter",
    "PrefixLMFeatureConverter",
    "PrefixSuffixLMFeatureConverter",
]
