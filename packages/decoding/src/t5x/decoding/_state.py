"""The value handed to a model's ``tokens_to_logits`` at every decoding step."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np

PyTree = Any

# Stands in for minus infinity in scores: a true -inf would turn into NaN as soon as two
# masked values are subtracted or a masked score is multiplied by zero.
NEG_INF = np.float32(-1.0e7)

# Temperatures at or below this are treated as zero (greedy): dividing logits by a tiny
# temperature overflows long before it changes the argmax.
MIN_TEMPERATURE = np.float32(1e-4)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class DecodingState:
    """What a model sees when it is asked for the next-token logits.

    Rows are flattened ``batch * num_decodes`` (or ``batch * beams``) with the decodes of one
    example next to each other, the layout produced by :func:`flat_batch_beam_expand`.

    Attributes:
      cur_index: ``[rows]`` int32, the position of ``cur_token`` in ``sequences`` (position 0
        holds the BOS token 0). Rows can differ when decoding starts from a pre-filled cache.
      sequences: ``[rows, length]`` int32, the tokens so far (prompt, decoded tokens, then 0).
      cur_token: ``[rows, 1]`` int32, the token to feed the model at this step.
      cache: the model's cache pytree, as returned by the previous step.
    """

    cur_index: jax.Array
    sequences: jax.Array
    cur_token: jax.Array
    cache: PyTree

    def replace(self, **changes: Any) -> DecodingState:
        """Returns a copy with the given fields replaced."""
        return dataclasses.replace(self, **changes)
