"""Training FLOPs per token (PaLM convention, see docs/benchmarks.md)."""

from __future__ import annotations

from collections.abc import Mapping

from t5x.models._config import DecoderOnlyConfig, T5Config


def _length(lengths: Mapping[str, int], *names: str) -> int:
    for name in names:
        if name in lengths:
            return int(lengths[name])
    raise ValueError(f"model_feature_lengths needs one of {names}, got {dict(lengths)}")


def _layer_params(cfg: T5Config | DecoderOnlyConfig) -> tuple[int, int]:
    attention = 4 * cfg.emb_dim * cfg.num_heads * cfg.head_dim
    mlp = (len(cfg.mlp_activations) + 1) * cfg.emb_dim * cfg.mlp_dim
    return attention, mlp


def encoder_decoder_flops_per_token(cfg: T5Config, lengths: Mapping[str, int]) -> float:
    """Forward + backward FLOPs per input-or-target token of an encoder-decoder.

    Encoder tokens pay for encoder matmuls and the cross-attention key/value
    projections; target tokens for the decoder matmuls, the logits and their
    self- and cross-attention. Attention costs ``12 * layers * heads * head_dim *
    attended_length`` per token; embedding lookups are free.

    Args:
      cfg: the network.
      lengths: ``encoder_input_tokens`` and ``decoder_target_tokens`` (or
        ``decoder_input_tokens``) lengths.

    Returns:
      FLOPs per token, averaged over input and target tokens.

    Raises:
      ValueError: when a length is missing.
    """
    li = _length(lengths, "encoder_input_tokens", "inputs")
    lt = _length(lengths, "decoder_target_tokens", "decoder_input_tokens", "targets")
    attention, mlp = _layer_params(cfg)
    hq = cfg.num_heads * cfg.head_dim
    encoder_n = cfg.num_encoder_layers * (attention + mlp) + cfg.num_decoder_layers * 2 * cfg.emb_dim * hq
    decoder_n = (
        cfg.num_decoder_layers * (attention + 2 * cfg.emb_dim * hq + mlp) + cfg.emb_dim * cfg.vocab_size
    )
    per_input = 6 * encoder_n + 12 * cfg.num_encoder_layers * hq * li
    per_target = 6 * decoder_n + 12 * cfg.num_decoder_layers * hq * (lt + li)
    return float(li * per_input + lt * per_target) / (li + lt)


def decoder_only_flops_per_token(cfg: DecoderOnlyConfig, lengths: Mapping[str, int]) -> float:
    """Forward + backward FLOPs per token of a decoder-only LM (causal attention not halved).

    Raises:
      ValueError: when the length is missing.
    """
    length = _length(lengths, "decoder_target_tokens", "decoder_input_tokens", "targets")
    attention, mlp = _layer_params(cfg)
    n = cfg.num_layers * (attention + mlp) + cfg.emb_dim * cfg.vocab_size
    return float(6 * n + 12 * cfg.num_layers * cfg.num_heads * cfg.head_dim * length)
