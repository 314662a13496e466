"""Helpers that lay out a batch, and its cache, with several decodes per example."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from t5x.decoding._select import top_k
from t5x.decoding._state import PyTree

# Cache leaves that hold one value for the whole batch rather than one row per example:
# flax's scalar write position, cached relative-position biases and the scalar index of an
# absolute position embedder. Expanding or gathering them along a beam axis would be wrong.
_SHARED_LEAF_NAMES = frozenset({"cached_bias", "position_embedder_index"})
_INDEX_LEAF_NAME = "cache_index"


def brevity_penalty(alpha: float, length: Any) -> jax.Array:
    """The GNMT length normaliser ``((5 + length) / 6) ** alpha``.

    Beam-search scores are ``log_prob / brevity_penalty(alpha, length)``.

    Args:
      alpha: the exponent; 0 switches the penalty off.
      length: a length (scalar or array), counting every token up to and including EOS.

    Returns:
      The penalty, float32, with the shape of ``length``.
    """
    return jnp.power((5.0 + jnp.asarray(length, jnp.float32)) / 6.0, alpha)


def leaf_name(path: tuple[Any, ...]) -> Any:
    """The dict key or attribute name of a leaf from its pytree path (None if it has none)."""
    if not path:
        return None
    key = path[-1]
    for attr in ("key", "name"):
        if hasattr(key, attr):
            return getattr(key, attr)
    return None


def cache_leaf_kind(path: tuple[Any, ...], leaf: Any) -> str:
    """``"index"`` (a ``cache_index``), ``"shared"`` (one value for the batch) or ``"per_example"``."""
    name = leaf_name(path)
    if name == _INDEX_LEAF_NAME:
        return "index"
    if np.ndim(leaf) == 0 or name in _SHARED_LEAF_NAMES:
        return "shared"
    return "per_example"


def cache_map(fn: Callable[[jax.Array], jax.Array], cache: PyTree, apply_to_index: bool = False) -> PyTree:
    """Applies ``fn`` to every per-example leaf of a cache pytree.

    Leaves named ``cached_bias`` or ``position_embedder_index`` and other 0-d leaves are
    shared by the whole batch and left untouched; leaves named ``cache_index`` (0-d ones
    included, as in upstream t5x) are mapped only when ``apply_to_index`` is true (a
    pre-filled cache keeps one write position per example).
    The container types (dicts, flax ``FrozenDict``, dataclasses, ...) are kept.

    Args:
      fn: function applied to each selected leaf.
      cache: the cache pytree.
      apply_to_index: whether ``cache_index`` leaves are mapped too.

    Returns:
      A pytree of the same structure.
    """

    def visit(path: tuple[Any, ...], leaf: Any) -> Any:
        kind = cache_leaf_kind(path, leaf)
        if kind == "index":
            return fn(leaf) if apply_to_index else leaf
        return fn(leaf) if kind == "per_example" else leaf

    return jax.tree_util.tree_map_with_path(visit, cache)


def keep_scalars(fn: Callable[[jax.Array], jax.Array]) -> Callable[[jax.Array], jax.Array]:
    """Wraps a per-example ``fn`` so 0-d leaves (a shared scalar ``cache_index``) pass through.

    The decoders expand a cache with ``apply_to_index=True`` after a per-example prefill; a
    scalar write position there is shared by all rows and must not be repeated.
    """

    def apply(leaf: jax.Array) -> jax.Array:
        return leaf if np.ndim(leaf) == 0 else fn(leaf)

    return apply


def add_beam_dim(x: jax.Array, beam_size: int, offset: int = 0) -> jax.Array:
    """Inserts a beam axis after the batch axis and repeats each example into it.

    Args:
      x: array with its batch axis at ``offset``: ``[..., batch, ...]``.
      beam_size: the number of copies.
      offset: position of the batch axis (1 for caches of scanned layers).

    Returns:
      ``[..., batch, beam_size, ...]``.
    """
    x = jnp.expand_dims(x, offset + 1)
    shape = list(x.shape)
    shape[offset + 1] = beam_size
    return jnp.broadcast_to(x, shape)


def flatten_beam_dim(x: jax.Array, offset: int = 0) -> jax.Array:
    """Merges the batch axis at ``offset`` and the beam axis after it.

    Args:
      x: ``[..., batch, beam, ...]``.
      offset: position of the batch axis.

    Returns:
      ``[..., batch * beam, ...]``, the beams of one example adjacent.
    """
    shape = x.shape
    return x.reshape((*shape[:offset], shape[offset] * shape[offset + 1], *shape[offset + 2 :]))


def unflatten_beam_dim(x: jax.Array, batch_size: int, beam_size: int, offset: int = 0) -> jax.Array:
    """Splits a flat ``batch * beam`` axis at ``offset`` into ``batch, beam``.

    Args:
      x: ``[..., batch * beam, ...]``.
      batch_size: the batch size.
      beam_size: the beam size.
      offset: position of the flat axis.

    Returns:
      ``[..., batch, beam, ...]``.

    Raises:
      ValueError: if the axis is not ``batch_size * beam_size`` long.
    """
    shape = x.shape
    if shape[offset] != batch_size * beam_size:
        raise ValueError(
            f"unflatten_beam_dim: axis {offset} of shape {shape} should be batch_size * beam_size"
            f" = {batch_size} * {beam_size} = {batch_size * beam_size}"
        )
    return x.reshape((*shape[:offset], batch_size, beam_size, *shape[offset + 1 :]))


def flat_batch_beam_expand(x: jax.Array, beam_size: int, offset: int = 0) -> jax.Array:
    """Repeats every example ``beam_size`` times in place: ``[b, ...] -> [b * beam_size, ...]``.

    Row ``i * beam_size + j`` is copy ``j`` of example ``i`` (same as ``jnp.repeat``).

    Args:
      x: array with the batch axis at ``offset``.
      beam_size: copies per example.
      offset: position of the batch axis.

    Returns:
      The expanded array.
    """
    return flatten_beam_dim(add_beam_dim(x, beam_size, offset), offset)


def _gather_fn(
    beam_indices: jax.Array, old_beam_size: int, one_hot: bool, offset: int
) -> Callable[[jax.Array], jax.Array]:
    if offset not in (0, 1):
        raise ValueError(f"beam gathers support a batch axis at offset 0 or 1, got offset={offset}")
    batch, new_beam = beam_indices.shape
    if one_hot:
        # A one-hot contraction is elementwise work plus a sum over the old beam axis, so a
        # cache sharded along the batch (or any later) axis stays sharded without collectives.
        def gather(x: jax.Array) -> jax.Array:
            work_dtype = jnp.int32 if x.dtype == jnp.bool_ else x.dtype
            selector = jax.nn.one_hot(beam_indices, old_beam_size, dtype=work_dtype)
            spec = "beo,bo...->be..." if offset == 0 else "beo,lbo...->lbe..."
            out = jnp.einsum(spec, selector, x.astype(work_dtype), precision=jax.lax.Precision.HIGHEST)
            return out.astype(x.dtype)

        return gather

    rows = jnp.broadcast_to(jnp.arange(batch)[:, None], (batch, new_beam))

    def gather_direct(x: jax.Array) -> jax.Array:
        return x[rows, beam_indices] if offset == 0 else x[:, rows, beam_indices]

    return gather_direct


def select_beams(x: jax.Array, beam_indices: jax.Array, offset: int = 0) -> jax.Array:
    """``out[b, j] = x[b, beam_indices[b, j]]`` for one ``[batch, old_beam, ...]`` array, by selects.

    A chain of elementwise selects over the old beams: exact for any values (a one-hot sum
    turns inf into NaN), it keeps a batch-sharded array sharded without collectives and,
    unlike a one-hot contraction, reads each old beam once per output.

    Args:
      x: ``[batch, old_beam, ...]`` (``[layers, batch, old_beam, ...]`` when ``offset`` is 1).
      beam_indices: ``[batch, new_beam]`` int indices into the old beam axis.
      offset: position of the batch axis (0 or 1).

    Returns:
      ``[batch, new_beam, ...]`` (``[layers, batch, new_beam, ...]``).
    """
    if offset not in (0, 1):
        raise ValueError(f"beam gathers support a batch axis at offset 0 or 1, got offset={offset}")
    old_beam = x.shape[offset + 1]
    shape = (1,) * offset + beam_indices.shape + (1,) * (x.ndim - offset - 2)
    which = beam_indices.reshape(shape)
    out_shape = (*x.shape[: offset + 1], beam_indices.shape[1], *x.shape[offset + 2 :])
    out = jnp.broadcast_to(jax.lax.slice_in_dim(x, 0, 1, axis=offset + 1), out_shape)
    for beam in range(1, old_beam):
        out = jnp.where(which == beam, jax.lax.slice_in_dim(x, beam, beam + 1, axis=offset + 1), out)
    return out


def gather_beams(
    nested: PyTree,
    beam_indices: jax.Array,
    batch_size: int,
    old_beam_size: int,
    new_beam_size: int,
    one_hot: bool = True,
) -> PyTree:
    """Picks beams: ``out[b, j] = x[b, beam_indices[b, j]]`` for every array leaf.

    Args:
      nested: pytree of ``[batch, old_beam_size, ...]`` arrays (0-d leaves are kept as is).
      beam_indices: ``[batch, new_beam_size]`` int indices into the old beam axis.
      batch_size: the batch size.
      old_beam_size: length of the old beam axis.
      new_beam_size: length of the new beam axis.
      one_hot: gather by a one-hot contraction (keeps sharded arrays sharded; needs finite
        values) or by indexing.

    Returns:
      The pytree with ``[batch, new_beam_size, ...]`` leaves.

    Raises:
      ValueError: if ``beam_indices`` is not ``[batch_size, new_beam_size]``.
    """
    if tuple(beam_indices.shape) != (batch_size, new_beam_size):
        raise ValueError(
            f"gather_beams: beam_indices shape {tuple(beam_indices.shape)} should be"
            f" (batch_size, new_beam_size) = {(batch_size, new_beam_size)}"
        )
    gather = _gather_fn(beam_indices, old_beam_size, one_hot, 0)
    return jax.tree_util.tree_map(lambda x: x if np.ndim(x) == 0 else gather(x), nested)


def cache_gather_beams(
    nested: PyTree,
    beam_indices: jax.Array,
    batch_size: int,
    old_beam_size: int,
    new_beam_size: int,
    one_hot: bool = True,
    offset: int = 0,
) -> PyTree:
    """Like :func:`gather_beams` for a cache: shared leaves (see :func:`cache_map`) are kept.

    Args:
      nested: cache pytree of ``[batch, old_beam_size, ...]`` leaves (``[layers, batch,
        old_beam_size, ...]`` when ``offset`` is 1).
      beam_indices: ``[batch, new_beam_size]`` int indices into the old beam axis.
      batch_size: the batch size.
      old_beam_size: length of the old beam axis.
      new_beam_size: length of the new beam axis.
      one_hot: gather by one-hot contraction or by indexing.
      offset: position of the batch axis in the cache leaves (0 or 1).

    Returns:
      The cache with ``new_beam_size`` beams.

    Raises:
      ValueError: for a bad ``beam_indices`` shape or an offset other than 0 or 1.
    """
    if tuple(beam_indices.shape) != (batch_size, new_beam_size):
        raise ValueError(
            f"cache_gather_beams: beam_indices shape {tuple(beam_indices.shape)} should be"
            f" (batch_size, new_beam_size) = {(batch_size, new_beam_size)}"
        )
    return cache_map(_gather_fn(beam_indices, old_beam_size, one_hot, offset), nested)


def gather_topk_beams(
    nested: PyTree, score_or_log_prob: jax.Array, batch_size: int, new_beam_size: int
) -> PyTree:
    """Keeps the ``new_beam_size`` best beams, ordered from worst to best.

    Args:
      nested: pytree of ``[batch, old_beam_size, ...]`` arrays.
      score_or_log_prob: ``[batch, old_beam_size]`` values to rank by.
      batch_size: the batch size.
      new_beam_size: how many beams to keep.

    Returns:
      The pytree with ``[batch, new_beam_size, ...]`` leaves, best beam last.
    """
    _, best = top_k(score_or_log_prob, new_beam_size)
    return gather_beams(nested, best[:, ::-1], batch_size, score_or_log_prob.shape[1], new_beam_size)
