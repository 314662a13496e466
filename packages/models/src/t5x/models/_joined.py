"""Kernels that read the same input, side by side, for decoding one row at a time.

A decoding step of batch 1 multiplies a single row by every kernel. XLA:CPU runs one
``[1, 512] x [512, 1536]`` product faster than three ``[1, 512] x [512, 512]`` ones (DEC-S
shapes: a step's products 10.0 -> 7.6 ms), and no faster with more rows, so the join is
made once per decode call, outside its loop, and used only when a step has one row.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

# The variable collection `join_decode_kernels` fills, mirroring the parameter tree.
JOINED = "joined_kernels"

_GATED_INPUT = re.compile(r"wi_(\d+)")


def join_decode_kernels(params: Mapping[str, Any]) -> dict[str, Any]:
    """Returns the ``joined_kernels`` collection for ``params`` (empty when nothing joins).

    Every ``self_attention`` gets ``qkv``: its query, key and value kernels concatenated on
    the output axis, ``[embed, 3 * heads * head_dim]``. Every gated MLP gets ``wi``: its
    ``wi_0``, ``wi_1``, ... kernels concatenated the same way. Only two-dimensional kernels
    join (the ``t5`` layout of unscanned layers); others are left out and their modules
    multiply as usual.
    """

    def walk(tree: Mapping[str, Any], name: str) -> dict[str, Any]:
        joined: dict[str, Any] = {}
        for key, sub in tree.items():
            if isinstance(sub, Mapping) and (found := walk(sub, key)):
                joined[key] = found
        if name == "self_attention":
            qkv = _kernels(tree, ("query", "key", "value"))
            if qkv is not None:
                joined["qkv"] = jnp.concatenate(qkv, axis=1)
        gated = sorted((k for k in tree if _GATED_INPUT.fullmatch(k)), key=lambda k: int(k[3:]))
        wi = _kernels(tree, gated) if len(gated) > 1 else None
        if wi is not None:
            joined["wi"] = jnp.concatenate(wi, axis=1)
        return joined

    return walk(params, "")


def _kernels(tree: Mapping[str, Any], names: Sequence[str]) -> list[jax.Array] | None:
    """The 2-D ``kernel`` of each of ``names`` in ``tree``, or None unless all have one."""
    kernels = []
    for name in names:
        kernel = tree[name].get("kernel") if isinstance(tree.get(name), Mapping) else None
        if kernel is None or jnp.ndim(kernel) != 2:
            return None
        kernels.append(kernel)
    return kernels


def joined_kernel(module: nn.Module, name: str, inputs: jax.Array) -> jax.Array | None:
    """``module``'s joined kernel ``name`` for a step of one row (``inputs``), else None.

    For a module whose step multiplies with joined kernels (``step_kernels="joined"``).

    Raises:
      ValueError: when the ``joined_kernels`` collection lacks the module's kernel.
    """
    if math.prod(inputs.shape[:-1]) != 1:
        return None
    joined: jax.Array | None = module.get_variable(JOINED, name)
    if joined is None:
        raise ValueError(
            f"{module.name}: a step on joined kernels needs the {JOINED!r} collection with this "
            f"layer's {name!r} (`join_decode_kernels` of the parameters)"
        )
    return joined
