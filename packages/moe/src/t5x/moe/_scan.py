"""Unscanned <-> scanned MoE parameter trees.

Scanned, an MoE stack repeats a block of ``moe_layer_period`` layers: layer ``i`` is
``subblock_<i % period>`` of block ``i // period``, and every parameter of a sub-block
is stacked over the blocks on axis 1 (``<stack>/layers/subblock_<j>/...``). Attention
kernels also change layout as in the dense ``t5x.models.scan_params``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
from flax import traverse_util

from t5x.models import DecoderOnlyConfig, T5Config, scan_params, unscan_params


def _stacks(config: Any) -> dict[str, int]:
    if hasattr(config, "num_encoder_layers"):
        return {"encoder": config.num_encoder_layers, "decoder": config.num_decoder_layers}
    return {"decoder": config.num_layers}


def _dense_blocks_config(config: Any, blocks: dict[str, int]) -> T5Config | DecoderOnlyConfig:
    """A dense config with ``blocks`` layers per stack: what the dense (un)scanner needs."""
    base = T5Config if hasattr(config, "num_encoder_layers") else DecoderOnlyConfig
    fields = {f.name: getattr(config, f.name) for f in dataclasses.fields(base)}
    if base is T5Config:
        fields.update(num_encoder_layers=blocks["encoder"], num_decoder_layers=blocks["decoder"])
    else:
        fields.update(num_layers=blocks["decoder"])
    return base(**{**fields, "scan_layers": True})


def scan_moe_params(params: Any, config: Any) -> dict[str, Any]:
    """Restacks an unscanned MoE tree (``<stack>/layers_<i>/...``) into the scanned layout.

    Raises:
      ValueError: when a stack's depth is not a multiple of ``moe_layer_period``.
    """
    period = config.moe_layer_period
    stacks = _stacks(config)
    for stack, depth in stacks.items():
        if depth % period:
            raise ValueError(
                f"cannot scan the {depth}-layer {stack} in blocks of moe_layer_period={period} layers"
            )
    blocks = {s: d // period for s, d in stacks.items()}
    dense_cfg = _dense_blocks_config(config, blocks)
    flat = traverse_util.flatten_dict(dict(params))
    out: dict[tuple[str, ...], Any] = {}
    per_position: list[dict[tuple[str, ...], Any]] = [{} for _ in range(period)]
    for path, value in flat.items():
        if len(path) > 1 and path[0] in stacks and path[1].startswith("layers_"):
            i = int(path[1][len("layers_") :])
            per_position[i % period][(path[0], f"layers_{i // period}", *path[2:])] = value
        else:
            out[path] = np.asarray(value)
    for j, part in enumerate(per_position):
        scanned = traverse_util.flatten_dict(scan_params(traverse_util.unflatten_dict(part), dense_cfg))
        for path, value in scanned.items():
            out[(path[0], "layers", f"subblock_{j}", *path[2:])] = value
    return traverse_util.unflatten_dict(out)


def unscan_moe_params(params: Any, config: Any) -> dict[str, Any]:
    """Inverse of :func:`scan_moe_params`."""
    period = config.moe_layer_period
    stacks = _stacks(config)
    dense_cfg = _dense_blocks_config(config, {s: d // period for s, d in stacks.items()})
    flat = traverse_util.flatten_dict(dict(params))
    out: dict[tuple[str, ...], Any] = {}
    per_position: list[dict[tuple[str, ...], Any]] = [{} for _ in range(period)]
    for path, value in flat.items():
        if len(path) > 2 and path[0] in stacks and path[1] == "layers" and path[2].startswith("subblock_"):
            per_position[int(path[2][len("subblock_") :])][(path[0], "layers", *path[3:])] = value
        else:
            out[path] = np.asarray(value)
    for j, part in enumerate(per_position):
        unscanned = traverse_util.flatten_dict(unscan_params(traverse_util.unflatten_dict(part), dense_cfg))
        for path, value in unscanned.items():
            b = int(path[1][len("layers_") :])
            out[(path[0], f"layers_{b * period + j}", *path[2:])] = value
    return traverse_util.unflatten_dict(out)


def is_scanned_moe(params: Any) -> bool:
    """Whether ``params`` has the scanned MoE layout (``<stack>/layers/subblock_<j>``)."""
    flat = traverse_util.flatten_dict(dict(params))
    return any(len(p) > 2 and p[1] == "layers" and p[2].startswith("subblock_") for p in flat)
