"""The MoE feed-forward block: a router and a stack of expert MLPs, flaxformer's parameter names.

Parameters of one block (under the layer's ``mlp``)::

    router/router_weights/w/kernel   [embed, experts]         axes (embed, unmodeled)
    expert/wi/kernel (or wi_0, wi_1) [experts, embed, mlp]    axes (expert, embed, mlp)
    expert/wo/kernel                 [experts, mlp, embed]    axes (expert, mlp, embed)
"""

from __future__ import annotations

import functools
import math
import operator
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax.linen import partitioning as nn_partitioning

from t5x.moe import _routing
from t5x.partitioning import with_sharding_constraint

# Logical names of the dispatched activations. 'expert' goes to the expert mesh axis and
# 'expert_group' to the data axis, while 'batch' spans both: moving a tensor from
# ('batch', 'unmodeled', ...) to ('expert', 'expert_group', ...) is an all-to-all.
_GROUPED = ("batch", "unmodeled", None, "embed")
_PER_EXPERT = ("expert", "expert_group", None, "embed")
_PER_EXPERT_HIDDEN = ("expert", "expert_group", None, "mlp")


def _activation(name: str) -> Any:
    return (lambda x: x) if name == "linear" else getattr(nn, name)


def _expert_axis_size() -> int:
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or "expert" not in mesh.axis_names:
        return 1
    return int(dict(zip(mesh.axis_names, mesh.axis_sizes, strict=True))["expert"])


class Kernel(nn.Module):
    """One named weight, ``<name>/kernel``, with logical axes."""

    shape: tuple[int, ...]
    axes: tuple[str, ...]
    init: Any

    @nn.compact
    def __call__(self) -> jax.Array:
        return nn_partitioning.param_with_axes("kernel", self.init, self.shape, jnp.float32, axes=self.axes)


class RouterWeights(nn.Module):
    """``router_weights/w/kernel``: the router's bias-free ``[embed, experts]`` projection."""

    num_experts: int

    @nn.compact
    def __call__(self, tokens: jax.Array) -> jax.Array:
        kernel = Kernel(
            (tokens.shape[-1], self.num_experts),
            ("embed", "unmodeled"),
            nn.initializers.normal(stddev=2e-2),
            name="w",
        )()
        return jnp.einsum("gtd,de->gte", tokens, kernel, precision=jax.lax.Precision.HIGHEST)


class Router(nn.Module):
    """Router logits in float32, with multiplicative jitter on the inputs at training time."""

    num_experts: int
    jitter_noise: float = 0.0

    @nn.compact
    def __call__(self, tokens: jax.Array, train: bool) -> jax.Array:
        tokens = tokens.astype(jnp.float32)
        if train and self.jitter_noise > 0:
            noise = jax.random.uniform(
                self.make_rng("dropout"),
                tokens.shape,
                jnp.float32,
                1.0 - self.jitter_noise,
                1.0 + self.jitter_noise,
            )
            tokens = tokens * noise
        return RouterWeights(self.num_experts, name="router_weights")(tokens)


class Experts(nn.Module):
    """``num_experts`` MLPs applied to their own slots: ``[experts, groups, capacity, embed]``."""

    num_experts: int
    hidden_dim: int
    activations: tuple[str, ...]
    dropout_rate: float
    dtype: Any

    @nn.compact
    def __call__(self, x: jax.Array, deterministic: bool) -> jax.Array:
        embed = x.shape[-1]
        # Each expert is initialised like a dense MLP (fan-in of its own kernel).
        init = nn.initializers.variance_scaling(
            1.0, "fan_in", "truncated_normal", in_axis=-2, out_axis=-1, batch_axis=(0,)
        )
        hidden = []
        for idx, act in enumerate(self.activations):
            name = "wi" if len(self.activations) == 1 else f"wi_{idx}"
            wi = Kernel(
                (self.num_experts, embed, self.hidden_dim), ("expert", "embed", "mlp"), init, name=name
            )()
            h = jnp.einsum("egcd,edf->egcf", x, wi.astype(self.dtype))
            hidden.append(_activation(act)(h))
        h = functools.reduce(operator.mul, hidden)
        h = nn.Dropout(rate=self.dropout_rate, broadcast_dims=(-2,))(h, deterministic=deterministic)
        h = with_sharding_constraint(h, _PER_EXPERT_HIDDEN)
        wo = Kernel((self.num_experts, self.hidden_dim, embed), ("expert", "mlp", "embed"), init, name="wo")()
        return jnp.einsum("egcf,efd->egcd", h, wo.astype(self.dtype))


class MoeBlock(nn.Module):
    """Routes each token to experts, runs them, and sums their outputs by the combine weights.

    Sows ``auxiliary_loss``, ``router_z_loss``, ``fraction_tokens_left_behind``,
    ``router_confidence`` and ``expert_usage`` (upstream's names) into the
    ``intermediates`` collection when it is mutable.

    Attributes:
      config: an ``MoeT5Config`` or ``MoeDecoderOnlyConfig``.
      causal: this block is in a decoder (tokens-choose, no batch prioritisation).
    """

    config: Any
    causal: bool = False

    @nn.compact
    def __call__(
        self, inputs: jax.Array, deterministic: bool = False, token_mask: jax.Array | None = None
    ) -> jax.Array:
        """Maps ``[batch, length, embed]`` to the same shape.

        ``token_mask`` (``[batch, length]``, True for real tokens; None: all real)
        keeps padding out of the routing when ``config.ignore_padding_tokens`` is set.
        """
        cfg = self.config
        num_experts = cfg.num_experts
        shards = _expert_axis_size()
        if num_experts % shards:
            raise ValueError(
                f"num_experts={num_experts} is not divisible by the 'expert' mesh axis of size {shards}; "
                f"use a multiple of {shards} experts or fewer expert partitions"
            )
        batch, length, embed = inputs.shape
        per_group, groups = self._groups(batch, length)
        train = not deterministic
        factor = cfg.train_capacity_factor if train else cfg.eval_capacity_factor
        capacity = _routing.expert_capacity(per_group, num_experts, factor, cfg.min_expert_capacity)
        tokens = with_sharding_constraint(
            inputs.reshape(groups, per_group, embed), ("batch", "length", "embed")
        )
        logits = Router(num_experts, cfg.jitter_noise, name="router")(tokens, train)
        padding = None
        if cfg.ignore_padding_tokens and token_mask is not None:
            padding = token_mask.reshape(groups, per_group)
        if cfg.router == "experts_choose" and not self.causal:
            routing = _routing.experts_choose(logits, min(capacity, per_group), padding)
        else:
            bpr = cfg.batch_prioritized_routing and not self.causal
            routing = _routing.tokens_choose(logits, cfg.num_selected_experts, capacity, bpr, padding)
        dtype = cfg.expert_dtype or cfg.dtype
        dispatch = routing.dispatch.astype(dtype)
        grouped = jnp.einsum("gtd,gtec->gecd", tokens.astype(dtype), dispatch)
        grouped = with_sharding_constraint(grouped, _GROUPED)
        per_expert = with_sharding_constraint(jnp.swapaxes(grouped, 0, 1), _PER_EXPERT)  # all-to-all
        out = Experts(
            num_experts,
            cfg.expert_hidden_dim,
            tuple(cfg.mlp_activations),
            cfg.dropout_rate,
            dtype,
            name="expert",
        )(per_expert, deterministic)
        out = with_sharding_constraint(out, _PER_EXPERT)
        out = with_sharding_constraint(jnp.swapaxes(out, 0, 1), _GROUPED)  # all-to-all back
        combined = jnp.einsum("gecd,gtec->gtd", out, routing.combine.astype(dtype))
        self._sow_metrics(routing, capacity)
        result = combined.reshape(batch, length, embed).astype(cfg.dtype)
        return with_sharding_constraint(result, ("batch", "length", "embed"))

    def _groups(self, batch: int, length: int) -> tuple[int, int]:
        """Tokens per routing group and the number of groups for a ``[batch, length]`` input."""
        spans = self.config.sequences_per_group
        if spans == 1:
            per_group = _routing.tokens_per_group(length, self.config.group_size)
            return per_group, batch * (length // per_group)
        spans = math.gcd(spans, batch)  # a batch it does not divide (decoding, a last batch)
        return spans * length, batch // spans

    def _sow_metrics(self, routing: _routing.Routing, capacity: int) -> None:
        groups, tokens, experts, _ = routing.dispatch.shape
        routed = jnp.sum(routing.dispatch)
        somewhere = jnp.sum(jnp.max(routing.dispatch, axis=(2, 3)))
        values = {
            "auxiliary_loss": routing.aux_loss,
            "router_z_loss": routing.z_loss,
            "fraction_tokens_left_behind": 1.0 - somewhere / (groups * tokens),
            "router_confidence": jnp.sum(routing.combine) / jnp.maximum(routed, 1.0),
            "expert_usage": routed / (groups * experts * capacity),
        }
        for name, value in values.items():
            self.sow("intermediates", name, jnp.asarray(value, jnp.float32))
