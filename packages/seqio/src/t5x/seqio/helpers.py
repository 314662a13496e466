"""``seqio.helpers``: deriving tasks and mixtures from registered ones."""

from __future__ import annotations

from t5x.seqio._helpers import (
    TruncatedDatasetProvider,
    mixture_or_task_with_new_vocab,
    mixture_or_task_with_truncated_data,
    mixture_with_missing_task_splits_removed,
)

__all__ = [
    "TruncatedDatasetProvider",
    "mixture_or_task_with_new_vocab",
    "mixture_or_task_with_truncated_data",
    "mixture_with_missing_task_splits_removed",
]
