"""Mixture-of-Experts T5 models: routers, MoE layers, expert parallelism and sparse upcycling."""

from t5x.moe._config import MoeDecoderOnlyConfig, MoeFields, MoeT5Config
from t5x.moe._layers import Experts, MoeBlock, Router, RouterWeights
from t5x.moe._models import MOE_METRICS, MoeDecoderOnlyModel, MoeEncoderDecoderModel, dense_twin
from t5x.moe._network import (
    MoeDecoder,
    MoeDecoderLayer,
    MoeDecoderOnlyTransformer,
    MoeEncoder,
    MoeEncoderDecoderTransformer,
    MoeEncoderLayer,
)
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
from t5x.moe._upcycle import load_dense_params, upcycle_params

__all__ = [
    "MOE_METRICS",
    "MOE_PRESETS",
    "Experts",
    "MoeBlock",
    "MoeDecoder",
    "MoeDecoderLayer",
    "MoeDecoderOnlyConfig",
    "MoeDecoderOnlyModel",
    "MoeDecoderOnlyTransformer",
    "MoeEncoder",
    "MoeEncoderDecoderModel",
    "MoeEncoderDecoderTransformer",
    "MoeEncoderLayer",
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
    "moe_logical_axis_rules",
    "moe_preset",
    "router_z_loss",
    "tokens_choose",
    "tokens_per_group",
    "upcycle_params",
]
