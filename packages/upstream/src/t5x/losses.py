"""``t5x.losses``: upstream t5x's module name for the loss functions, which live in ``t5x.models``."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from t5x.models import (
    SpecialLossNormalizingFactor,
    compute_weighted_cross_entropy,
    cross_entropy_with_logits,
    get_loss_normalizing_factor_and_weights,
)

__all__ = [
    "SpecialLossNormalizingFactor",
    "compute_weighted_cross_entropy",
    "cross_entropy_with_logits",
    "get_loss_normalizing_factor_and_weights",
]


def _sum_weights_per_segment(positions: jax.Array, segment_ids: jax.Array, weights: jax.Array) -> jax.Array:
    """Per token, the summed weight of the packed sequence it belongs to: ``[batch, length]``.

    Private in upstream too (its tests call it). Segment 0 is padding and sums to 0.
    ``positions`` is accepted for upstream's signature; the segment ids alone say which
    tokens share a sequence.
    """
    del positions
    same = (segment_ids[:, :, None] == segment_ids[:, None, :]) & (segment_ids[:, :, None] != 0)
    return jnp.sum(jnp.where(same, jnp.asarray(weights)[:, None, :], 0.0), axis=-1)
