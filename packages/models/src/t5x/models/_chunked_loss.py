"""Cross entropy from the decoder's last hidden states, a slice of positions at a time.

A training step that builds the whole ``[batch, length, vocab]`` logits holds them and
their gradient at once: 2 x 502 MiB for 8 x 512 tokens of a 32k vocabulary, the
largest buffers of a small model's step. Here the output projection, the loss and
the loss's gradient run over one slice of positions at a time, and the forward pass
keeps only what the backward pass needs: the gradients with respect to the hidden
states and the projection's parameters, which it scales by the incoming cotangent.
The products and their FLOPs are the same; one slice's logits are alive at a time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from t5x.models._losses import smoothing_constant, token_cross_entropy

# A slice's float32 logits stay under this; its gradient and softmax take as much again.
SLICE_BYTES = 64 << 20


def _split(x: jax.Array, count: int) -> jax.Array:
    """``[batch, count * size, ...]`` -> ``[count, batch, size, ...]``."""
    batch, length = x.shape[:2]
    return jnp.moveaxis(x.reshape(batch, count, length // count, *x.shape[2:]), 1, 0)


def _merge(x: jax.Array) -> jax.Array:
    """Inverse of ``_split``."""
    count, batch, size = x.shape[:3]
    return jnp.moveaxis(x, 0, 1).reshape(batch, count * size, *x.shape[3:])


def _pad_length(x: jax.Array, extra: int) -> jax.Array:
    return jnp.pad(x, [(0, 0), (0, extra)] + [(0, 0)] * (x.ndim - 2)) if extra else x


def chunked_cross_entropy(
    project: Callable[[Any, jax.Array], jax.Array],
    head_params: Any,
    hidden: jax.Array,
    targets: jax.Array,
    loss_weights: jax.Array,
    metric_weights: jax.Array,
    *,
    label_smoothing: float = 0.0,
    z_loss: float = 0.0,
    slice_bytes: int | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Weighted cross entropy of ``project(head_params, hidden)`` without the whole logits.

    Equals ``compute_weighted_cross_entropy`` on the full logits with weights
    ``loss_weights`` (a normalising factor already divided in), up to the order of
    the float sums. Gradients flow to ``head_params`` and ``hidden`` through the
    loss only; the z-loss and the count of correct predictions are metrics.

    Args:
      project: ``(head_params, hidden [batch, size, embed]) -> logits [batch, size, vocab]``.
      head_params: the projection's parameters.
      hidden: ``[batch, length, embed]``.
      targets: ``[batch, length]`` ids.
      loss_weights: ``[batch, length]`` weights of each position's loss.
      metric_weights: ``[batch, length]`` weights of each position's correct prediction.
      label_smoothing: in ``[0, 1)``.
      z_loss: coefficient of ``log(Z)**2``.
      slice_bytes: the float32 logits of one slice stay under this (None: ``SLICE_BYTES``).

    Returns:
      ``(loss, z_loss, correct)`` scalars: the weighted loss and z-loss sums, and the
      ``metric_weights``-weighted count of positions whose argmax is the target.
    """
    batch, length = targets.shape
    vocab = jax.eval_shape(project, head_params, hidden[:, :1]).shape[-1]
    count = max(1, min(length, -(-batch * length * vocab * 4 // (slice_bytes or SLICE_BYTES))))
    size = -(-length // count)
    count = -(-length // size)
    extra = count * size - length
    constant = smoothing_constant(label_smoothing, vocab)

    def sliced(x: jax.Array) -> jax.Array:
        return _split(_pad_length(x, extra), count)

    # Padded positions weigh 0 in both sums, so they add nothing and get no gradient.
    features = [sliced(x) for x in (targets, loss_weights, metric_weights)]

    def slice_loss(params: Any, h: jax.Array, t: jax.Array, w: jax.Array, m: jax.Array) -> Any:
        logits = project(params, h).astype(jnp.float32)
        loss, z_term = token_cross_entropy(logits, t, label_smoothing, z_loss)
        correct = jnp.sum(jnp.where(jnp.argmax(logits, axis=-1) == t, m, 0.0))
        return jnp.sum((loss - constant) * w), (jnp.sum(z_term * w), correct)

    def zeros() -> tuple:  # made inside each rule: the rules must not close over traced values
        return (jnp.zeros((), jnp.float32),) * 3

    def add(a: tuple, b: tuple) -> tuple:
        return tuple(x + y for x, y in zip(a, b, strict=True))

    @jax.custom_vjp
    def sums(params: Any, h: jax.Array, *features: jax.Array) -> tuple:
        def body(total: tuple, xs: tuple) -> tuple:
            loss, (z_term, correct) = slice_loss(params, *xs)
            return add(total, (loss, z_term, correct)), None

        return jax.lax.scan(body, zeros(), (sliced(h), *features))[0]

    # The forward rule makes each slice's gradients while its logits exist; the backward
    # rule only scales them by the loss's cotangent.
    def sums_and_gradients(params: Any, h: jax.Array, *features: jax.Array) -> tuple:
        def body(carry: tuple, xs: tuple) -> tuple:
            total, d_params = carry
            h_slice, *rest = xs
            loss, vjp, (z_term, correct) = jax.vjp(
                lambda p, h: slice_loss(p, h, *rest), params, h_slice, has_aux=True
            )
            dp, dh = vjp(jnp.ones_like(loss))
            d_params = jax.tree_util.tree_map(jnp.add, d_params, dp)
            return (add(total, (loss, z_term, correct)), d_params), dh

        start = (zeros(), jax.tree_util.tree_map(jnp.zeros_like, params))
        dh: jax.Array
        (total, d_params), dh = jax.lax.scan(body, start, (sliced(h), *features))
        return total, (d_params, _merge(dh)[:, :length])

    def scale(residuals: tuple, cotangents: tuple) -> tuple:
        d_params, dh = residuals
        g = cotangents[0]
        d_params = jax.tree_util.tree_map(lambda d: (g * d).astype(d.dtype), d_params)
        return (d_params, (g * dh).astype(dh.dtype), *[None] * len(features))

    sums.defvjp(sums_and_gradients, scale)
    return sums(head_params, hidden, *features)
