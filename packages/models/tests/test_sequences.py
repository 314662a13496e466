"""remove_prefix and count_packed_examples (upstream t5x.models helpers)."""

import jax
import numpy as np

from t5x import models


def test_remove_prefix_shifts_each_row_by_its_own_length_under_jit():
    rows = np.array([[5, 6, 7, 8, 0], [1, 2, 3, 0, 0], [9, 9, 9, 9, 9]])
    out = jax.jit(models.remove_prefix)(rows, np.array([1, 0, 5]))
    np.testing.assert_array_equal(out, [[6, 7, 8, 0, 0], [1, 2, 3, 0, 0], [0, 0, 0, 0, 0]])


def test_count_packed_examples_counts_segment_starts_not_ids():
    # Ids need not be consecutive or start at 1; padding (0) is not an example.
    segments = np.array([[3, 3, 1, 1, 0, 0], [0, 0, 0, 0, 0, 0], [4, 2, 2, 4, 4, 4]])
    assert int(models.count_packed_examples(segments)) == 2 + 0 + 3
