"""Switch-Transformer-style sizes (upstream's switch_{tiny,small,base} gin files)."""

from __future__ import annotations

from typing import Any

from t5x.moe._config import MoeT5Config

T5_VOCAB_SIZE = 32128

# Switch: relu MLPs, tied logits, top-1 routing, capacity 1.25 (train) / 2.0 (eval),
# every other MLP sparse.
_SWITCH = dict(
    vocab_size=T5_VOCAB_SIZE,
    mlp_activations=("relu",),
    logits_via_embedding=True,
    dropout_rate=0.0,
    num_selected_experts=1,
    train_capacity_factor=1.25,
    eval_capacity_factor=2.0,
    moe_layer_period=2,
    group_size=8192,
)

MOE_PRESETS: dict[str, dict[str, Any]] = {
    # Two layers per stack, one of them sparse.
    "switch_tiny": dict(
        emb_dim=32,
        num_heads=6,
        head_dim=64,
        mlp_dim=64,
        num_encoder_layers=2,
        num_decoder_layers=2,
        num_experts=8,
    ),
    "switch_small": dict(
        emb_dim=512,
        num_heads=8,
        head_dim=64,
        mlp_dim=2048,
        num_encoder_layers=8,
        num_decoder_layers=8,
        num_experts=32,
    ),
    "switch_base": dict(
        emb_dim=768,
        num_heads=12,
        head_dim=64,
        mlp_dim=3072,
        num_encoder_layers=12,
        num_decoder_layers=12,
        num_experts=64,
    ),
}


def moe_preset(name: str, **overrides: Any) -> MoeT5Config:
    """The ``MoeT5Config`` of a preset, with fields overridden (None overrides are ignored).

    Raises:
      KeyError: an unknown preset name.
    """
    if name not in MOE_PRESETS:
        raise KeyError(f"unknown MoE preset {name!r}; known: {sorted(MOE_PRESETS)}")
    given = {k: v for k, v in overrides.items() if v is not None}
    return MoeT5Config(**{**_SWITCH, **MOE_PRESETS[name], **given})
