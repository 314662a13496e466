"""Configurations of the published T5-family sizes (as upstream t5x's gin files set them)."""

from __future__ import annotations

import dataclasses
from typing import Any

from t5x.models._config import DecoderOnlyConfig, T5Config

T5_VOCAB_SIZE = 32128
MT5_VOCAB_SIZE = 250112
BYT5_VOCAB_SIZE = 384
UMT5_VOCAB_SIZE = 256384

_GATED = ("gelu", "linear")


def _t5(vocab: int, emb: int, heads: int, enc: int, dec: int, head_dim: int, mlp: int, **kw: Any) -> T5Config:
    return T5Config(
        vocab_size=vocab,
        emb_dim=emb,
        num_heads=heads,
        num_encoder_layers=enc,
        num_decoder_layers=dec,
        head_dim=head_dim,
        mlp_dim=mlp,
        dropout_rate=kw.pop("dropout_rate", 0.0),
        mlp_activations=kw.pop("mlp_activations", _GATED),
        **kw,
    )


def _t5_1_1(emb: int, heads: int, layers: int, mlp: int, vocab: int = T5_VOCAB_SIZE, **kw: Any) -> T5Config:
    return _t5(vocab, emb, heads, layers, layers, 64, mlp, **kw)


def _t5_1_0(emb: int, heads: int, layers: int, head_dim: int, mlp: int) -> T5Config:
    return _t5(
        T5_VOCAB_SIZE,
        emb,
        heads,
        layers,
        layers,
        head_dim,
        mlp,
        mlp_activations=("relu",),
        logits_via_embedding=True,
    )


def _byt5(emb: int, heads: int, enc: int, dec: int, mlp: int) -> T5Config:
    return _t5(BYT5_VOCAB_SIZE, emb, heads, enc, dec, 64, mlp)


def _umt5(emb: int, heads: int, layers: int, mlp: int) -> T5Config:
    return _t5_1_1(
        emb, heads, layers, mlp, vocab=UMT5_VOCAB_SIZE, per_layer_relpos_bias=True, scan_layers=True
    )


def _decoder(
    emb: int, heads: int, layers: int, mlp: int, head_dim: int = 64, vocab: int = T5_VOCAB_SIZE
) -> DecoderOnlyConfig:
    return DecoderOnlyConfig(
        vocab_size=vocab,
        emb_dim=emb,
        num_heads=heads,
        num_layers=layers,
        head_dim=head_dim,
        mlp_dim=mlp,
        mlp_activations=_GATED,
        dropout_rate=0.0,
    )


PRESETS: dict[str, T5Config | DecoderOnlyConfig] = {
    # T5.1.1 (t5x/examples/t5/t5_1_1/*.gin); tiny is upstream's test size.
    "t5_1_1_tiny": _t5(T5_VOCAB_SIZE, 8, 4, 2, 2, 3, 16),
    "t5_1_1_small": _t5_1_1(512, 6, 8, 1024),
    "t5_1_1_base": _t5_1_1(768, 12, 12, 2048),
    "t5_1_1_large": _t5_1_1(1024, 16, 24, 2816),
    "t5_1_1_xl": _t5_1_1(2048, 32, 24, 5120),
    "t5_1_1_xxl": _t5_1_1(4096, 64, 24, 10240),
    # T5.1.0: ReLU MLP, logits tied to the embedding.
    "t5_1_0_small": _t5_1_0(512, 8, 6, 64, 2048),
    "t5_1_0_base": _t5_1_0(768, 12, 12, 64, 3072),
    "t5_1_0_large": _t5_1_0(1024, 16, 24, 64, 4096),
    "t5_1_0_3B": _t5_1_0(1024, 32, 24, 128, 16384),
    "t5_1_0_11B": _t5_1_0(1024, 128, 24, 128, 65536),
    # mT5: T5.1.1 shapes with the 250k multilingual vocabulary.
    "mt5_small": _t5_1_1(512, 6, 8, 1024, vocab=MT5_VOCAB_SIZE),
    "mt5_base": _t5_1_1(768, 12, 12, 2048, vocab=MT5_VOCAB_SIZE),
    "mt5_large": _t5_1_1(1024, 16, 24, 2816, vocab=MT5_VOCAB_SIZE),
    "mt5_xl": _t5_1_1(2048, 32, 24, 5120, vocab=MT5_VOCAB_SIZE),
    "mt5_xxl": _t5_1_1(4096, 64, 24, 10240, vocab=MT5_VOCAB_SIZE),
    # ByT5: bytes, deep encoder, shallow decoder.
    "byt5_small": _byt5(1472, 6, 12, 4, 3584),
    "byt5_base": _byt5(1536, 12, 18, 6, 3968),
    "byt5_large": _byt5(1536, 16, 36, 12, 3840),
    "byt5_xl": _byt5(2560, 32, 36, 12, 6720),
    "byt5_xxl": _byt5(4672, 64, 36, 12, 12352),
    # UMT5: scanned layers, one relative-position table per layer.
    "umt5_tiny": _t5(UMT5_VOCAB_SIZE, 8, 4, 2, 2, 3, 16, per_layer_relpos_bias=True, scan_layers=True),
    "umt5_small": _umt5(512, 6, 8, 1024),
    "umt5_base": _umt5(768, 12, 12, 2048),
    "umt5_xl": _umt5(2048, 32, 24, 5120),
    "umt5_xxl": _umt5(4096, 64, 24, 10240),
    # Decoder-only LMs on the T5 vocabulary (docs/benchmarks.md sizes).
    "decoder_tiny": _decoder(8, 4, 2, 16, head_dim=3),
    "decoder_small": _decoder(512, 8, 12, 1024),
    "decoder_1b": _decoder(2048, 16, 16, 5632, head_dim=128),
}


def preset(name: str, **overrides: Any) -> T5Config | DecoderOnlyConfig:
    """Returns the named configuration with ``overrides`` applied.

    Raises:
      KeyError: for an unknown name, listing the known ones.
    """
    if name not in PRESETS:
        raise KeyError(f"unknown preset {name!r}; known presets: {sorted(PRESETS)}")
    return dataclasses.replace(PRESETS[name], **overrides)
