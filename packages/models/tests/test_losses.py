"""Loss normalising factors: AVERAGE_PER_SEQUENCE on packed rows."""

import jax.numpy as jnp
import numpy as np

from t5x.models import SpecialLossNormalizingFactor, get_loss_normalizing_factor_and_weights


def test_average_per_sequence_counts_packed_sequences_not_padding():
    # Row 0 packs sequences 1, 2, 3; row 1 packs 1, 2 and ends in padding (segment 0) that
    # carries a non-zero weight, which must neither count as a sequence nor get weight.
    batch = {
        "decoder_target_tokens": jnp.asarray([[7, 8, 9, 4, 5], [5, 6, 7, 0, 0]], jnp.int32),
        "decoder_loss_weights": jnp.asarray([[1.0, 1.0, 2.0, 4.0, 0.5], [3.0, 1.0, 1.0, 2.0, 2.0]]),
        "decoder_segment_ids": jnp.asarray([[1, 1, 1, 2, 3], [1, 2, 2, 0, 0]]),
        "decoder_positions": jnp.asarray([[0, 1, 2, 0, 0], [0, 0, 1, 0, 0]]),
    }
    factor, weights = get_loss_normalizing_factor_and_weights(
        SpecialLossNormalizingFactor.AVERAGE_PER_SEQUENCE, batch
    )
    np.testing.assert_allclose(factor, 5.0, rtol=1e-6)  # five packed sequences
    np.testing.assert_allclose(weights, [[0.25, 0.25, 0.5, 1.0, 1.0], [1.0, 0.5, 0.5, 0.0, 0.0]], rtol=1e-6)


def test_average_per_sequence_unpacked_gives_each_row_equal_weight():
    batch = {"decoder_target_tokens": jnp.asarray([[3, 4, 5, 6, 0], [7, 8, 0, 0, 0]], jnp.int32)}
    factor, weights = get_loss_normalizing_factor_and_weights("average_per_sequence", batch)
    np.testing.assert_allclose(factor, 2.0)
    np.testing.assert_allclose(weights, [[0.25] * 4 + [0.0], [0.5, 0.5, 0, 0, 0]])
