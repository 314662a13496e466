"""Reordering a beam-search cache by parent beam, copying only where beams can differ.

Every row of an example starts as a copy of that example's cache, so two beams of one
example can only differ at positions some step has written. For attention caches in the
t5x layout (``cached_key`` / ``cached_value`` leaves ``[..., rows, heads, head_dim, length]``
beside a ``cache_index``) a step writes position ``cache_index`` (or ``cur_index``) of each
row, so only the span between the first index the loop started from and the last one written
needs reordering; the rest (a long prefilled prompt, the unwritten tail) is the same in every
beam of an example and is left in place. A table of who wrote each position of each row
narrows the span further: beams soon descend from one ancestor, and below the first position
where their writers differ they hold the same keys and values. Short caches (at most
``WHOLE_MAX_LENGTH`` positions) and other leaves are gathered whole."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from t5x.decoding._beams import cache_leaf_kind, leaf_name
from t5x.decoding._state import PyTree

_POSITION_LEAF_NAMES = frozenset({"cached_key", "cached_value"})
# Positions reordered per inner-loop iteration. In the length-last layout a chunk is one
# short run per (row, head, feature). Beams soon share an ancestor, so spans are a few
# positions; on XLA:CPU (DEC-S, 4 beams) 16 beat 8 and 64, and 4 was twice as slow overall.
CHUNK = 16
# Caches of at most this many positions are gathered whole: a gather copies each row's run
# of keys at memory speed, where the chunks' element-wise moves are several times slower per
# byte. ENCDEC-S (64 positions, 4 beams, batch 8): a call 3.07 -> 2.82 s; DEC-S (319
# positions) keeps the span, which a whole gather would take from 6.1 to 8.6 s.
WHOLE_MAX_LENGTH = 64


def index_bounds(cache: PyTree) -> tuple[jax.Array, jax.Array] | None:
    """``(min, max)`` over every ``cache_index`` leaf of ``cache``, or None without one."""
    found = [
        jnp.asarray(leaf, jnp.int32)
        for path, leaf in jax.tree_util.tree_flatten_with_path(cache)[0]
        if cache_leaf_kind(path, leaf) == "index" and np.size(leaf) > 0
    ]
    if not found:
        return None
    return (
        jnp.min(jnp.stack([jnp.min(x) for x in found])),
        jnp.max(jnp.stack([jnp.max(x) for x in found])),
    )


def index_matches(cache: PyTree, flat_index: jax.Array, active_rows: jax.Array) -> jax.Array:
    """Whether every ``cache_index`` leaf of ``cache`` equals ``flat_index`` on the active rows.

    Scalar leaves (and one per scanned layer) must equal the index of every active row.
    """
    rows = flat_index.shape[0]
    ok = jnp.bool_(True)
    for path, leaf in jax.tree_util.tree_flatten_with_path(cache)[0]:
        if cache_leaf_kind(path, leaf) != "index":
            continue
        leaf = jnp.asarray(leaf)
        per_row = leaf if leaf.ndim and leaf.shape[-1] == rows else leaf[..., None]
        ok &= jnp.all((per_row == flat_index) | ~active_rows)
    return ok


def tag_writes(writers: jax.Array, flat_index: jax.Array) -> jax.Array:
    """``writers [rows, width]`` with a new writer id at each row's ``flat_index``.

    Ids are unique per (position, row) and 0 means "as the loop found it", so two rows of an
    example with the same id at a position hold the same content there.
    """
    rows, width = writers.shape
    position = jnp.minimum(flat_index, width - 1)
    new_id = position * rows + jnp.arange(rows, dtype=position.dtype) + 1
    at = jnp.arange(width, dtype=position.dtype)[None, :] == position[:, None]
    return jnp.where(at, new_id[:, None], writers)


def first_divergence(writers: jax.Array, batch: int, beams: int, active: jax.Array) -> jax.Array:
    """The first position where the beams of some active example have different writers.

    Returns ``width`` when all agree everywhere.
    """
    writers = writers.reshape(batch, beams, -1)
    width = writers.shape[-1]
    differs = jnp.any(writers != writers[:, :1], axis=1) & active[:, None]
    return jnp.min(jnp.where(differs, jnp.arange(width, dtype=jnp.int32)[None, :], width))


def _is_position_leaf(path: tuple[Any, ...], leaf: Any, offset: int) -> bool:
    return leaf_name(path) in _POSITION_LEAF_NAMES and np.ndim(leaf) == 4 + offset


def reorder_cache(
    cache: PyTree,
    pick: Callable[[jax.Array], jax.Array],
    span: tuple[jax.Array, jax.Array] | None,
    offset: int,
) -> PyTree:
    """Applies the row reorder ``pick`` to every per-example leaf of ``cache``.

    Args:
      cache: the cache after a step, rows at axis ``offset``.
      pick: maps a leaf (or a slice of one along its last axis) to its rows reordered.
      span: ``(lo, hi)``: beams of one example may differ only at positions ``[lo, hi)``
        of the attention caches (None: gather every leaf whole).
      offset: position of the row axis.

    Returns:
      The reordered cache, with the structure of ``cache``.
    """
    flat, treedef = jax.tree_util.tree_flatten_with_path(cache)
    out = [leaf if cache_leaf_kind(path, leaf) != "per_example" else None for path, leaf in flat]
    windowed: dict[int, list[int]] = {}  # cache length -> leaf positions
    for i, (path, leaf) in enumerate(flat):
        if out[i] is None:
            if (
                span is not None
                and _is_position_leaf(path, leaf, offset)
                and leaf.shape[-1] > WHOLE_MAX_LENGTH
            ):
                windowed.setdefault(leaf.shape[-1], []).append(i)
            else:
                out[i] = pick(leaf)
    if span is not None:
        for length, members in windowed.items():
            done = _reorder_span([flat[i][1] for i in members], pick, span, length)
            for i, leaf in zip(members, done):
                out[i] = leaf
    return jax.tree_util.tree_unflatten(treedef, out)


def _reorder_span(
    leaves: list[jax.Array],
    pick: Callable[[jax.Array], jax.Array],
    span: tuple[jax.Array, jax.Array],
    length: int,
) -> list[jax.Array]:
    """Reorders positions ``[lo, hi)`` of leaves of cache length ``length``, in chunks, in place."""
    chunk = min(CHUNK, length)
    lo = jnp.clip(span[0], 0, length)
    hi = jnp.clip(span[1], 0, length)
    count = (jnp.maximum(hi - lo, 0) + chunk - 1) // chunk

    def one_chunk(k: jax.Array, leaves: tuple[jax.Array, ...]) -> tuple[jax.Array, ...]:
        first = lo + k * chunk
        # The last chunk is pulled back inside the cache; what it then overlaps was already
        # reordered by the chunk before and must not be reordered twice.
        start = jnp.minimum(first, length - chunk)
        fresh = (start + jnp.arange(chunk)) >= first
        moved = []
        for x in leaves:
            piece = jax.lax.dynamic_slice_in_dim(x, start, chunk, axis=-1)
            piece = jnp.where(fresh, pick(piece), piece)
            moved.append(jax.lax.dynamic_update_slice_in_dim(x, piece, start, axis=-1))
        return tuple(moved)

    return list(jax.lax.fori_loop(0, count, one_chunk, tuple(leaves)))
