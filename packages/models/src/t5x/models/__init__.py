"""T5-family encoder-decoders and causal / prefix-LM decoders in Flax, with t5x parameter names."""

from t5x.models._attention import MultiHeadDotProductAttention, dot_product_attention
from t5x.models._base import BaseModel
from t5x.models._chunked_loss import chunked_cross_entropy
from t5x.models._config import DecoderOnlyConfig, T5Config
from t5x.models._cpu_kernels import cpu_kernels_ready
from t5x.models._flops import decoder_only_flops_per_token, encoder_decoder_flops_per_token
from t5x.models._hf_names import hf_to_t5x_params, t5x_to_hf_state
from t5x.models._layers import (
    DenseGeneral,
    Embed,
    LayerNorm,
    MlpBlock,
    RelativeBias,
    RelativePositionBiases,
    combine_masks,
    make_attention_mask,
    make_causal_mask,
    make_decoder_mask,
    relative_position_bucket,
)
from t5x.models._losses import (
    SpecialLossNormalizingFactor,
    compute_metrics,
    compute_weighted_cross_entropy,
    cross_entropy_with_logits,
    get_loss_normalizing_factor_and_weights,
    token_cross_entropy,
)
from t5x.models._models import (
    DecoderOnlyModel,
    EncoderDecoderModel,
    get_input_vocabulary,
    get_output_vocabulary,
    prefill_spans,
)
from t5x.models._mtf_names import mtf_to_t5x_state, mtf_variable_to_t5x, t5_config_from_params
from t5x.models._network import (
    Decoder,
    DecoderLayer,
    Encoder,
    EncoderLayer,
    FeedForward,
    LayerBlock,
    dense_mlp,
)
from t5x.models._presets import PRESETS, preset
from t5x.models._reference import LazyReference
from t5x.models._scan import scan_params, unscan_params
from t5x.models._sequences import count_packed_examples, remove_prefix
from t5x.models._step_kernels import CpuKernels
from t5x.models._transformer import DecoderOnlyTransformer, EncoderDecoderTransformer

__all__ = [
    "BaseModel",
    "hf_to_t5x_params",
    "t5x_to_hf_state",
    "mtf_to_t5x_state",
    "mtf_variable_to_t5x",
    "t5_config_from_params",
    "PRESETS",
    "CpuKernels",
    "Decoder",
    "DecoderLayer",
    "DecoderOnlyConfig",
    "DecoderOnlyModel",
    "DecoderOnlyTransformer",
    "DenseGeneral",
    "Embed",
    "Encoder",
    "EncoderDecoderModel",
    "EncoderDecoderTransformer",
    "EncoderLayer",
    "FeedForward",
    "LayerBlock",
    "LayerNorm",
    "LazyReference",
    "MlpBlock",
    "MultiHeadDotProductAttention",
    "RelativeBias",
    "RelativePositionBiases",
    "SpecialLossNormalizingFactor",
    "T5Config",
    "combine_masks",
    "chunked_cross_entropy",
    "compute_metrics",
    "compute_weighted_cross_entropy",
    "get_input_vocabulary",
    "get_output_vocabulary",
    "cpu_kernels_ready",
    "cross_entropy_with_logits",
    "token_cross_entropy",
    "decoder_only_flops_per_token",
    "dense_mlp",
    "dot_product_attention",
    "encoder_decoder_flops_per_token",
    "get_loss_normalizing_factor_and_weights",
    "make_attention_mask",
    "make_causal_mask",
    "make_decoder_mask",
    "prefill_spans",
    "count_packed_examples",
    "remove_prefix",
    "preset",
    "relative_position_bucket",
    "scan_params",
    "unscan_params",
]
