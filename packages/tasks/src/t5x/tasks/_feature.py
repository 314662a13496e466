"""Output features of a task: which vocabulary, EOS, dtype and rank."""

from __future__ import annotations

import dataclasses
from typing import Any

import tensorflow as tf

from t5x.interfaces import Vocabulary


@dataclasses.dataclass(frozen=True)
class Feature:
    """An output feature of a Task (seqio's ``Feature``).

    Attributes:
      vocabulary: the Vocabulary that encodes and decodes this feature.
      add_eos: whether EOS is appended (by ``append_eos`` and friends).
      required: whether every example must hold this feature.
      dtype: the tf dtype of the tokenized feature.
      rank: the rank of the feature (1 for token sequences).
    """

    vocabulary: Vocabulary
    add_eos: bool = True
    required: bool = True
    dtype: Any = tf.int32
    rank: int = 1

    def __post_init__(self) -> None:
        for member in ("vocab_size", "eos_id", "encode_tf", "decode"):
            if not hasattr(self.vocabulary, member):
                raise TypeError(
                    f"Feature.vocabulary must implement the t5x.interfaces.Vocabulary contract; "
                    f"{type(self.vocabulary).__name__} lacks {member!r}"
                )
        if not isinstance(self.rank, int) or self.rank < 0:
            raise ValueError(f"Feature.rank must be an int >= 0, got {self.rank!r}")
        object.__setattr__(self, "dtype", tf.as_dtype(self.dtype))
