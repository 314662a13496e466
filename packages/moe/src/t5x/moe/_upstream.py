"""Upstream (flaxformer) MoE checkpoints: their parameter trees in this package's layout.

Unscanned, flaxformer's MoE names are this package's (``<stack>/layers_<i>/mlp/expert/wi_0/kernel``
``[experts, embed, mlp]``, ``.../mlp/router/router_weights/w/kernel`` ``[embed, experts]``, the
dense layers' names as in ``t5x.models``). Scanned, flaxformer keeps the blocks of
``moe_layer_period`` layers under ``<stack>/<stack>/subblock_<j>/...`` (layers axis 1) with
attention kernels in the joined ``[embed, heads * head_dim]`` layout; this module unstacks
them into the unscanned names, and restacks for a scanned model.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from flax import traverse_util

from t5x.checkpointing import load_t5x_checkpoint
from t5x.moe._scan import _stacks, scan_moe_params


def _is_flaxformer_scanned(flat: dict[tuple[str, ...], Any], stacks: dict[str, int]) -> bool:
    return any(len(p) > 2 and p[0] in stacks and p[1] == p[0] and p[2].startswith("subblock_") for p in flat)


def unscan_flaxformer_moe_params(params: Any, config: Any) -> dict[str, Any]:
    """Flaxformer's scanned MoE tree (``<stack>/<stack>/subblock_<j>``) as unscanned upstream names.

    Layer ``i`` is sub-block ``i % period`` of scan step ``i // period``. A tree that is
    not scanned is returned unchanged.

    Raises:
      ValueError: when a sub-block does not fit ``moe_layer_period`` or the depth.
    """
    stacks = _stacks(config)
    period = config.moe_layer_period
    flat = traverse_util.flatten_dict(dict(params))
    if not _is_flaxformer_scanned(flat, stacks):
        return dict(params)
    out: dict[tuple[str, ...], Any] = {}
    for path, value in flat.items():
        if not (len(path) > 2 and path[0] in stacks and path[1] == path[0]):
            out[path] = value
            continue
        stack, block, rest = path[0], path[2], path[3:]
        j = int(block[len("subblock_") :])
        value = np.asarray(value)
        steps = value.shape[1] if value.ndim > 1 else 0
        if j >= period or steps * period != stacks[stack]:
            raise ValueError(
                f"upstream checkpoint: {'/'.join(path)} has shape {value.shape} (layers axis 1), but "
                f"the config's {stack} has {stacks[stack]} layers in blocks of moe_layer_period={period} "
                f"(expected sub-blocks 0..{period - 1}, {stacks[stack] // period} scan steps)"
            )
        for b in range(steps):
            out[(stack, f"layers_{b * period + j}", *rest)] = np.take(value, b, axis=1)
    return traverse_util.unflatten_dict(out)


def upstream_moe_params(params: Any, config: Any) -> dict[str, Any]:
    """An upstream MoE parameter tree (scanned or not) in the layout ``config`` builds.

    Raises:
      ValueError: for a bias parameter (routers and experts here are bias-free, as
        upstream's ``moe.gin`` builds them; a bias would otherwise be ignored silently).
    """
    biases = ["/".join(p) for p in traverse_util.flatten_dict(dict(params)) if p[-1] == "bias"]
    if biases:
        raise ValueError(
            f"upstream checkpoint has bias parameters ({', '.join(biases[:3])}"
            f"{', ...' if len(biases) > 3 else ''}): t5x-moe's routers and experts have none "
            "(upstream's moe.gin sets use_bias=False); convert or drop them first"
        )
    unscanned = unscan_flaxformer_moe_params(params, config)
    return scan_moe_params(unscanned, config) if config.scan_layers else unscanned


def load_upstream_moe_params(path: str, config: Any) -> dict[str, Any]:
    """The ``target`` of an upstream T5X MoE checkpoint, in the layout ``config`` builds."""
    return upstream_moe_params(load_t5x_checkpoint(path)["target"], config)
