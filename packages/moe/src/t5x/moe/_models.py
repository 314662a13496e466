"""MoE model classes: the dense models' contract, with the router losses in the loss."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
from flax import traverse_util

from t5x.models import (
    DecoderOnlyConfig,
    DecoderOnlyModel,
    EncoderDecoderModel,
    T5Config,
    decoder_only_flops_per_token,
    encoder_decoder_flops_per_token,
)
from t5x.moe._config import MoeDecoderOnlyConfig, MoeT5Config
from t5x.moe._network import MoeDecoderOnlyTransformer, MoeEncoderDecoderTransformer
from t5x.moe._upcycle import load_dense_params, upcycle_params

PyTree = Any

MOE_METRICS = (
    "auxiliary_loss",
    "router_z_loss",
    "fraction_tokens_left_behind",
    "expert_usage",
    "router_confidence",
)


def dense_twin(config: MoeT5Config | MoeDecoderOnlyConfig) -> T5Config | DecoderOnlyConfig:
    """The dense config with every field of ``config`` but the MoE ones."""
    base = T5Config if isinstance(config, MoeT5Config) else DecoderOnlyConfig
    return base(**{f.name: getattr(config, f.name) for f in dataclasses.fields(base)})


def _layer_means(state: Mapping[str, Any]) -> dict[str, jax.Array]:
    """Each sown MoE metric averaged over the MoE layers (scanned stacks sow one per block)."""
    flat = traverse_util.flatten_dict(dict(state.get("intermediates", {})))
    out = {}
    for name in MOE_METRICS:
        values = [
            jnp.ravel(jnp.asarray(v[0] if isinstance(v, tuple) else v, jnp.float32))
            for p, v in flat.items()
            if p[-1] == name
        ]
        if not values:
            raise ValueError(f"no MoE layer sowed {name!r}: the network has no MoE block")
        out[name] = jnp.mean(jnp.concatenate(values))
    return out


class _MoeLoss:
    """Cross entropy plus ``aux_loss_factor * aux + router_z_loss_factor * z``, and expert metrics."""

    aux_loss_factor: float
    router_z_loss_factor: float
    upcycle_from: str | None
    config: Any
    z_loss: float
    label_smoothing: float
    loss_normalizing_factor: Any

    module: Any
    network_type: type  # the MoE network class the model runs
    config_type: type  # and the config it is built from

    def _moe_network(self, config: Any, module: Any) -> Any:
        """The network from ``config`` (or given as ``config`` / ``module``), checked."""
        if isinstance(config, self.network_type):
            config, module = None, config
        if module is None:
            if not isinstance(config, self.config_type):
                raise TypeError(
                    f"{type(self).__name__} needs an {self.config_type.__name__}, got {type(config).__name__}"
                )
            return self.network_type(config)
        if not isinstance(module, self.network_type):
            raise TypeError(f"module must be an {self.network_type.__name__}, got {type(module).__name__}")
        return module

    def _set_moe_options(
        self, aux_loss_factor: float, router_z_loss_factor: float, upcycle_from: str | None
    ) -> None:
        self.aux_loss_factor = float(aux_loss_factor)
        self.router_z_loss_factor = float(router_z_loss_factor)
        self.upcycle_from = upcycle_from

    def _network_inputs(self, batch: Mapping[str, Any]) -> tuple[Any, ...]:
        raise NotImplementedError

    def _hidden_and_state(self, params: PyTree, batch: Mapping[str, Any], dropout_rng: Any) -> Any:
        """The decoder's final hidden states, and the MoE layers' sown metrics (``intermediates``)."""
        rngs = {"dropout": dropout_rng} if dropout_rng is not None else None
        return self.module.apply(
            {"params": params},
            *self._network_inputs(batch),
            enable_dropout=dropout_rng is not None,
            hidden_only=True,
            rngs=rngs,
            mutable=["intermediates"],
        )

    def get_initial_variables(
        self, rng: Any, input_shapes: Any, input_types: Any = None
    ) -> dict[str, PyTree]:
        """As the dense model's, then upcycled from ``upcycle_from`` when given."""
        dense_init = super().get_initial_variables  # type: ignore[misc]
        return self._upcycled(dense_init(rng, input_shapes, input_types))

    def _loss(
        self, params: PyTree, batch: Mapping[str, Any], dropout_rng: Any
    ) -> tuple[jax.Array, dict[str, jax.Array]]:
        hidden, state = self._hidden_and_state(params, batch, dropout_rng)
        experts = _layer_means(state)
        aux = self.aux_loss_factor * experts["auxiliary_loss"]
        router_z = self.router_z_loss_factor * experts["router_z_loss"]
        loss, z_loss, metrics = self._loss_of_hidden(params, batch, hidden, aux + router_z)  # type: ignore[attr-defined]
        total = loss + aux + router_z
        targets = batch["decoder_target_tokens"]
        cross_ent = loss - z_loss
        metrics["cross_ent_loss"] = cross_ent
        metrics["cross_ent_loss_per_all_target_tokens"] = cross_ent / targets.size
        metrics["experts/auxiliary_loss"] = aux
        metrics["experts/router_z_loss"] = router_z
        for name in ("fraction_tokens_left_behind", "expert_usage", "router_confidence"):
            metrics[f"experts/{name}"] = experts[name]
        return total, metrics

    def step_kernels(self, params: PyTree, rows: int) -> str:
        """MoE decoding steps always multiply with XLA (the CPU step kernels know dense MLPs only)."""
        del params, rows
        return "xla"

    def _upcycled(self, variables: dict[str, PyTree]) -> dict[str, PyTree]:
        if self.upcycle_from is None:
            return variables
        dense = load_dense_params(self.upcycle_from)
        return {**variables, "params": upcycle_params(dense, variables["params"], self.config)}

    def _moe_flops(self, dense_flops: float, lengths: Mapping[str, int], stacks: dict[str, str]) -> float:
        """Adds what the active experts and the router cost beyond the dense twin's MLPs."""
        cfg = self.config
        per_mlp = len(cfg.mlp_activations) + 1
        active = cfg.num_selected_experts if cfg.router == "tokens_choose" else cfg.train_capacity_factor
        extra = 0.0
        total_tokens = 0
        for stack, feature in stacks.items():
            depth = cfg.num_layers if stack == "decoder_only" else getattr(cfg, f"num_{stack}_layers")
            sparse = sum(cfg.is_sparse(i) for i in range(depth))
            per_layer = per_mlp * cfg.emb_dim * (active * cfg.expert_hidden_dim - cfg.mlp_dim)
            per_layer += cfg.emb_dim * cfg.num_experts  # router
            tokens = int(lengths.get(feature, 0))
            extra += 6.0 * sparse * per_layer * tokens
            total_tokens += tokens
        return dense_flops + extra / max(total_tokens, 1)


class MoeEncoderDecoderModel(_MoeLoss, EncoderDecoderModel):
    """An MoE encoder-decoder under the ``Model`` contract (trains and decodes like the dense one).

    Args:
      config: an ``MoeT5Config`` (or the network, as upstream passes it).
      input_vocabulary: the inputs' vocabulary.
      output_vocabulary: the targets' vocabulary.
      aux_loss_factor: weight of the load-balancing loss (upstream's Switch gin: 0.01).
      router_z_loss_factor: weight of the router z-loss (ST-MoE: 0.001).
      upcycle_from: a dense T5X checkpoint (model folder or ``checkpoint_<step>``):
        initial parameters are its weights, every expert a copy of its layer's dense
        MLP, routers fresh (sparse upcycling).
      **kwargs: ``EncoderDecoderModel``'s keywords (``z_loss``, ``decode_fn``, ...).
    """

    network_type = MoeEncoderDecoderTransformer
    config_type = MoeT5Config

    def __init__(
        self,
        config: MoeT5Config | MoeEncoderDecoderTransformer | None = None,
        input_vocabulary: Any = None,
        output_vocabulary: Any = None,
        *,
        module: MoeEncoderDecoderTransformer | None = None,
        aux_loss_factor: float = 0.01,
        router_z_loss_factor: float = 0.0,
        upcycle_from: str | None = None,
        **kwargs: Any,
    ) -> None:
        module = self._moe_network(config, module)
        kwargs.setdefault("cpu_kernels", False)
        super().__init__(None, input_vocabulary, output_vocabulary, module=module, **kwargs)
        self._set_moe_options(aux_loss_factor, router_z_loss_factor, upcycle_from)

    def _network_inputs(self, batch: Mapping[str, Any]) -> tuple[Any, ...]:
        return (
            batch["encoder_input_tokens"],
            batch["decoder_input_tokens"],
            batch["decoder_target_tokens"],
            batch.get("encoder_segment_ids"),
            batch.get("decoder_segment_ids"),
        )

    def flops_per_token(self, model_feature_lengths: Mapping[str, int]) -> float:
        """Training FLOPs per token counting only the active experts (and the routers)."""
        twin = dense_twin(self.config)
        assert isinstance(twin, T5Config)
        dense = encoder_decoder_flops_per_token(twin, model_feature_lengths)
        lengths = dict(model_feature_lengths)
        stacks = {"encoder": "encoder_input_tokens", "decoder": "decoder_target_tokens"}
        if "decoder_target_tokens" not in lengths:
            lengths["decoder_target_tokens"] = lengths.get("decoder_input_tokens", lengths.get("targets", 0))
        if "encoder_input_tokens" not in lengths:
            lengths["encoder_input_tokens"] = lengths.get("inputs", 0)
        return self._moe_flops(dense, lengths, stacks)


class MoeDecoderOnlyModel(_MoeLoss, DecoderOnlyModel):
    """An MoE decoder-only LM under the ``Model`` contract.

    Args:
      config: an ``MoeDecoderOnlyConfig`` (or the network).
      vocabulary: the vocabulary.
      aux_loss_factor: as for ``MoeEncoderDecoderModel``.
      router_z_loss_factor: as for ``MoeEncoderDecoderModel``.
      upcycle_from: as for ``MoeEncoderDecoderModel``.
      **kwargs: ``DecoderOnlyModel``'s keywords.
    """

    network_type = MoeDecoderOnlyTransformer
    config_type = MoeDecoderOnlyConfig

    def __init__(
        self,
        config: MoeDecoderOnlyConfig | MoeDecoderOnlyTransformer | None = None,
        vocabulary: Any = None,
        *,
        module: MoeDecoderOnlyTransformer | None = None,
        aux_loss_factor: float = 0.01,
        router_z_loss_factor: float = 0.0,
        upcycle_from: str | None = None,
        **kwargs: Any,
    ) -> None:
        module = self._moe_network(config, module)
        kwargs.setdefault("cpu_kernels", False)
        super().__init__(None, vocabulary, module=module, **kwargs)
        self._set_moe_options(aux_loss_factor, router_z_loss_factor, upcycle_from)

    def _network_inputs(self, batch: Mapping[str, Any]) -> tuple[Any, ...]:
        return (
            batch["decoder_input_tokens"],
            batch["decoder_target_tokens"],
            batch.get("decoder_segment_ids"),
            batch.get("decoder_positions"),
            self._causal_attention(batch),
        )

    def flops_per_token(self, model_feature_lengths: Mapping[str, int]) -> float:
        """Training FLOPs per token counting only the active experts (and the routers)."""
        twin = dense_twin(self.config)
        assert isinstance(twin, DecoderOnlyConfig)
        dense = decoder_only_flops_per_token(twin, model_feature_lengths)
        lengths = dict(model_feature_lengths)
        feature = next(
            (k for k in ("decoder_target_tokens", "decoder_input_tokens", "targets") if k in lengths), None
        )
        if feature is None:
            return dense
        return self._moe_flops(dense, {"decoder_only": lengths[feature]}, {"decoder_only": "decoder_only"})
