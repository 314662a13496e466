"""MoE networks: the dense stacks of ``t5x.models`` with an MoE block as every period-th ``mlp``.

Parameter names and layout are the dense networks' (``<stack>/layers_<i>/...``), so a
layer's dense MLP and its MoE block sit at the same path, ``.../mlp``: what sparse
upcycling relies on. Scanned (``scan_layers=True``), the repeated unit is a block of
``moe_layer_period`` layers (dense ones, then the sparse one), as upstream scans MoE
stacks: ``<stack>/layers/subblock_<j>/...`` with the layers axis at position 1.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn

from t5x.models import (
    Decoder,
    DecoderOnlyTransformer,
    Embed,
    Encoder,
    EncoderDecoderTransformer,
    dense_mlp,
)
from t5x.moe._layers import MoeBlock


def moe_feed_forward(cfg: Any, layer_index: int, causal: bool, step_kernels: str = "xla") -> nn.Module:
    """The ``FeedForward`` of an MoE stack: an ``MoeBlock`` in sparse layers, else the dense MLP."""
    if cfg.is_sparse(layer_index):
        return MoeBlock(config=cfg, causal=causal, name="mlp")
    return dense_mlp(cfg, layer_index, causal, step_kernels)


def _scan_unit(cfg: Any) -> int | None:
    return cfg.moe_layer_period if cfg.scan_layers else None


class MoeEncoderDecoderTransformer(EncoderDecoderTransformer):
    """``EncoderDecoderTransformer`` whose stacks use ``moe_feed_forward``; methods unchanged."""

    def setup(self) -> None:
        cfg = self.config
        self.token_embedder = Embed(
            cfg.vocab_size, cfg.emb_dim, dtype=cfg.dtype, matmul_dtype=cfg.matmul_dtype, name="token_embedder"
        )
        self.encoder = Encoder(
            config=cfg,
            shared_embedding=self.token_embedder,
            feed_forward=moe_feed_forward,
            layers_per_scan=_scan_unit(cfg),
        )
        # MoE decoding steps always multiply with XLA (the CPU step kernels know dense MLPs only).
        self.decoder = Decoder(
            config=cfg,
            shared_embedding=self.token_embedder,
            cross_attention=True,
            feed_forward=moe_feed_forward,
            layers_per_scan=_scan_unit(cfg),
        )


class MoeDecoderOnlyTransformer(DecoderOnlyTransformer):
    """``DecoderOnlyTransformer`` with an MoE decoder; every parameter under ``decoder/``."""

    def setup(self) -> None:
        self.decoder = Decoder(
            config=self.config,
            shared_embedding=None,
            cross_attention=False,
            feed_forward=moe_feed_forward,
            layers_per_scan=_scan_unit(self.config),
            name="decoder",
        )
