"""Selection of the k largest entries and the k-th largest value per row.

``lax.top_k`` and sorts make the SPMD partitioner gather a batch-sharded operand onto every
device (and sorting is slow on CPU). The routines here then only use elementwise operations
and reductions over the last axis, which stay sharded along the leading axes. In a process
with a single CPU device nothing is partitioned, and XLA:CPU's own ``TopK`` (one linear pass
per row) is 10x faster than those passes: there ``lax.top_k`` does the work.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

# Rows up to this long, or more than _MAX_PASSES entries wanted, are sorted; longer rows
# (a beam's candidates over the whole vocabulary) take k argmax passes, linear in the row
# length where a sort on CPU is two orders of magnitude slower.
_SORT_MAX_LENGTH = 4096
_MAX_PASSES = 16


def native_top_k(x: jax.Array) -> bool:
    """Whether ``lax.top_k`` is the fast way to select from ``x``.

    It is where one CPU device runs everything (nothing is partitioned) and ``x``'s dimensions
    are static: a shape-polymorphic export (for TensorFlow) lowers it to dynamic shapes that
    TensorFlow's XLA call cannot compile.

    Beam search's candidates over 4 beams x 32k tokens for 8 examples: 1.1 ms against 12.4 ms
    by the argmax passes below (2-core Xeon).
    """
    static = all(isinstance(d, int) for d in x.shape)
    return static and jax.default_backend() == "cpu" and jax.device_count() == 1


def argmax(x: jax.Array) -> jax.Array:
    """``jnp.argmax(x, axis=-1)`` as int32: the first largest entry, a NaN counting as largest.

    On one CPU device, rows of a multiple of 128 go block-wise: XLA:CPU reduces a row pair by
    pair (value and index), 0.8 ms for 8 rows of 32k; the largest of each 128-entry block,
    then the first block holding the row's largest, then its entry, take 0.2 ms.
    """
    if not native_top_k(x) or x.shape[-1] == 0 or x.shape[-1] % 128:
        return jnp.argmax(x, axis=-1).astype(jnp.int32)
    x = x.reshape(*x.shape[:-1], -1, 128)
    block_max = jnp.max(x, axis=-1)  # NaN-propagating, as argmax's order
    top = jnp.max(block_max, axis=-1, keepdims=True)
    block = _first(block_max, top)
    entries = jnp.take_along_axis(x, block[..., None, None], axis=-2)[..., 0, :]
    return block * 128 + _first(entries, top)


def _first(x: jax.Array, top: jax.Array) -> jax.Array:
    """The index of the first entry of each row of ``x`` equal to ``top`` (or NaN, when it is)."""
    hit = (x == top) | jnp.isnan(x)
    iota = jnp.arange(x.shape[-1], dtype=jnp.int32)
    return jnp.min(jnp.where(hit, iota, x.shape[-1]), axis=-1)


def top_k(x: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
    """The ``k`` largest entries of each row, best first, ties broken by lower index.

    Args:
      x: ``[..., n]`` float array.
      k: static number of entries, ``1 <= k <= n``.

    Returns:
      ``(values [..., k], indices [..., k] int32)``.
    """
    if native_top_k(x):
        # lax.top_k orders -0.0 below +0.0; adding +0.0 makes such zeros tie, as below.
        return jax.lax.top_k(x + 0.0, k)
    if x.shape[-1] <= _SORT_MAX_LENGTH or k > _MAX_PASSES:
        iota = jnp.broadcast_to(jnp.arange(x.shape[-1], dtype=jnp.int32), x.shape)
        # Sorting uses a total order with -0.0 < +0.0; adding +0.0 makes such zeros tie.
        negated, order = jax.lax.sort((-x + 0.0, iota), dimension=x.ndim - 1, is_stable=True, num_keys=1)
        return -negated[..., :k], order[..., :k]
    # -inf entries are lifted to the lowest finite value so a taken slot (-inf) never ties
    # with an untaken one.
    work = jnp.maximum(x, jnp.finfo(x.dtype).min)
    iota = jnp.arange(x.shape[-1], dtype=jnp.int32)
    values, indices = [], []
    for _ in range(k):
        index = jnp.argmax(work, axis=-1).astype(jnp.int32)
        taken = iota == index[..., None]
        values.append(jnp.max(work, axis=-1))
        indices.append(index)
        work = jnp.where(taken, -jnp.inf, work)
    return jnp.stack(values, axis=-1).astype(x.dtype), jnp.stack(indices, axis=-1)


def order_key(x: jax.Array) -> jax.Array:
    """A uint32 key with the same order as the float32 values (for bisection)."""
    # Adding +0.0 turns -0.0 into +0.0, which compare equal as floats.
    bits = jax.lax.bitcast_convert_type(x.astype(jnp.float32) + 0.0, jnp.uint32)
    negative = (bits >> 31) == 1
    return jnp.where(negative, ~bits, bits | jnp.uint32(0x80000000))


def _bisect_largest(predicate, shape: tuple[int, ...]) -> jax.Array:
    """The largest uint32 ``m`` with ``predicate(m)`` true (a monotone predicate), per row.

    Returns 0 when the predicate holds nowhere.
    """
    lo = jnp.zeros(shape, jnp.uint32)
    hi = jnp.full(shape, 0xFFFFFFFF, jnp.uint32)

    def step(_, bounds):
        lo, hi = bounds
        # Round the midpoint up so the interval always shrinks; 32 steps cover uint32.
        gap = hi - lo
        mid = lo + (gap >> 1) + (gap & 1)
        ok = predicate(mid) & (hi > lo)
        return jnp.where(ok, mid, lo), jnp.where(ok | (hi <= lo), hi, mid - 1)

    lo, _ = jax.lax.fori_loop(0, 32, step, (lo, hi))
    return lo


def kth_largest_key(x: jax.Array, k: jax.Array) -> jax.Array:
    """Order key of the k-th largest value of each row: ``[..., n] -> [..., 1]``.

    Args:
      x: ``[..., n]`` float array.
      k: int array broadcastable to ``[..., 1]``, 1 <= k <= n.

    Returns:
      ``[..., 1]`` uint32 keys comparable with :func:`order_key` of ``x``.
    """
    key = order_key(x)
    return _bisect_largest(lambda m: jnp.sum(key >= m, axis=-1, keepdims=True) >= k, (*key.shape[:-1], 1))


def mass_cutoff_key(probs: jax.Array, p: jax.Array) -> jax.Array:
    """Order key of the largest threshold ``t`` with ``sum(probs[probs >= t]) >= p``, per row.

    Args:
      probs: ``[..., n]`` non-negative float32 probabilities.
      p: float array broadcastable to ``[..., 1]``.

    Returns:
      ``[..., 1]`` uint32 keys comparable with :func:`order_key` of ``probs``.
    """
    key = order_key(probs)
    return _bisect_largest(
        lambda m: jnp.sum(jnp.where(key >= m, probs, 0.0), axis=-1, keepdims=True) >= p,
        (*key.shape[:-1], 1),
    )


def top_k_two_stage(x: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
    """``jax.lax.top_k`` over the last axis, computed in two stages for long rows.

    The row is cut into chunks, the ``k`` best of each chunk are kept, and the ``k`` best of
    those candidates are returned. On accelerators this is much faster than one ``top_k``
    over a row of a large vocabulary. The result equals ``jax.lax.top_k(x, k)``: values best
    first, equal values in order of increasing index.

    Args:
      x: ``[..., n]`` array.
      k: static number of entries, ``1 <= k <= n``.

    Returns:
      ``(values [..., k], indices [..., k] int32)``.
    """
    n = x.shape[-1]
    if not 1 <= k <= n:
        raise ValueError(f"top_k_two_stage needs 1 <= k <= n, got k={k} for rows of length n={n}")
    # Chunks of at least k entries; about sqrt(n / k) of them balances the two stages.
    num_chunks = max(1, int((n / k) ** 0.5))
    chunk = -(-n // num_chunks)
    if chunk < k or num_chunks == 1:
        return jax.lax.top_k(x, k)
    lead = x.shape[:-1]
    padded = jnp.pad(
        x.reshape(-1, n), ((0, 0), (0, num_chunks * chunk - n)), constant_values=_lowest(x.dtype)
    ).reshape(-1, num_chunks, chunk)
    values, local = jax.lax.top_k(padded, k)  # [rows, chunks, k]
    offsets = (jnp.arange(num_chunks, dtype=jnp.int32) * chunk)[None, :, None]
    candidates = values.reshape(values.shape[0], -1)
    candidate_index = (local + offsets).reshape(values.shape[0], -1)
    # Candidates are ordered by chunk then rank, so ties still resolve to the lower index.
    best, pick = jax.lax.top_k(candidates, k)
    index = jnp.take_along_axis(candidate_index, pick, axis=-1)
    return best.reshape(*lead, k), index.reshape(*lead, k)


def _lowest(dtype: jnp.dtype) -> jax.Array:
    if jnp.issubdtype(dtype, jnp.floating):
        return jnp.array(-jnp.inf, dtype)
    return jnp.array(jnp.iinfo(dtype).min, dtype)
