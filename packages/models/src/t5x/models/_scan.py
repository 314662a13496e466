"""Conversion between unscanned (``layers_<i>``) and scanned (``layers``) parameter trees."""

from __future__ import annotations

from typing import Any

import numpy as np
from flax import traverse_util

from t5x.models._config import DecoderOnlyConfig, T5Config

_ATTENTION = ("attention", "self_attention", "encoder_decoder_attention")


def _stacks(config: T5Config | DecoderOnlyConfig) -> dict[str, int]:
    if isinstance(config, T5Config):
        return {"encoder": config.num_encoder_layers, "decoder": config.num_decoder_layers}
    return {"decoder": config.num_layers}


def _split_kernel(path: tuple[str, ...], x: Any, heads: int, head_dim: int) -> Any:
    if len(path) >= 3 and path[-3] in _ATTENTION and path[-1] == "kernel":
        if path[-2] == "out":
            return np.reshape(x, (heads, head_dim, x.shape[-1]))
        return np.reshape(x, (x.shape[0], heads, head_dim))
    return x


def _join_kernel(path: tuple[str, ...], x: Any) -> Any:
    if len(path) >= 3 and path[-3] in _ATTENTION and path[-1] == "kernel":
        if path[-2] == "out":
            return np.reshape(x, (x.shape[0] * x.shape[1], x.shape[2]))
        return np.reshape(x, (x.shape[0], x.shape[1] * x.shape[2]))
    return x


def scan_params(params: dict[str, Any], config: T5Config | DecoderOnlyConfig) -> dict[str, Any]:
    """Stacks ``<stack>/layers_<i>/...`` into ``<stack>/layers/...`` (layer axis 1).

    Attention kernels also move from t5's joined ``[embed, heads*head_dim]``
    layout to the scalable-T5 ``[embed, layers, heads, head_dim]`` one.

    Args:
      params: an unscanned parameter tree with upstream names.
      config: the network's configuration (for the depths and head shapes).

    Returns:
      The scanned tree (numpy leaves).

    Raises:
      KeyError: when a layer is missing.
    """
    flat = traverse_util.flatten_dict(params)
    out: dict[tuple[str, ...], Any] = {}
    per_layer: dict[tuple[str, ...], list[Any]] = {}
    stacks = _stacks(config)
    for path, value in flat.items():
        if len(path) > 1 and path[0] in stacks and path[1].startswith("layers_"):
            rest = path[2:]
            per_layer.setdefault((path[0], *rest), [None] * stacks[path[0]])[
                int(path[1][len("layers_") :])
            ] = value
        else:
            out[path] = np.asarray(value)
    for (stack, *rest), values in per_layer.items():
        if any(v is None for v in values):
            raise KeyError(
                f"{stack}/layers_<i>/{'/'.join(rest)} is missing for some of the {len(values)} layers"
            )
        split = [_split_kernel(tuple(rest), np.asarray(v), config.num_heads, config.head_dim) for v in values]
        out[(stack, "layers", *rest)] = np.stack(split, axis=1)
    return traverse_util.unflatten_dict(out)


def unscan_params(params: dict[str, Any], config: T5Config | DecoderOnlyConfig) -> dict[str, Any]:
    """Inverse of :func:`scan_params`: ``<stack>/layers/...`` to ``<stack>/layers_<i>/...``."""
    flat = traverse_util.flatten_dict(params)
    out: dict[tuple[str, ...], Any] = {}
    stacks = _stacks(config)
    for path, value in flat.items():
        if len(path) > 1 and path[0] in stacks and path[1] == "layers":
            rest = tuple(path[2:])
            value = np.asarray(value)
            for i in range(value.shape[1]):
                out[(path[0], f"layers_{i}", *rest)] = _join_kernel(rest, np.take(value, i, axis=1))
        else:
            out[path] = np.asarray(value)
    return traverse_util.unflatten_dict(out)
