"""Upstream t5x's ``t5x.adafactor`` names: Adafactor as t5x.training's Optax transformation.

Upstream's ``Adafactor`` is a Flax optimizer definition; here the same keywords
build ``t5x.training.adafactor``, which computes the same updates. The learning
rate comes from ``trainer.Trainer.learning_rate_fn`` as upstream's gin files set it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax.numpy as jnp

from t5x import training
from t5x.training import FactorDim, HParamMap, factor_name_to_factordim

HEURISTIC_RULE = training.HEURISTIC_RULE


def Adafactor(
    learning_rate: float | Callable[[Any], Any] | None = None,
    factored: bool = True,
    multiply_by_parameter_scale: bool | HParamMap = True,
    beta1: float | None = None,
    decay_rate: float = 0.8,
    step_offset: int = 0,
    clipping_threshold: float | None = 1.0,
    weight_decay_rate: float | None = None,
    min_dim_size_to_factor: int = 128,
    epsilon1: float = 1e-30,
    epsilon2: float = 1e-3,
    dtype_momentum: Any = jnp.float32,
    factor_map: HParamMap | Mapping[str, Any] | None = None,
    logical_factor_rules: Mapping[str, Any] | None = None,
    weight_decay_rate_lr_exponent: float | None = None,
    global_norm_clip_threshold: float | None = None,
    max_parameter_scale: float | None = None,
    skip_nan_updates: bool = False,
) -> training.Adafactor:
    """Upstream's Adafactor keywords, as a ``t5x.training.Adafactor`` transformation.

    ``logical_factor_rules`` take effect once the launcher binds the parameters'
    logical axes (it does, as upstream's ``set_param_axes`` does).
    """
    return training.adafactor(
        learning_rate=learning_rate,
        factored=factored,
        multiply_by_parameter_scale=multiply_by_parameter_scale,
        beta1=beta1,
        decay_rate=decay_rate,
        step_offset=step_offset,
        clipping_threshold=clipping_threshold,
        weight_decay_rate=weight_decay_rate,
        min_dim_size_to_factor=min_dim_size_to_factor,
        epsilon1=epsilon1,
        epsilon2=epsilon2,
        dtype_momentum=dtype_momentum,
        factor_map=factor_map,
        logical_factor_rules=logical_factor_rules,
        weight_decay_rate_lr_exponent=weight_decay_rate_lr_exponent,
        global_norm_clip_threshold=global_norm_clip_threshold,
        max_parameter_scale=max_parameter_scale,
        skip_nan_updates=skip_nan_updates,
    )


def standard_logical_factor_rules() -> dict[str, FactorDim]:
    """Upstream's logical axis name -> factoring role table (a function of its own for gin)."""
    return training.standard_logical_factor_rules()


__all__ = [
    "HEURISTIC_RULE",
    "Adafactor",
    "FactorDim",
    "HParamMap",
    "factor_name_to_factordim",
    "standard_logical_factor_rules",
]
