"""Sparse upcycling: an MoE model's initial parameters from a dense checkpoint.

Every expert of a sparse layer starts as a copy of that layer's dense MLP
(``.../mlp/wi/kernel`` -> ``.../mlp/expert/wi/kernel[e]``), routers keep their fresh
initialisation, and every other parameter is taken over unchanged: what
upstream's ``sparse_upcycle.gin`` does with its assignment map.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from t5x.checkpointing import load_t5x_checkpoint
from t5x.models import DecoderOnlyConfig, T5Config, unscan_params
from t5x.moe._scan import is_scanned_moe, scan_moe_params, unscan_moe_params


@functools.lru_cache(maxsize=2)
def _load(path: str) -> dict[str, Any]:
    return load_t5x_checkpoint(path)["target"]


def load_dense_params(path: str) -> dict[str, Any]:
    """The ``target`` parameters of a T5X checkpoint (numpy leaves, read once per path)."""
    return _load(str(path))


def _is_scanned(flat: dict[tuple[str, ...], Any]) -> bool:
    return any(len(p) > 1 and p[1] == "layers" for p in flat)


def upcycle_params(dense: Any, moe: Any, config: Any) -> dict[str, Any]:
    """Builds MoE parameters from ``dense`` ones, shaped and named like ``moe``.

    Args:
      dense: a dense twin's parameter tree (unscanned or scanned, upstream names).
      moe: the MoE model's freshly initialised parameters (routers are kept from it),
        unscanned or scanned.
      config: the MoE config (to unscan a scanned dense tree, or restack a scanned MoE one).

    Returns:
      The upcycled tree, in ``moe``'s layout.

    Raises:
      ValueError: when a parameter is missing from the dense tree or its shape does
        not match (for experts: the dense MLP's shape against one expert's).
    """
    if is_scanned_moe(moe):
        return scan_moe_params(upcycle_params(dense, unscan_moe_params(moe, config), config), config)
    flat_dense = traverse_util.flatten_dict(dict(dense))
    if _is_scanned(flat_dense):
        base = T5Config if hasattr(config, "num_encoder_layers") else DecoderOnlyConfig
        fields = {f.name: getattr(config, f.name) for f in dataclasses.fields(base)}
        flat_dense = traverse_util.flatten_dict(unscan_params(dense, base(**{**fields, "scan_layers": True})))
    out = {}
    for path, init in traverse_util.flatten_dict(dict(moe)).items():
        name = "/".join(path)
        if "router" in path:
            out[path] = init
            continue
        if "expert" in path:
            i = path.index("expert")
            source = path[:i] + path[i + 1 :]
            want = tuple(np.shape(init)[1:])
        else:
            source = path
            want = tuple(np.shape(init))
        if source not in flat_dense:
            raise ValueError(
                f"upcycling: the dense checkpoint has no {'/'.join(source)!r} for MoE parameter {name!r}"
            )
        value = flat_dense[source]
        got = tuple(np.shape(value))
        if got != want:
            what = f"one expert of {name!r}" if "expert" in path else repr(name)
            raise ValueError(
                f"upcycling: dense {'/'.join(source)!r} has shape {got} but {what} needs {want}; the dense "
                "model's sizes (emb_dim, mlp_dim / expert_mlp_dim, heads, vocab) must match the MoE config"
            )
        value = jnp.asarray(np.asarray(value) if not hasattr(value, "shape") else value, jnp.float32)
        out[path] = jnp.broadcast_to(value, np.shape(init)) if "expert" in path else value
    return traverse_util.unflatten_dict(out)
