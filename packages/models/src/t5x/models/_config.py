"""Hyper-parameters of the T5-family networks, with upstream t5x's field names."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp

_REMAT_POLICIES = ("none", "minimal", "full")
_ACTIVATIONS = ("relu", "gelu", "silu", "swish", "linear", "tanh", "sigmoid", "elu")


def _canonical_dtype(dtype: Any, field: str) -> str:
    try:
        return jnp.dtype(dtype).name
    except TypeError as err:
        raise ValueError(f"{field} must name a dtype such as 'float32' or 'bfloat16', got {dtype!r}") from err


def _check_common(cfg: Any) -> None:
    for name in ("vocab_size", "emb_dim", "num_heads", "head_dim", "mlp_dim", "num_buckets", "max_distance"):
        value = getattr(cfg, name)
        if not isinstance(value, int) or value <= 0:
            raise ValueError(f"{type(cfg).__name__}.{name} must be a positive int, got {value!r}")
    if not 0.0 <= cfg.dropout_rate < 1.0:
        raise ValueError(f"{type(cfg).__name__}.dropout_rate must be in [0, 1), got {cfg.dropout_rate!r}")
    if not cfg.mlp_activations:
        raise ValueError(f"{type(cfg).__name__}.mlp_activations must name at least one activation, got ()")
    for act in cfg.mlp_activations:
        if act not in _ACTIVATIONS:
            raise ValueError(
                f"{type(cfg).__name__}.mlp_activations: unknown activation {act!r}; expected one of {_ACTIVATIONS}"
            )
    if cfg.remat_policy not in _REMAT_POLICIES:
        raise ValueError(
            f"{type(cfg).__name__}.remat_policy must be one of {_REMAT_POLICIES}, got {cfg.remat_policy!r}"
        )
    object.__setattr__(cfg, "mlp_activations", tuple(cfg.mlp_activations))
    object.__setattr__(cfg, "dtype", _canonical_dtype(cfg.dtype, f"{type(cfg).__name__}.dtype"))
    if cfg.matmul_dtype is not None:
        name = f"{type(cfg).__name__}.matmul_dtype"
        object.__setattr__(cfg, "matmul_dtype", _canonical_dtype(cfg.matmul_dtype, name))


@dataclasses.dataclass(frozen=True)
class T5Config:
    """An encoder-decoder network (T5.1.0, T5.1.1, mT5, ByT5, UMT5).

    Attributes:
      vocab_size: rows of the shared token embedding (and logits).
      emb_dim: model width ``d_model``.
      num_heads: attention heads per layer.
      num_encoder_layers: encoder depth.
      num_decoder_layers: decoder depth.
      head_dim: width of each head (``d_kv``).
      mlp_dim: hidden width of the feed-forward block.
      mlp_activations: ``('relu',)`` gives one ``wi``; two names such as
        ``('gelu', 'linear')`` give a gated block with ``wi_0`` and ``wi_1``.
      dropout_rate: dropout everywhere upstream applies it.
      logits_via_embedding: tie the logits to the embedding (scaled by
        ``1/sqrt(emb_dim)``); otherwise an untied ``logits_dense``.
      dtype: activation dtype; parameters are always float32.
      float32_attention_logits: compute ``q.k`` in float32 whatever ``dtype``.
      matmul_dtype: dtype the operands of every matmul are rounded to, with
        float32 accumulation and results in ``dtype``; None multiplies in
        ``dtype``. ``'bfloat16'`` with float32 activations gives the numerics
        of float32 matmuls at default precision on TPU, and runs several times
        faster on CPUs with AMX or AVX512-BF16.
      scan_layers: stack the layers with ``lax.scan`` (scalable-T5 layout, layer
        axis at position 1 of every parameter).
      remat_policy: ``'none'``, ``'minimal'`` (keep matmul outputs) or ``'full'``.
      num_buckets: relative-position buckets.
      max_distance: distance beyond which all positions share the last bucket.
      per_layer_relpos_bias: one relative-position table per layer (UMT5)
        instead of one per stack.
      layer_relpos_name: the per-layer table's module name (``<layer>/<name>/
        rel_embedding``); upstream's scalable-T5 network names it ``relative_posemb``.
    """

    vocab_size: int
    emb_dim: int = 512
    num_heads: int = 8
    num_encoder_layers: int = 6
    num_decoder_layers: int = 6
    head_dim: int = 64
    mlp_dim: int = 2048
    mlp_activations: Sequence[str] = ("relu",)
    dropout_rate: float = 0.1
    logits_via_embedding: bool = False
    dtype: Any = "float32"
    float32_attention_logits: bool = False
    matmul_dtype: Any = None
    scan_layers: bool = False
    remat_policy: str = "none"
    num_buckets: int = 32
    max_distance: int = 128
    per_layer_relpos_bias: bool = False
    layer_relpos_name: str = "relpos_bias"

    def __post_init__(self) -> None:
        _check_common(self)
        for name in ("num_encoder_layers", "num_decoder_layers"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"T5Config.{name} must be a positive int, got {value!r}")


@dataclasses.dataclass(frozen=True)
class DecoderOnlyConfig:
    """A decoder-only network (causal LM or prefix LM).

    Attributes mean what they mean in :class:`T5Config`; ``num_layers`` is the
    depth of the single stack.
    """

    vocab_size: int
    emb_dim: int = 512
    num_heads: int = 8
    num_layers: int = 6
    head_dim: int = 64
    mlp_dim: int = 2048
    mlp_activations: Sequence[str] = ("relu",)
    dropout_rate: float = 0.1
    logits_via_embedding: bool = False
    dtype: Any = "float32"
    float32_attention_logits: bool = False
    matmul_dtype: Any = None
    scan_layers: bool = False
    remat_policy: str = "none"
    num_buckets: int = 32
    max_distance: int = 128
    per_layer_relpos_bias: bool = False
    layer_relpos_name: str = "relpos_bias"

    def __post_init__(self) -> None:
        _check_common(self)
        if not isinstance(self.num_layers, int) or self.num_layers <= 0:
            raise ValueError(f"DecoderOnlyConfig.num_layers must be a positive int, got {self.num_layers!r}")
