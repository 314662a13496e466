"""Router math: which tokens go to which expert slot, and the router's two losses.

Every function works on groups of tokens, ``[groups, tokens, ...]``; routing is
decided within a group, so groups can live on different devices.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


class Routing(NamedTuple):
    """How one MoE layer routes a batch of token groups.

    Attributes:
      dispatch: ``[groups, tokens, experts, capacity]`` 0/1: token ``t`` fills slot ``c`` of expert ``e``.
      combine: same shape: the weight of that slot's output in token ``t``'s result.
      aux_loss: the load-balancing loss (0 for experts-choose routing, balanced by construction).
      z_loss: the router z-loss, mean over tokens of ``logsumexp(logits) ** 2``.
    """

    dispatch: jax.Array
    combine: jax.Array
    aux_loss: jax.Array
    z_loss: jax.Array


def router_z_loss(logits: jax.Array) -> jax.Array:
    """Mean over tokens of ``log(sum(exp(logits)))**2`` (ST-MoE): keeps router logits small."""
    log_z = jax.nn.logsumexp(logits.astype(jnp.float32), axis=-1)
    return jnp.mean(jnp.square(log_z))


def load_balancing_loss(probs: jax.Array, expert_index: jax.Array) -> jax.Array:
    """Switch Transformer's auxiliary loss, ``experts**2 * mean(f * P)``.

    ``f[g, e]`` is the share of group ``g``'s tokens that chose expert ``e`` among their
    top-k (each token counts once per expert) and ``P[g, e]`` the mean router
    probability of ``e``; the loss is 1 when routing is uniform.

    Args:
      probs: ``[groups, tokens, experts]`` router probabilities.
      expert_index: ``[groups, tokens, k]`` the experts each token chose.
    """
    num_experts = probs.shape[-1]
    chose = jnp.max(jax.nn.one_hot(expert_index, num_experts, dtype=jnp.float32), axis=-2)
    share = jnp.mean(chose, axis=-2)
    mean_prob = jnp.mean(probs.astype(jnp.float32), axis=-2)
    return jnp.mean(share * mean_prob) * num_experts**2


def tokens_choose(
    logits: jax.Array,
    num_selected: int,
    capacity: int,
    batch_prioritized: bool = False,
    padding_mask: jax.Array | None = None,
) -> Routing:
    """Each token picks its top ``num_selected`` experts; experts take tokens until full.

    Priority inside an expert's buffer: every token's first choice comes before any
    second choice, and so on; within one choice rank, tokens go in order (or, with
    ``batch_prioritized``, by their top-1 probability, highest first). A choice that
    finds its expert full is dropped. The combine weight of a kept choice is the
    router probability of that expert (not renormalised over the kept choices), so
    ``num_selected=1`` is Switch routing and ``num_selected=2`` GShard's top-2
    without its random second-expert dispatch.

    Args:
      logits: ``[groups, tokens, experts]`` router logits.
      num_selected: experts per token (k).
      capacity: slots per expert per group.
      batch_prioritized: order tokens by router confidence (V-MoE's BPR).
      padding_mask: ``[groups, tokens]``, 1 for real tokens; padding tokens then choose
        no expert (they take no slot) and count as probability 0 in the
        load-balancing loss, as upstream's ``ignore_padding_tokens``.

    Returns:
      The routing.
    """
    logits = _masked_logits(logits, padding_mask)
    probs = jax.nn.softmax(logits, axis=-1)
    groups, tokens, num_experts = probs.shape
    top_probs, expert_index = jax.lax.top_k(probs, num_selected)  # [g, t, k]
    if padding_mask is not None:
        real = padding_mask[..., None] > 0
        expert_index = jnp.where(real, expert_index, -1)  # one_hot(-1) is all zeros: no expert
        top_probs = jnp.where(real, top_probs, 0.0)
        probs = jnp.where(real, probs, 0.0)
    aux = load_balancing_loss(probs, expert_index)
    order = None
    if batch_prioritized:
        order = jnp.argsort(-top_probs[..., 0], axis=-1)
        expert_index = jnp.take_along_axis(expert_index, order[..., None], axis=1)
    # Rank-major order: [g, k, t] flattened, so all first choices queue before second ones.
    ranked = jnp.swapaxes(expert_index, 1, 2).reshape(groups, num_selected * tokens)
    onehot = jax.nn.one_hot(ranked, num_experts, dtype=jnp.int32)  # [g, k*t, e]
    position = jnp.cumsum(onehot, axis=1) * onehot - 1  # slot in the expert's buffer, -1 elsewhere
    position = position.reshape(groups, num_selected, tokens, num_experts)
    position = jnp.max(position, axis=1)  # [g, t, e]: a token picks an expert at most once
    if order is not None:
        inverse = jnp.argsort(order, axis=-1)
        position = jnp.take_along_axis(position, inverse[..., None], axis=1)
    # one_hot of -1 or of a position >= capacity is all zeros: the choice is dropped.
    dispatch = jax.nn.one_hot(position, capacity, dtype=jnp.float32)  # [g, t, e, c]
    combine = probs[..., None] * dispatch
    return Routing(dispatch, combine, aux, router_z_loss(logits))


def experts_choose(logits: jax.Array, capacity: int, padding_mask: jax.Array | None = None) -> Routing:
    """Each expert takes the ``capacity`` tokens of a group it scores highest (Expert Choice).

    A token may be taken by several experts or by none; its combine weight for an
    expert is that expert's router probability. Experts see future tokens' scores
    when they choose, so decoders must not use it (the config refuses it there).

    Args:
      logits: ``[groups, tokens, experts]`` router logits.
      capacity: tokens each expert takes per group (at most ``tokens``).
      padding_mask: ``[groups, tokens]``, 1 for real tokens; a padding token's
        probabilities become 0, so experts take it only when out of real tokens,
        and then with combine weight 0 (upstream's ``ignore_padding_tokens``).

    Returns:
      The routing; ``aux_loss`` is 0.
    """
    logits = _masked_logits(logits, padding_mask)
    probs = jax.nn.softmax(logits, axis=-1)
    if padding_mask is not None:
        probs = jnp.where(padding_mask[..., None] > 0, probs, 0.0)
    tokens = probs.shape[1]
    gate, token_index = jax.lax.top_k(jnp.swapaxes(probs, 1, 2), capacity)  # [g, e, c]
    dispatch = jax.nn.one_hot(token_index, tokens, dtype=jnp.float32)  # [g, e, c, t]
    dispatch = jnp.moveaxis(dispatch, 3, 1)  # [g, t, e, c]
    combine = gate[:, None, :, :] * dispatch
    return Routing(dispatch, combine, jnp.zeros((), jnp.float32), router_z_loss(logits))


def _masked_logits(logits: jax.Array, padding_mask: jax.Array | None) -> jax.Array:
    """Float32 logits, 0 for padding tokens (so their z-loss term is the constant ``log(experts)**2``)."""
    logits = logits.astype(jnp.float32)
    if padding_mask is None:
        return logits
    return logits * padding_mask[..., None].astype(jnp.float32)


def expert_capacity(tokens_per_group: int, num_experts: int, capacity_factor: float, minimum: int) -> int:
    """Slots per expert per group: ``round(factor * tokens / experts)``, at least ``minimum``.

    Raises:
      ValueError: when that leaves no slot at all (no token could be routed).
    """
    capacity = max(round(capacity_factor * tokens_per_group / num_experts), int(minimum))
    if capacity < 1:
        raise ValueError(
            f"expert capacity is 0 for {tokens_per_group} tokens per group over {num_experts} experts "
            f"with capacity factor {capacity_factor} and min_expert_capacity {minimum}: no token could be "
            "routed; raise the capacity factor or min_expert_capacity"
        )
    return capacity


def tokens_per_group(length: int, group_size: int) -> int:
    """The largest divisor of a sequence ``length`` that is at most ``group_size``.

    Groups are slices of one sequence, so the number of groups is a multiple of the
    batch size: groups shard exactly like the batch on any mesh, and the routing of
    an example never depends on how many devices there are.
    """
    size = min(length, group_size)
    while length % size:
        size -= 1
    return size
