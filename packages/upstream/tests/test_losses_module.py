"""``t5x.losses``: upstream's module name for the loss functions of ``t5x.models``."""

from __future__ import annotations

import numpy as np

import t5x.models as models
from t5x import losses


def test_losses_are_the_models_functions_under_upstreams_name():
    assert losses.compute_weighted_cross_entropy is models.compute_weighted_cross_entropy
    batch = {"decoder_target_tokens": np.array([[1, 2, 3, 4, 0], [5, 6, 0, 0, 0]], np.int32)}
    factor, weights = losses.get_loss_normalizing_factor_and_weights(
        loss_normalizing_factor=losses.SpecialLossNormalizingFactor.NUM_REAL_TARGET_TOKENS, batch=batch
    )
    np.testing.assert_allclose(factor, 6.0)
    np.testing.assert_allclose(weights, [[1, 1, 1, 1, 0], [1, 1, 0, 0, 0]])
