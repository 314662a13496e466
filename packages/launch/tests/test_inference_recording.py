"""Inference evaluation stops at ``max_examples`` without dropping a partly used batch."""

import numpy as np
import pytest

from t5x.launch._inference import _recording


def _batches(count: int, size: int):
    for b in range(count):
        first = b * size + 1  # every row's target is non-zero and tells which example it is
        targets = np.arange(first, first + size, dtype=np.int32)[:, None] * np.ones((1, 3), np.int32)
        yield {"encoder_input_tokens": targets.copy(), "decoder_target_tokens": targets}


@pytest.mark.parametrize(
    ("count", "size", "max_examples", "batches_out", "recorded"),
    [
        (4, 64, 8, 1, 8),  # the limit falls inside the first batch: it is still decoded
        (4, 8, 10, 2, 10),  # ... inside the second
        (4, 8, 16, 2, 16),  # ... on a batch boundary: no third batch
        (3, 8, None, 3, 24),
        (3, 8, 0, 0, 0),
    ],
)
def test_limit_keeps_the_batch_it_falls_in(count, size, max_examples, batches_out, recorded):
    record: list = []
    yielded = list(_recording(_batches(count, size), record, max_examples))
    assert len(yielded) == batches_out
    assert len(record) == recorded
    assert [targets[0] for _, targets in record] == list(range(1, recorded + 1))
