"""``t5x.losses``: upstream t5x's module name for the loss functions, which live in ``t5x.models``."""

from __future__ import annotations

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
