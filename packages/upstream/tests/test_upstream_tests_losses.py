"""t5x.losses._sum_weights_per_segment, the private helper upstream's losses_test calls."""

import numpy as np

from t5x import losses


def test_sum_weights_per_segment_sums_each_packed_sequence_and_zeroes_padding():
    weights = np.array([[0.5, 1.0, 0.25, 2.0, 1.5], [1.0, 2.0, 3.0, 4.0, 5.0]], np.float32)
    positions = np.array([[0, 1, 2, 0, 0], [0, 0, 1, 0, 0]])
    segment_ids = np.array([[1, 1, 1, 2, 3], [1, 2, 2, 3, 0]])
    sums = losses._sum_weights_per_segment(positions, segment_ids, weights)
    np.testing.assert_allclose(sums, [[1.75, 1.75, 1.75, 2.0, 1.5], [1.0, 5.0, 5.0, 4.0, 0.0]])


def test_sum_weights_per_segment_agrees_with_average_per_sequence_weights():
    batch = {
        "decoder_target_tokens": np.array([[3, 4, 5, 6]], np.int32),
        "decoder_loss_weights": np.array([[1.0, 3.0, 2.0, 2.0]], np.float32),
        "decoder_positions": np.array([[0, 1, 0, 1]]),
        "decoder_segment_ids": np.array([[1, 1, 2, 2]]),
    }
    _, weights = losses.get_loss_normalizing_factor_and_weights(
        loss_normalizing_factor=losses.SpecialLossNormalizingFactor.AVERAGE_PER_SEQUENCE, batch=batch
    )
    sums = losses._sum_weights_per_segment(
        batch["decoder_positions"], batch["decoder_segment_ids"], batch["decoder_loss_weights"]
    )
    np.testing.assert_allclose(weights, batch["decoder_loss_weights"] / np.asarray(sums))
