"""Transformer layers and stacks: encoder, decoder (with or without cross-attention).

A stack's feed-forward blocks come from a ``FeedForward`` factory (the dense MLP by
default), so a network that swaps some MLPs for other blocks (t5x-moe's experts)
reuses these stacks unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax.linen import partitioning as nn_partitioning
from jax.custom_derivatives import SymbolicZero

from t5x.models._attention import MultiHeadDotProductAttention
from t5x.models._layers import (
    DenseGeneral,
    Embed,
    LayerNorm,
    MlpBlock,
    RelativeBias,
    RelativePositionBiases,
    constrain,
)

_BLC = ("batch", "length", "embed")
_BLV = ("batch", "length", "vocab")


def token_embedder(cfg: Any, name: str | None = None) -> Embed:
    """The token embedding (tied to the logits with ``logits_via_embedding``)."""
    return Embed(cfg.vocab_size, cfg.emb_dim, dtype=cfg.dtype, matmul_dtype=cfg.matmul_dtype, name=name)


def output_layer(cfg: Any, step_kernels: str = "xla", name: str | None = None) -> DenseGeneral:
    """The untied logits projection, ``logits_dense``."""
    return DenseGeneral(
        cfg.vocab_size,
        dtype=jnp.float32,
        matmul_dtype=cfg.matmul_dtype,
        kernel_axes=("embed", "vocab"),
        joined_kernel=True,
        step_kernels=step_kernels,
        name=name,
    )


def project_hidden(cfg: Any, head_params: Any, hidden: jax.Array) -> jax.Array:
    """The decoder's logits from its final hidden states, as ``Decoder`` computes them.

    Args:
      cfg: the network's config.
      head_params: the parameters of the token embedder (with ``logits_via_embedding``)
        or of ``logits_dense``.
      hidden: ``[batch, length, embed]`` (``Decoder(..., hidden_only=True)``).
    """
    logits: jax.Array
    if cfg.logits_via_embedding:
        scores: Any = token_embedder(cfg).apply({"params": head_params}, hidden, method=Embed.attend)
        logits = scores / jnp.sqrt(jnp.float32(hidden.shape[-1]))
    else:
        logits = output_layer(cfg).apply({"params": head_params}, hidden)  # type: ignore[assignment]
    return constrain(logits, _BLV)


def relpos_module(cfg: Any, name: str = "relpos_bias") -> RelativePositionBiases:
    """The relative-position table of a stack or (UMT5) of one layer."""
    return RelativePositionBiases(
        num_buckets=cfg.num_buckets,
        max_distance=cfg.max_distance,
        num_heads=cfg.num_heads,
        dtype=cfg.dtype,
        name=name,
    )


def _causal_relpos_bias(
    cfg: Any, length: int, decode: bool, name: str = "relpos_bias"
) -> jax.Array | RelativeBias:
    """A decoder's causal relative-position bias; lazy when decoding (a step reads only its rows)."""
    relpos = relpos_module(cfg, name)
    return relpos.lazy(length, length, False) if decode else relpos(length, length, False)


def _attention(cfg: Any, name: str, step_kernels: str = "xla") -> MultiHeadDotProductAttention:
    return MultiHeadDotProductAttention(
        num_heads=cfg.num_heads,
        head_dim=cfg.head_dim,
        dtype=cfg.dtype,
        matmul_dtype=cfg.matmul_dtype,
        dropout_rate=cfg.dropout_rate,
        float32_logits=cfg.float32_attention_logits,
        joined_kernel=not cfg.scan_layers,
        step_kernels=step_kernels,
        name=name,
    )


# ``factory(config, layer_index, causal, step_kernels)`` returns the module named ``mlp`` of
# one layer (``causal``: the layer is in a decoder). Scanned stacks of ``layers_per_scan``
# layers pass the position inside the scanned block, so a factory must depend on the index
# only modulo that block length. A block a factory makes is called as
# ``block(x, deterministic=..., token_mask=...)``; ``token_mask`` is ``[batch, length]``,
# True for real tokens (see ``real_tokens``), None where the layer has no mask (a decoding
# step). The dense MLP is called without it.
FeedForward = Callable[[Any, int, bool, str], nn.Module]


def real_tokens(mask: jax.Array | None) -> jax.Array | None:
    """``[batch, length]`` True for the tokens that are not padding, from a layer's attention mask.

    A ``[batch, heads, queries, keys]`` mask has an all-zero row exactly for a padding
    query: every real token attends at least to itself.
    """
    if mask is None:
        return None
    return jnp.any(mask[:, 0] > 0, axis=-1)


def dense_mlp(cfg: Any, layer_index: int = 0, causal: bool = False, step_kernels: str = "xla") -> MlpBlock:
    """The dense feed-forward block of every layer (the default ``FeedForward``)."""
    del layer_index, causal
    return MlpBlock(
        intermediate_dim=cfg.mlp_dim,
        activations=cfg.mlp_activations,
        intermediate_dropout_rate=cfg.dropout_rate,
        dtype=cfg.dtype,
        matmul_dtype=cfg.matmul_dtype,
        joined_kernel=not cfg.scan_layers,
        step_kernels=step_kernels,
        name="mlp",
    )


def _feed_forward(layer: Any, causal: bool, step_kernels: str, y: jax.Array, mask: Any, deterministic: bool):
    """The layer's ``mlp`` applied to ``y``; a block other than the dense MLP also gets the token mask."""
    block = (layer.feed_forward or dense_mlp)(layer.config, layer.layer_index, causal, step_kernels)
    if isinstance(block, MlpBlock):
        return block(y, deterministic=deterministic)
    return block(y, deterministic=deterministic, token_mask=real_tokens(mask))


def _dropout(cfg: Any, x: jax.Array, deterministic: bool) -> jax.Array:
    return nn.Dropout(rate=cfg.dropout_rate, broadcast_dims=(-2,))(x, deterministic=deterministic)


class EncoderLayer(nn.Module):
    """Pre-norm self-attention and MLP block with residuals (bidirectional)."""

    config: Any
    feed_forward: FeedForward | None = None
    layer_index: int = 0

    @nn.compact
    def __call__(
        self, inputs: jax.Array, mask: jax.Array | None, bias: jax.Array | None, deterministic: bool
    ) -> Any:
        """Maps ``inputs [batch, length, embed]`` to the same shape.

        ``bias`` is the stack's relative-position bias, None for per-layer tables.
        """
        cfg = self.config
        if cfg.per_layer_relpos_bias:
            bias = relpos_module(cfg, cfg.layer_relpos_name)(inputs.shape[-2], inputs.shape[-2], True)
        inputs = constrain(inputs, _BLC)
        x = LayerNorm(dtype=cfg.dtype, name="pre_attention_layer_norm")(inputs)
        x = _attention(cfg, "attention")(x, x, mask, bias, deterministic=deterministic)
        x = _dropout(cfg, x, deterministic) + inputs
        x = constrain(x, _BLC)
        y = LayerNorm(dtype=cfg.dtype, name="pre_mlp_layer_norm")(x)
        y = _feed_forward(self, False, "xla", y, mask, deterministic)
        y = constrain(_dropout(cfg, y, deterministic) + x, _BLC)
        return (y, None) if cfg.scan_layers else y


class DecoderLayer(nn.Module):
    """Causal self-attention, optional cross-attention to ``encoded``, and MLP.

    ``step_kernels`` is how a decoding step multiplies (see ``MultiHeadDotProductAttention``);
    ``feed_forward`` makes the ``mlp`` block (the dense MLP when None).
    """

    config: Any
    cross_attention: bool = True
    step_kernels: str = "xla"
    feed_forward: FeedForward | None = None
    layer_index: int = 0

    @nn.compact
    def __call__(
        self,
        inputs: jax.Array,
        encoded: jax.Array | None,
        decoder_mask: jax.Array | None,
        encoder_decoder_mask: jax.Array | None,
        bias: jax.Array | RelativeBias | None,
        deterministic: bool,
        decode: bool,
        max_decode_length: int | None,
        prefill: bool,
        prefill_lengths: jax.Array | None,
    ) -> Any:
        """Maps ``inputs [batch, length, embed]`` to the same shape."""
        cfg = self.config
        if cfg.per_layer_relpos_bias:
            length = int(max_decode_length) if decode and max_decode_length else inputs.shape[-2]
            bias = _causal_relpos_bias(cfg, length, decode, cfg.layer_relpos_name)
        inputs = constrain(inputs, _BLC)
        x = LayerNorm(dtype=cfg.dtype, name="pre_self_attention_layer_norm")(inputs)
        x = _attention(cfg, "self_attention", self.step_kernels)(
            x,
            x,
            decoder_mask,
            bias,
            deterministic=deterministic,
            decode=decode,
            prefill=prefill,
            prefill_lengths=prefill_lengths,
        )
        x = constrain(_dropout(cfg, x, deterministic) + inputs, _BLC)
        if self.cross_attention:
            assert encoded is not None, "a decoder with cross-attention needs the encoder's output"
            y = LayerNorm(dtype=cfg.dtype, name="pre_cross_attention_layer_norm")(x)
            y = _attention(cfg, "encoder_decoder_attention", self.step_kernels)(
                y, encoded, encoder_decoder_mask, deterministic=deterministic
            )
            x = constrain(_dropout(cfg, y, deterministic) + x, _BLC)
        z = LayerNorm(dtype=cfg.dtype, name="pre_mlp_layer_norm")(x)
        z = _feed_forward(self, True, self.step_kernels, z, decoder_mask, deterministic)
        z = constrain(_dropout(cfg, z, deterministic) + x, _BLC)
        return (z, None) if cfg.scan_layers else z


def _remat(cfg: Any, layer: type[nn.Module], static_argnums: tuple[int, ...]) -> Any:
    if cfg.remat_policy == "none":
        return layer
    policy = (
        jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims if cfg.remat_policy == "minimal" else None
    )
    return nn_partitioning.remat(
        layer, prevent_cse=not cfg.scan_layers, policy=policy, static_argnums=static_argnums
    )


def _sum_gradients_per_layer(x: jax.Array, args: tuple[Any, ...]) -> tuple[jax.Array, tuple[Any, ...]]:
    """``(x, args)`` unchanged; in the backward pass, adds each layer's gradient of ``args`` as it comes.

    Every layer reads the same ``args`` (the relative-position bias, the encoder's output).
    Left alone, XLA fuses the additions of the layers' gradients of them into one that runs
    after the last layer's backward pass, keeping every layer's gradient alive until then:
    for DEC-S at 2048 tokens, twelve ``[batch, heads, 2048, 2048]`` bias gradients, 3 of its
    3.8 GiB of temporaries. Tying the running sum to the gradient of ``x`` before a layer
    makes the backward pass finish that addition before it moves on to the layer below.
    """
    leaves, treedef = jax.tree_util.tree_flatten((x, args))
    return jax.tree_util.tree_unflatten(treedef, _map_picked(_tie_gradients, leaves, _is_float_array))


def _is_float_array(leaf: Any) -> bool:
    return isinstance(leaf, jax.Array) and jnp.issubdtype(leaf.dtype, jnp.inexact)


def _map_picked(fn: Callable[[tuple], tuple], leaves: list, pick: Callable[[Any], bool]) -> list:
    """``leaves`` with those ``pick`` selects replaced by ``fn`` of them (all in one call)."""
    picked = [i for i, leaf in enumerate(leaves) if pick(leaf)]
    out = list(leaves)
    for i, new in zip(picked, fn(tuple(leaves[i] for i in picked)), strict=True):
        out[i] = new
    return out


@jax.custom_vjp
def _tie_gradients(arrays: tuple[jax.Array, ...]) -> tuple[jax.Array, ...]:
    return arrays


def _tie_gradients_fwd(arrays):  # type: ignore[no-untyped-def]
    return tuple(a.value for a in arrays), None


def _tie_gradients_bwd(_, grads):  # type: ignore[no-untyped-def]
    # The barrier's outputs exist only together: the gradient of x, which the layer below
    # needs, waits for the running sums of the shared arguments' gradients. Zero gradients
    # (masks) stay symbolic rather than be made into arrays for the barrier.
    def nonzero(g: Any) -> bool:
        return not isinstance(g, SymbolicZero)

    tied = _map_picked(jax.lax.optimization_barrier, list(grads), nonzero)
    return (tuple(g if nonzero(g) else None for g in tied),)


_tie_gradients.defvjp(_tie_gradients_fwd, _tie_gradients_bwd, symbolic_zeros=True)


class LayerBlock(nn.Module):
    """``count`` consecutive layers, ``subblock_0`` ... ``subblock_<count-1>``: one scanned step.

    A stack whose layers are not all alike (t5x-moe: dense layers, then a sparse one)
    scans this block instead of a single layer; layer ``j`` of the block gets
    ``layer_index=j``.
    """

    config: Any
    layer: type[nn.Module]
    count: int
    layer_kwargs: tuple[tuple[str, Any], ...] = ()

    @nn.compact
    def __call__(self, x: jax.Array, *args: Any) -> Any:
        for j in range(self.count):
            layer = self.layer(
                config=self.config, layer_index=j, name=f"subblock_{j}", **dict(self.layer_kwargs)
            )
            x, _ = layer(x, *args)  # scanned layers return (carry, None)
        return x, None


def run_layers(
    module: nn.Module,
    cfg: Any,
    layer: type[nn.Module],
    num_layers: int,
    x: jax.Array,
    args: tuple[Any, ...],
    layers_per_scan: int | None = None,
    **kwargs: Any,
) -> jax.Array:
    """Applies ``num_layers`` copies of ``layer`` to ``x``, looped or scanned.

    Unscanned layers are named ``layers_<i>`` (and get ``layer_index=i``). Scanned
    ones share the name ``layers`` with parameters stacked on axis 1 and caches on
    axis 0; with ``layers_per_scan`` the scanned unit is a ``LayerBlock`` of that many
    layers (``layers/subblock_<j>/...``, ``num_layers / layers_per_scan`` steps).

    Raises:
      ValueError: when ``layers_per_scan`` does not divide ``num_layers``.
    """
    # Positional indices (self excluded) of the Python-valued arguments.
    statics = tuple(i + 1 for i, a in enumerate(args) if isinstance(a, (bool, int)) or a is None)
    if not cfg.scan_layers:
        block = _remat(cfg, layer, statics)
        for i in range(num_layers):
            x, args = _sum_gradients_per_layer(x, args)
            x = block(config=cfg, layer_index=i, name=f"layers_{i}", **kwargs)(x, *args)
        return x
    steps = num_layers
    if layers_per_scan is None:
        block = _remat(cfg, layer, statics)
    else:
        if num_layers % layers_per_scan:
            raise ValueError(
                f"scan_layers: {num_layers} layers cannot be scanned in blocks of {layers_per_scan} "
                f"(the block length must divide the depth); got num_layers={num_layers}, "
                f"block={layers_per_scan}"
            )
        steps = num_layers // layers_per_scan
        block = _remat(cfg, LayerBlock, statics)
        kwargs = {"layer": layer, "count": layers_per_scan, "layer_kwargs": tuple(sorted(kwargs.items()))}
    initializing = module.is_mutable_collection("params")
    params_spec = 1 if initializing else nn_partitioning.ScanIn(1)
    # Sown values (t5x-moe's router metrics) stack on a leading layers axis.
    variable_axes: dict[Any, Any] = {"params": params_spec, "cache": 0}
    if layers_per_scan is not None:
        variable_axes["intermediates"] = 0
    scanned = nn_partitioning.scan_with_axes(
        block,
        variable_axes=variable_axes,
        split_rngs={"params": True, "dropout": True},
        in_axes=(nn.broadcast,) * len(args),
        length=steps,
        axis_name="layers",
    )
    x, _ = scanned(config=cfg, name="layers", **kwargs)(x, *args)
    return x


class Encoder(nn.Module):
    """Embedding dropout, the encoder layers and ``encoder_norm``.

    ``feed_forward`` makes each layer's ``mlp`` (the dense MLP when None);
    ``layers_per_scan`` is the scanned unit's length (see ``run_layers``).
    """

    config: Any
    shared_embedding: nn.Module
    feed_forward: FeedForward | None = None
    layers_per_scan: int | None = None

    @nn.compact
    def __call__(
        self, encoder_input_tokens: jax.Array, encoder_mask: jax.Array | None, deterministic: bool
    ) -> jax.Array:
        """Encodes ``[batch, length]`` ids into ``[batch, length, embed]``."""
        cfg = self.config
        length = encoder_input_tokens.shape[-1]
        bias = None if cfg.per_layer_relpos_bias else relpos_module(cfg)(length, length, True)
        x = self.shared_embedding(encoder_input_tokens.astype(jnp.int32))
        x = _dropout(cfg, x, deterministic).astype(cfg.dtype)
        x = run_layers(
            self,
            cfg,
            EncoderLayer,
            cfg.num_encoder_layers,
            x,
            (encoder_mask, bias, deterministic),
            self.layers_per_scan,
            **({"feed_forward": self.feed_forward} if self.feed_forward else {}),
        )
        x = LayerNorm(dtype=cfg.dtype, name="encoder_norm")(x)
        return nn.Dropout(rate=cfg.dropout_rate)(x, deterministic=deterministic)


class Decoder(nn.Module):
    """Decoder layers, ``decoder_norm`` and the logits (tied or ``logits_dense``).

    Attributes:
      config: a ``T5Config`` or ``DecoderOnlyConfig``.
      shared_embedding: the token embedder (created here when None).
      cross_attention: whether layers attend to an encoder.
      step_kernels: how a decoding step multiplies: ``"xla"``, ``"packed"`` (the CPU
        kernels) or ``"joined"`` (see ``MultiHeadDotProductAttention``); the model
        chooses it per decode call.
      feed_forward: makes each layer's ``mlp`` (the dense MLP when None).
      layers_per_scan: the scanned unit's length (see ``run_layers``).
    """

    config: Any
    shared_embedding: nn.Module | None = None
    cross_attention: bool = True
    step_kernels: str = "xla"
    feed_forward: FeedForward | None = None
    layers_per_scan: int | None = None

    @nn.compact
    def __call__(
        self,
        encoded: jax.Array | None,
        decoder_input_tokens: jax.Array,
        decoder_mask: jax.Array | None = None,
        encoder_decoder_mask: jax.Array | None = None,
        deterministic: bool = True,
        decode: bool = False,
        max_decode_length: int | None = None,
        prefill: bool = False,
        prefill_lengths: jax.Array | None = None,
        *,
        hidden_only: bool = False,
    ) -> jax.Array:
        """Returns float32 logits ``[batch, length, vocab]``.

        With ``hidden_only``, returns the hidden states ``[batch, length, embed]``
        the logits would be computed from (see ``project_hidden``).

        Raises:
          ValueError: when decoding without ``max_decode_length``.
        """
        cfg = self.config
        num_layers = cfg.num_decoder_layers if self.cross_attention else cfg.num_layers
        if decode and not max_decode_length:
            raise ValueError("decoding step by step needs max_decode_length (the cache length)")
        length = int(max_decode_length) if decode and max_decode_length else decoder_input_tokens.shape[-1]
        bias = None if cfg.per_layer_relpos_bias else _causal_relpos_bias(cfg, length, decode)
        embedding = self.shared_embedding
        if embedding is None:
            embedding = token_embedder(cfg, name="token_embedder")
        y = embedding(decoder_input_tokens.astype(jnp.int32))
        y = _dropout(cfg, y, deterministic).astype(cfg.dtype)
        args = (
            encoded,
            decoder_mask,
            encoder_decoder_mask,
            bias,
            deterministic,
            decode,
            max_decode_length,
            prefill,
            prefill_lengths,
        )
        y = run_layers(
            self,
            cfg,
            DecoderLayer,
            num_layers,
            y,
            args,
            self.layers_per_scan,
            cross_attention=self.cross_attention,
            step_kernels=self.step_kernels,
            **({"feed_forward": self.feed_forward} if self.feed_forward else {}),
        )
        y = LayerNorm(dtype=cfg.dtype, name="decoder_norm")(y)
        y = _dropout(cfg, y, deterministic)
        if hidden_only:
            return y
        if cfg.logits_via_embedding:
            logits = embedding.attend(y) / jnp.sqrt(jnp.float32(y.shape[-1]))
        else:
            logits = output_layer(cfg, self.step_kernels, name="logits_dense")(y)
        return constrain(logits, _BLV)
