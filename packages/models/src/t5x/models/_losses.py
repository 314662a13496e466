"""Cross-entropy with z-loss and label smoothing, loss normalisation, and metrics."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


class SpecialLossNormalizingFactor(enum.Enum):
    """Loss normalisations computed from the batch (upstream's names).

    ``NUM_REAL_TARGET_TOKENS`` divides by the number of weighted target tokens,
    ``NUM_TOTAL_TARGET_TOKENS`` by ``batch * length``, and
    ``AVERAGE_PER_SEQUENCE`` gives every (packed) sequence equal weight and
    divides by the number of sequences.
    """

    NUM_REAL_TARGET_TOKENS = 1
    NUM_TOTAL_TARGET_TOKENS = 2
    AVERAGE_PER_SEQUENCE = 3


def cross_entropy_with_logits(
    logits: jax.Array, targets: jax.Array, z_loss: float
) -> tuple[jax.Array, jax.Array]:
    """Cross entropy against soft targets plus ``z_loss * log(Z)**2``.

    Args:
      logits: ``[..., vocab]``.
      targets: ``[..., vocab]`` target distributions.
      z_loss: coefficient of the squared log-partition penalty.

    Returns:
      ``(loss, z_loss_term)``, each ``[...]``; ``loss`` includes the z term.
    """
    log_z = jax.nn.logsumexp(logits, axis=-1, keepdims=True)
    loss = -jnp.sum(targets * (logits - log_z), axis=-1)
    z_term = z_loss * jnp.square(jnp.squeeze(log_z, -1))
    return loss + z_term, z_term


def token_cross_entropy(
    logits: jax.Array, targets: jax.Array, label_smoothing: float = 0.0, z_loss: float = 0.0
) -> tuple[jax.Array, jax.Array]:
    """Per-position cross entropy against integer targets, smoothed, plus the z-loss term.

    Equals :func:`cross_entropy_with_logits` against the smoothed one-hot
    targets, but never builds them: with ``low = label_smoothing / (vocab - 1)``
    on every class and ``1 - label_smoothing`` on the target, the loss is
    ``log Z - (1 - label_smoothing - low) * logit[target] - low * sum(logits)``.
    That saves the ``[..., vocab]`` target array and the passes over it, forward
    and backward.

    Args:
      logits: ``[..., vocab]``.
      targets: ``[...]`` integer ids.
      label_smoothing: in ``[0, 1)``.
      z_loss: coefficient of ``log(Z)**2``.

    Returns:
      ``(loss, z_loss_term)``, each ``[...]`` float32; ``loss`` includes the z
      term and not the smoothing's entropy constant.
    """
    logits = logits.astype(jnp.float32)
    log_z = jax.nn.logsumexp(logits, axis=-1)
    low = label_smoothing / (logits.shape[-1] - 1)
    target_logit = jnp.take_along_axis(logits, targets[..., None].astype(jnp.int32), -1, mode="clip")[..., 0]
    loss = log_z - (1.0 - label_smoothing - low) * target_logit
    if low:
        loss = loss - low * jnp.sum(logits, axis=-1)
    z_term = z_loss * jnp.square(log_z) if z_loss else jnp.zeros_like(log_z)
    return loss + z_term, z_term


def compute_weighted_cross_entropy(
    logits: jax.Array,
    targets: jax.Array,
    weights: jax.Array | None = None,
    label_smoothing: float = 0.0,
    z_loss: float = 0.0,
    loss_normalizing_factor: float | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Summed, weighted, optionally smoothed cross entropy.

    Label smoothing spreads ``label_smoothing`` over the other ``vocab - 1``
    classes and subtracts the entropy of that target distribution, so a perfect
    prediction scores 0.

    Args:
      logits: ``[batch, length, vocab]``.
      targets: ``[batch, length]`` ids.
      weights: ``[batch, length]`` or None (every position counts).
      label_smoothing: in ``[0, 1)``.
      z_loss: z-loss coefficient.
      loss_normalizing_factor: divides the summed losses when given.

    Returns:
      ``(loss, z_loss, weight_sum)`` scalars.

    Raises:
      ValueError: when ``logits`` and ``targets`` shapes disagree.
    """
    if logits.ndim != targets.ndim + 1 or logits.shape[:-1] != targets.shape:
        raise ValueError(f"logits {logits.shape} must be targets {targets.shape} + [vocab]")
    loss, z_term = token_cross_entropy(logits, targets, label_smoothing, z_loss)
    loss = loss - smoothing_constant(label_smoothing, logits.shape[-1])
    weight_sum: jax.Array = jnp.asarray(np.prod(targets.shape), jnp.float32)
    if weights is not None:
        loss, z_term = loss * weights, z_term * weights
        weight_sum = jnp.sum(weights)
    if loss_normalizing_factor is not None:
        loss, z_term = loss / loss_normalizing_factor, z_term / loss_normalizing_factor
    return jnp.sum(loss), jnp.sum(z_term), weight_sum


def smoothing_constant(label_smoothing: float, vocab: int) -> float:
    """Entropy of the smoothed one-hot target: a perfect prediction's loss, subtracted so it scores 0."""
    confidence = 1.0 - label_smoothing
    low = (1.0 - confidence) / (vocab - 1)
    return float(-(confidence * np.log(confidence) + (1.0 - confidence) * np.log(low + 1e-20)))


def _weights_per_segment(segment_ids: jax.Array, weights: jax.Array) -> jax.Array:
    """For each position, the summed weight of its packed sequence: ``[batch, length]``.

    Segment 0 is padding, not a sequence: its sum is 0, so that its positions
    get weight 0 and it is not counted among the sequences (as upstream).
    """
    same = (segment_ids[:, :, None] == segment_ids[:, None, :]) & (segment_ids[:, :, None] != 0)
    return jnp.sum(jnp.where(same, weights[:, None, :], 0.0), axis=-1)


def get_loss_normalizing_factor_and_weights(
    loss_normalizing_factor: Any, batch: Mapping[str, Any]
) -> tuple[Any, jax.Array | None]:
    """Resolves a normalising factor (None, a number or a special one) and the loss weights.

    Returns:
      ``(factor or None, weights [batch, length] or None)``.

    Raises:
      ValueError: for an unknown special factor name.
    """
    weights = batch.get("decoder_loss_weights")
    if isinstance(loss_normalizing_factor, str):
        try:
            loss_normalizing_factor = SpecialLossNormalizingFactor[loss_normalizing_factor.upper()]
        except KeyError as err:
            names = [f.name for f in SpecialLossNormalizingFactor]
            raise ValueError(
                f"loss_normalizing_factor {loss_normalizing_factor!r} is not one of {names} or a number"
            ) from err
    if not isinstance(loss_normalizing_factor, SpecialLossNormalizingFactor):
        return loss_normalizing_factor, weights
    targets = batch["decoder_target_tokens"]
    if weights is None:
        weights = jnp.asarray(targets > 0, jnp.float32)
    weights = jnp.asarray(weights, jnp.float32)
    if loss_normalizing_factor is SpecialLossNormalizingFactor.NUM_REAL_TARGET_TOKENS:
        return jnp.sum(weights), weights
    if loss_normalizing_factor is SpecialLossNormalizingFactor.NUM_TOTAL_TARGET_TOKENS:
        return float(np.prod(targets.shape)), weights
    if "decoder_segment_ids" in batch:
        per_seq = _weights_per_segment(batch["decoder_segment_ids"], weights)
    else:
        per_seq = jnp.sum(weights, axis=-1, keepdims=True)
    weights = jnp.nan_to_num(weights / per_seq, nan=0.0, posinf=0.0, neginf=0.0)
    return jnp.sum(weights), weights


def compute_metrics(
    logits: jax.Array, targets: jax.Array, weights: jax.Array | None, loss: jax.Array, z_loss: jax.Array
) -> dict[str, jax.Array]:
    """Scalar metrics of one batch (upstream's names).

    Args:
      logits: ``[batch, length, vocab]``.
      targets: ``[batch, length]``.
      weights: ``[batch, length]`` or None.
      loss: the (normalised) loss.
      z_loss: the (normalised) z-loss part of it.

    Returns:
      A dict of scalars.
    """
    if weights is None:
        weights = jnp.ones(targets.shape, jnp.float32)
    weights = jnp.asarray(weights, jnp.float32)
    correct = jnp.asarray(jnp.argmax(logits, axis=-1) == targets, jnp.float32)
    return metrics_from_sums(jnp.sum(correct * weights), targets, weights, loss, z_loss)


def metrics_from_sums(
    correct: jax.Array, targets: jax.Array, weights: jax.Array, loss: jax.Array, z_loss: jax.Array
) -> dict[str, jax.Array]:
    """``compute_metrics`` from the weighted count of correct predictions instead of the logits."""
    num_tokens = jnp.asarray(np.prod(targets.shape), jnp.float32)
    nonpadding = jnp.sum(jnp.asarray(weights, jnp.float32))
    safe = jnp.maximum(nonpadding, 1e-8)
    return {
        "accuracy": correct / safe,
        "loss": loss,
        "loss_per_nonpadding_target_token": loss / safe,
        "loss_per_all_target_tokens": loss / num_tokens,
        "z_loss": z_loss,
        "z_loss_per_all_target_tokens": z_loss / num_tokens,
        "cross_ent_loss": loss - z_loss,
        "cross_ent_loss_per_all_target_tokens": (loss - z_loss) / num_tokens,
        "nonpadding_fraction": nonpadding / num_tokens,
        "num_target_tokens": nonpadding,
    }
