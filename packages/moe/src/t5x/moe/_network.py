"""Encoder and decoder stacks whose sparse layers use ``MoeBlock`` as their ``mlp``.

Parameter names and layout are those of the dense networks of ``t5x.models``
(``<stack>/layers_<i>/...``), so a layer's dense MLP and its MoE block sit at the
same path, ``.../mlp``: what sparse upcycling relies on.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax.linen import partitioning as nn_partitioning

from t5x.models import (
    DecoderOnlyTransformer,
    DenseGeneral,
    Embed,
    EncoderDecoderTransformer,
    LayerNorm,
    MlpBlock,
    MultiHeadDotProductAttention,
    RelativeBias,
    RelativePositionBiases,
)
from t5x.moe._layers import MoeBlock

_BLC = ("batch", "length", "embed")


def _constrain(x: jax.Array) -> jax.Array:
    return nn.with_logical_constraint(x, _BLC)


def _relpos(cfg: Any) -> RelativePositionBiases:
    return RelativePositionBiases(
        num_buckets=cfg.num_buckets,
        max_distance=cfg.max_distance,
        num_heads=cfg.num_heads,
        dtype=cfg.dtype,
        name="relpos_bias",
    )


def _attention(cfg: Any, name: str) -> MultiHeadDotProductAttention:
    return MultiHeadDotProductAttention(
        num_heads=cfg.num_heads,
        head_dim=cfg.head_dim,
        dtype=cfg.dtype,
        matmul_dtype=cfg.matmul_dtype,
        dropout_rate=cfg.dropout_rate,
        float32_logits=cfg.float32_attention_logits,
        name=name,
    )


def _feed_forward(cfg: Any, sparse: bool, causal: bool) -> nn.Module:
    if sparse:
        return MoeBlock(config=cfg, causal=causal, name="mlp")
    return MlpBlock(
        intermediate_dim=cfg.mlp_dim,
        activations=tuple(cfg.mlp_activations),
        intermediate_dropout_rate=cfg.dropout_rate,
        dtype=cfg.dtype,
        matmul_dtype=cfg.matmul_dtype,
        name="mlp",
    )


def _dropout(cfg: Any, x: jax.Array, deterministic: bool) -> jax.Array:
    return nn.Dropout(rate=cfg.dropout_rate, broadcast_dims=(-2,))(x, deterministic=deterministic)


def _causal_bias(cfg: Any, length: int, decode: bool) -> jax.Array | RelativeBias:
    relpos = _relpos(cfg)
    return relpos.lazy(length, length, False) if decode else relpos(length, length, False)


class MoeEncoderLayer(nn.Module):
    """Pre-norm self-attention, then a dense MLP or (``sparse``) an MoE block."""

    config: Any
    sparse: bool = False

    @nn.compact
    def __call__(
        self, inputs: jax.Array, mask: jax.Array | None, bias: jax.Array | None, deterministic: bool
    ) -> jax.Array:
        cfg = self.config
        if cfg.per_layer_relpos_bias:
            bias = _relpos(cfg)(inputs.shape[-2], inputs.shape[-2], True)
        inputs = _constrain(inputs)
        x = LayerNorm(dtype=cfg.dtype, name="pre_attention_layer_norm")(inputs)
        x = _attention(cfg, "attention")(x, x, mask, bias, deterministic=deterministic)
        x = _constrain(_dropout(cfg, x, deterministic) + inputs)
        y = LayerNorm(dtype=cfg.dtype, name="pre_mlp_layer_norm")(x)
        y = _feed_forward(cfg, self.sparse, causal=False)(y, deterministic=deterministic)
        return _constrain(_dropout(cfg, y, deterministic) + x)


class MoeDecoderLayer(nn.Module):
    """Causal self-attention, optional cross-attention, then a dense MLP or an MoE block."""

    config: Any
    sparse: bool = False
    cross_attention: bool = True

    @nn.compact
    def __call__(
        self,
        inputs: jax.Array,
        encoded: jax.Array | None,
        decoder_mask: jax.Array | None,
        encoder_decoder_mask: jax.Array | None,
        bias: jax.Array | RelativeBias | None,
        deterministic: bool,
        decode: bool,
        max_decode_length: int | None,
        prefill: bool,
        prefill_lengths: jax.Array | None,
    ) -> jax.Array:
        cfg = self.config
        if cfg.per_layer_relpos_bias:
            length = int(max_decode_length) if decode and max_decode_length else inputs.shape[-2]
            bias = _causal_bias(cfg, length, decode)
        inputs = _constrain(inputs)
        x = LayerNorm(dtype=cfg.dtype, name="pre_self_attention_layer_norm")(inputs)
        x = _attention(cfg, "self_attention")(
            x,
            x,
            decoder_mask,
            bias,
            deterministic=deterministic,
            decode=decode,
            prefill=prefill,
            prefill_lengths=prefill_lengths,
        )
        x = _constrain(_dropout(cfg, x, deterministic) + inputs)
        if self.cross_attention:
            assert encoded is not None, "a decoder with cross-attention needs the encoder's output"
            y = LayerNorm(dtype=cfg.dtype, name="pre_cross_attention_layer_norm")(x)
            y = _attention(cfg, "encoder_decoder_attention")(
                y, encoded, encoder_decoder_mask, deterministic=deterministic
            )
            x = _constrain(_dropout(cfg, y, deterministic) + x)
        z = LayerNorm(dtype=cfg.dtype, name="pre_mlp_layer_norm")(x)
        z = _feed_forward(cfg, self.sparse, causal=True)(z, deterministic=deterministic)
        return _constrain(_dropout(cfg, z, deterministic) + x)


def _layer_cls(cfg: Any, layer: type[nn.Module], args: tuple[Any, ...]) -> Any:
    if cfg.remat_policy == "none":
        return layer
    policy = None
    if cfg.remat_policy == "minimal":
        policy = jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims
    statics = tuple(i + 1 for i, a in enumerate(args) if isinstance(a, (bool, int)) or a is None)
    return nn_partitioning.remat(layer, prevent_cse=True, policy=policy, static_argnums=statics)


class MoeEncoder(nn.Module):
    """Embedding dropout, the encoder layers (every period-th one sparse) and ``encoder_norm``."""

    config: Any
    shared_embedding: nn.Module

    @nn.compact
    def __call__(
        self, encoder_input_tokens: jax.Array, encoder_mask: jax.Array | None, deterministic: bool
    ) -> jax.Array:
        cfg = self.config
        length = encoder_input_tokens.shape[-1]
        bias = None if cfg.per_layer_relpos_bias else _relpos(cfg)(length, length, True)
        x = self.shared_embedding(encoder_input_tokens.astype(jnp.int32))
        x = _dropout(cfg, x, deterministic).astype(cfg.dtype)
        args = (encoder_mask, bias, deterministic)
        block = _layer_cls(cfg, MoeEncoderLayer, args)
        for i in range(cfg.num_encoder_layers):
            x = block(config=cfg, sparse=cfg.is_sparse(i), name=f"layers_{i}")(x, *args)
        x = LayerNorm(dtype=cfg.dtype, name="encoder_norm")(x)
        return nn.Dropout(rate=cfg.dropout_rate)(x, deterministic=deterministic)


class MoeDecoder(nn.Module):
    """Decoder layers (every period-th one sparse), ``decoder_norm`` and the logits.

    Called like ``t5x.models.Decoder``; ``step_kernels`` is accepted for that
    interface and ignored (MoE decoding steps always multiply with XLA).
    """

    config: Any
    shared_embedding: nn.Module | None = None
    cross_attention: bool = True
    step_kernels: str = "xla"

    @nn.compact
    def __call__(
        self,
        encoded: jax.Array | None,
        decoder_input_tokens: jax.Array,
        decoder_mask: jax.Array | None = None,
        encoder_decoder_mask: jax.Array | None = None,
        deterministic: bool = True,
        decode: bool = False,
        max_decode_length: int | None = None,
        prefill: bool = False,
        prefill_lengths: jax.Array | None = None,
    ) -> jax.Array:
        cfg = self.config
        num_layers = cfg.num_decoder_layers if self.cross_attention else cfg.num_layers
        if decode and not max_decode_length:
            raise ValueError("decoding step by step needs max_decode_length (the cache length)")
        length = int(max_decode_length) if decode and max_decode_length else decoder_input_tokens.shape[-1]
        bias = None if cfg.per_layer_relpos_bias else _causal_bias(cfg, length, decode)
        embedding = self.shared_embedding
        if embedding is None:
            embedding = Embed(
                cfg.vocab_size,
                cfg.emb_dim,
                dtype=cfg.dtype,
                matmul_dtype=cfg.matmul_dtype,
                name="token_embedder",
            )
        y = embedding(decoder_input_tokens.astype(jnp.int32))
        y = _dropout(cfg, y, deterministic).astype(cfg.dtype)
        args = (
            encoded,
            decoder_mask,
            encoder_decoder_mask,
            bias,
            deterministic,
            decode,
            max_decode_length,
            prefill,
            prefill_lengths,
        )
        block = _layer_cls(cfg, MoeDecoderLayer, args)
        for i in range(num_layers):
            y = block(
                config=cfg, sparse=cfg.is_sparse(i), cross_attention=self.cross_attention, name=f"layers_{i}"
            )(y, *args)
        y = LayerNorm(dtype=cfg.dtype, name="decoder_norm")(y)
        y = _dropout(cfg, y, deterministic)
        if cfg.logits_via_embedding:
            logits = embedding.attend(y) / jnp.sqrt(jnp.float32(y.shape[-1]))
        else:
            logits = DenseGeneral(
                cfg.vocab_size,
                dtype=jnp.float32,
                matmul_dtype=cfg.matmul_dtype,
                kernel_axes=("embed", "vocab"),
                name="logits_dense",
            )(y)
        return nn.with_logical_constraint(logits, ("batch", "length", "vocab"))


class MoeEncoderDecoderTransformer(EncoderDecoderTransformer):
    """``EncoderDecoderTransformer`` with MoE stacks; ``encode`` / ``decode`` / ``__call__`` unchanged."""

    def setup(self) -> None:
        cfg = self.config
        self.token_embedder = Embed(
            cfg.vocab_size, cfg.emb_dim, dtype=cfg.dtype, matmul_dtype=cfg.matmul_dtype, name="token_embedder"
        )
        # The dense class annotates these as its own stacks; the MoE stacks are called the same way.
        self.encoder = MoeEncoder(config=cfg, shared_embedding=self.token_embedder)  # type: ignore[assignment]
        self.decoder = MoeDecoder(  # type: ignore[assignment]
            config=cfg, shared_embedding=self.token_embedder, cross_attention=True
        )


class MoeDecoderOnlyTransformer(DecoderOnlyTransformer):
    """``DecoderOnlyTransformer`` with an MoE decoder; every parameter under ``decoder/``."""

    def setup(self) -> None:
        self.decoder = MoeDecoder(  # type: ignore[assignment]
            config=self.config, shared_embedding=None, cross_attention=False, name="decoder"
        )
