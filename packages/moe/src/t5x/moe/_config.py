"""MoE hyper-parameters: the dense configs of ``t5x.models`` plus the expert fields."""

from __future__ import annotations

import dataclasses
from typing import Any

from t5x.models import DecoderOnlyConfig, T5Config

ROUTERS = ("tokens_choose", "experts_choose")


@dataclasses.dataclass(frozen=True, kw_only=True)
class MoeFields:
    """The fields an MoE network adds to its dense twin (keyword-only).

    Attributes:
      num_experts: experts in every MoE layer.
      num_selected_experts: experts per token for ``tokens_choose`` routing
        (1: Switch, 2: GShard-style top-2).
      router: ``'tokens_choose'`` or ``'experts_choose'`` (encoder layers only).
      moe_layer_period: every ``period``-th layer is sparse: layer ``i`` when
        ``i % period == period - 1`` (upstream's MIXED layout), so 2 makes
        ``layers_1``, ``layers_3``, ... MoE layers. With ``scan_layers`` the
        scanned unit is a block of ``period`` layers, so it must divide each depth.
      train_capacity_factor: expert capacity relative to an even split, training.
      eval_capacity_factor: the same for evaluation and decoding.
      min_expert_capacity: the fewest slots an expert gets per group.
      group_size: most tokens per routing group (groups are slices of one sequence).
      sequences_per_group: when above 1, a routing group is that many whole sequences of
        the batch instead (upstream groups tokens across the batch), or the greatest common
        divisor of it and the batch size where the batch is not a multiple (decoding).
        Larger groups even out the statistical imbalance that drops tokens.
      jitter_noise: at training time router inputs are scaled by
        ``uniform(1 - jitter, 1 + jitter)``; 0 disables it.
      batch_prioritized_routing: tokens-choose routing fills experts by router
        confidence, not position (encoder layers only: it would let a decoder
        token's routing depend on later tokens).
      ignore_padding_tokens: padding tokens take no expert slot and weigh 0 in the
        load-balancing loss (upstream's router option of that name; off by
        default, as upstream). Padding is where the layer's attention mask has an
        empty row: encoder inputs, decoder targets equal to 0.
      expert_mlp_dim: hidden width of each expert; None uses ``mlp_dim``.
      expert_dtype: dtype of the dispatched activations and expert matmuls
        (None: the activation ``dtype``); bfloat16 halves all-to-all traffic.
    """

    num_experts: int = 8
    num_selected_experts: int = 1
    router: str = "tokens_choose"
    moe_layer_period: int = 2
    train_capacity_factor: float = 1.25
    eval_capacity_factor: float = 2.0
    min_expert_capacity: int = 4
    group_size: int = 4096
    sequences_per_group: int = 1
    jitter_noise: float = 0.0
    batch_prioritized_routing: bool = False
    ignore_padding_tokens: bool = False
    expert_mlp_dim: int | None = None
    expert_dtype: Any = None

    @property
    def expert_hidden_dim(self) -> int:
        """The experts' hidden width."""
        return self.expert_mlp_dim or self.mlp_dim  # type: ignore[attr-defined]

    def is_sparse(self, layer: int) -> bool:
        """Whether layer ``layer`` of a stack has an MoE block instead of a dense MLP."""
        return layer % self.moe_layer_period == self.moe_layer_period - 1

    def _check_moe(self, stacks: dict[str, int]) -> None:
        who = type(self).__name__
        for name in (
            "num_experts",
            "num_selected_experts",
            "moe_layer_period",
            "group_size",
            "sequences_per_group",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{who}.{name} must be a positive int, got {value!r}")
        if self.router not in ROUTERS:
            raise ValueError(f"{who}.router must be one of {ROUTERS}, got {self.router!r}")
        if self.num_selected_experts > self.num_experts:
            raise ValueError(
                f"{who}.num_selected_experts ({self.num_selected_experts}) exceeds num_experts "
                f"({self.num_experts})"
            )
        for name in ("train_capacity_factor", "eval_capacity_factor"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"{who}.{name} must be a positive number, got {value!r}")
        if not isinstance(self.min_expert_capacity, int) or self.min_expert_capacity < 0:
            raise ValueError(
                f"{who}.min_expert_capacity must be an int >= 0, got {self.min_expert_capacity!r}"
            )
        if not 0.0 <= self.jitter_noise < 1.0:
            raise ValueError(f"{who}.jitter_noise must be in [0, 1), got {self.jitter_noise!r}")
        if self.expert_mlp_dim is not None and (
            not isinstance(self.expert_mlp_dim, int) or self.expert_mlp_dim <= 0
        ):
            raise ValueError(
                f"{who}.expert_mlp_dim must be a positive int or None, got {self.expert_mlp_dim!r}"
            )
        if getattr(self, "scan_layers", False):
            # Scanned, the repeated unit is a block of `moe_layer_period` layers.
            for stack, depth in stacks.items():
                if depth % self.moe_layer_period:
                    raise ValueError(
                        f"{who}.scan_layers=True scans blocks of moe_layer_period={self.moe_layer_period} "
                        f"layers, but the {stack} has {depth} layers ({depth} % {self.moe_layer_period} = "
                        f"{depth % self.moe_layer_period}); use a period that divides the depth or "
                        "scan_layers=False"
                    )
        for stack, depth in stacks.items():
            if not any(self.is_sparse(i) for i in range(depth)):
                raise ValueError(
                    f"{who}.moe_layer_period={self.moe_layer_period} leaves the {depth}-layer {stack} without "
                    f"an MoE layer; use a period of at most {depth}"
                )


@dataclasses.dataclass(frozen=True, kw_only=True)
class MoeT5Config(T5Config, MoeFields):
    """An encoder-decoder whose every ``moe_layer_period``-th MLP is a mixture of experts.

    ``router='experts_choose'`` applies to the encoder; the decoder's MoE layers
    always route tokens-choose (without batch prioritisation), as a decoder must
    not route on later tokens.
    """

    def __post_init__(self) -> None:
        super().__post_init__()
        self._check_moe({"encoder": self.num_encoder_layers, "decoder": self.num_decoder_layers})


@dataclasses.dataclass(frozen=True, kw_only=True)
class MoeDecoderOnlyConfig(DecoderOnlyConfig, MoeFields):
    """A decoder-only LM whose every ``moe_layer_period``-th MLP is a mixture of experts."""

    def __post_init__(self) -> None:
        super().__post_init__()
        who = type(self).__name__
        if self.router != "tokens_choose" or self.batch_prioritized_routing:
            raise ValueError(
                f"{who}: a decoder must route tokens-choose without batch prioritisation (experts-choose and "
                f"BPR route on later tokens); got router={self.router!r}, "
                f"batch_prioritized_routing={self.batch_prioritized_routing}"
            )
        self._check_moe({"decoder": self.num_layers})
