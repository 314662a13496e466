"""Small array helpers on token and segment-id batches (upstream t5x.models names)."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def remove_prefix(sequences: jax.Array, prefix_lengths: jax.Array) -> jax.Array:
    """Drops the first ``prefix_lengths[i]`` tokens of row ``i``, shifting the rest left, zero-filled.

    Used to strip a decoding prompt from its outputs. ``sequences`` is ``[batch, length]``,
    ``prefix_lengths`` ``[batch]``; works under ``jit``.
    """
    length = sequences.shape[-1]
    positions = jnp.arange(length)
    source = positions[None, :] + prefix_lengths[:, None]
    shifted = jnp.take_along_axis(sequences, jnp.minimum(source, length - 1), axis=-1)
    return jnp.where(source < length, shifted, jnp.zeros_like(shifted))


def count_packed_examples(segment_ids: jax.Array) -> jax.Array:
    """How many examples a packed batch holds: the starts of non-padding segments, all rows together."""
    segment_ids = jnp.asarray(segment_ids)
    previous = jnp.pad(segment_ids[:, :-1], ((0, 0), (1, 0)))
    starts = (segment_ids != previous) & (segment_ids != 0)
    return jnp.sum(starts, dtype=jnp.int32)
