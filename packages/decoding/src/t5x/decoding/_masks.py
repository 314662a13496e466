"""Top-k and top-p (nucleus) filtering of logits."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from t5x.decoding._select import kth_largest_key, mass_cutoff_key, native_top_k, order_key, top_k
from t5x.decoding._state import NEG_INF


def _per_row(value: Any, rows: int) -> jax.Array:
    """Shapes a scalar or ``[rows]`` parameter as ``[rows, 1]`` for broadcasting."""
    value = jnp.asarray(value)
    if value.ndim == 0:
        return jnp.broadcast_to(value, (rows, 1))
    return value.reshape(rows, 1)


def topk_mask(logits: jax.Array, topk: Any, replace_val: Any = NEG_INF) -> jax.Array:
    """Replaces every logit below the k-th largest of its row by ``replace_val``.

    Logits tied with the k-th largest are all kept, so a row can keep more than k entries.
    ``topk`` 0 keeps the row unchanged. The k-th value is found by bisection (32 counting
    passes), which needs no sort and keeps batch-sharded logits sharded; a constant ``topk``
    on one CPU device takes it from ``lax.top_k`` instead (see `native_top_k`).

    Args:
      logits: ``[batch, vocab]``.
      topk: int, scalar or ``[batch]`` (may be traced).
      replace_val: the value written into the removed entries.

    Returns:
      ``[batch, vocab]`` filtered logits.

    Raises:
      ValueError: if a concrete ``topk`` is negative or larger than the vocabulary.
    """
    vocab = logits.shape[-1]
    if isinstance(topk, int | np.integer):
        if not 0 <= topk <= vocab:
            raise ValueError(f"topk must be in [0, vocab size {vocab}], got topk={topk}")
        if topk == 0:
            return logits
        if native_top_k(logits):
            kth = top_k(logits, int(topk))[0][..., -1:]
            return jnp.where(logits >= kth, logits, replace_val).astype(logits.dtype)
    k = jnp.clip(_per_row(topk, logits.shape[0]).astype(jnp.int32), 0, vocab)
    keep = (order_key(logits) >= kth_largest_key(logits, jnp.maximum(k, 1))) | (k <= 0)
    return jnp.where(keep, logits, replace_val).astype(logits.dtype)


def topp_mask(logits: jax.Array, topp: Any, replace_val: Any = NEG_INF) -> jax.Array:
    """Keeps the smallest set of most likely tokens whose probability reaches ``topp``.

    A token is kept when the probability mass of the tokens strictly more likely than it is
    below ``topp``; so the most likely token is always kept, ties are kept together, and
    ``topp`` of 0 or >= 1 keeps everything. The cut-off is found by bisection (no sort).

    Args:
      logits: ``[batch, vocab]``; probabilities are ``softmax(logits)``.
      topp: float, scalar or ``[batch]`` (may be traced).
      replace_val: the value written into the removed entries.

    Returns:
      ``[batch, vocab]`` filtered logits.
    """
    p = _per_row(topp, logits.shape[0]).astype(jnp.float32)
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
    # Keeping {probs >= t} for the largest t whose mass reaches p is the same set as
    # "mass strictly above the token < p".
    keep = (order_key(probs) >= mass_cutoff_key(probs, p)) | (p <= 0.0) | (p >= 1.0)
    return jnp.where(keep, logits, replace_val).astype(logits.dtype)
