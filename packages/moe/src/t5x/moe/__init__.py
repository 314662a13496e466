"""Mixture-of-Experts T5 models: routers, MoE layers, expert parallelism and sparse upcycling."""

from t5x.moe._config import MoeDecoderOnlyConfig, MoeFields, MoeT5Config
from t5x.moe._factor_rules import logical_factor_rules
from t5x.moe._layers import Experts, MoeBlock, Router, RouterWeights
from t5x.moe._models import MOE_METRICS, MoeDecoderOnlyModel, MoeEncoderDecoderModel, dense_twin
from t5x.moe._network import MoeDecoderOnlyTransformer, MoeEncoderDecoderTransformer, moe_feed_forward
from t5x.moe._partitioning import MoePjitPartitioner, moe_logical_axis_rules
from t5x.moe._presets import MOE_PRESETS, moe_preset
from t5x.moe._routing import (
    Routing,
    expert_capacity,
    experts_choose,
    load_balancing_loss,
    router_z_loss,
    tokens_choose,
    tokens_per_group,
)
from t5x.moe._scan import scan_moe_params, unscan_moe_params
from t5x.moe._upcycle import load_dense_params, upcycle_params
from t5x.moe._upstream import load_upstream_moe_params, unscan_flaxformer_moe_params, upstream_moe_params

__all__ = [
    "MOE_METRICS",
    "MOE_PRESETS",
    "Experts",
    "MoeBlock",
    "MoeDecoderOnlyConfig",
    "MoeDecoderOnlyModel",
    "MoeDecoderOnlyTransformer",
    "MoeEncoderDecoderModel",
    "MoeEncoderDecoderTransformer",
    "MoeFields",
    "MoePjitPartitioner",
    "MoeT5Config",
    "Router",
    "RouterWeights",
    "Routing",
    "dense_twin",
    "expert_capacity",
    "experts_choose",
    "load_balancing_loss",
    "load_dense_params",
    "load_upstream_moe_params",
    "logical_factor_rules",
    "moe_logical_axis_rules",
    "moe_feed_forward",
    "moe_preset",
    "router_z_loss",
    "scan_moe_params",
    "tokens_choose",
    "tokens_per_group",
    "unscan_flaxformer_moe_params",
    "unscan_moe_params",
    "upcycle_params",
    "upstream_moe_params",
]
