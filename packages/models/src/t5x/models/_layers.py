"""Basic Flax layers of the T5 family: dense, embedding, RMS norm, relative positions, MLP."""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Sequence
from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax.linen import partitioning as nn_partitioning

from t5x.models._cpu_kernels import float32_only, packed_kernel, packed_kernels, packed_matmul, packed_matmuls
from t5x.models._joined import joined_kernel
from t5x.models._matmul import dense, dot_general

param_with_axes = nn_partitioning.param_with_axes
Initializer = Callable[..., jax.Array]


def constrain(x: jax.Array, axes: tuple[str | None, ...]) -> jax.Array:
    """Names the logical axes of an activation (a no-op without axis rules)."""
    return nn.with_logical_constraint(x, axes)


def nd_init(scale: float, mode: Any, distribution: Any) -> Callable[..., jax.Array]:
    """A variance-scaling initialiser taking explicit fan-in / fan-out axes."""

    def init(key: jax.Array, shape: tuple[int, ...], dtype: Any, in_axis: Any, out_axis: Any) -> jax.Array:
        return nn.initializers.variance_scaling(scale, mode, distribution, in_axis, out_axis)(
            key, shape, dtype
        )

    return init


def _as_tuple(x: int | Sequence[int]) -> tuple[int, ...]:
    return tuple(x) if isinstance(x, Sequence) else (x,)


class DenseGeneral(nn.Module):
    """A bias-free linear map over one or more trailing axes.

    With ``joined_kernel`` the kernel is stored flat as
    ``[prod(in_dims), prod(features)]`` (t5x's ``t5`` layout); otherwise it keeps
    its natural shape ``in_dims + features`` (the scalable-T5 layout used with
    scanned layers). Both initialise with the same fan-in / fan-out.

    Attributes:
      features: output feature dims.
      axis: input axes contracted.
      dtype: computation dtype; the kernel is float32.
      matmul_dtype: dtype the operands are rounded to (float32 accumulation), or None.
      kernel_init: ``init(key, shape, dtype, in_axis, out_axis)``.
      kernel_axes: logical names of the stored kernel's axes.
      joined_kernel: store the kernel flat (see above).
      step_kernels: how a decoding step multiplies (``"xla"``, ``"packed"``: the CPU kernel
        on its packed copy in the ``packed_kernels`` collection, for float32 layers and
        steps of at most 64 rows; ``"joined"`` multiplies as ``"xla"``). The model chooses
        it per decode call.
    """

    features: int | Sequence[int]
    axis: int | Sequence[int] = -1
    dtype: Any = jnp.float32
    matmul_dtype: Any = None
    kernel_init: Callable[..., jax.Array] = nd_init(1.0, "fan_in", "truncated_normal")
    kernel_axes: tuple[str, ...] = ()
    joined_kernel: bool = True
    step_kernels: str = "xla"

    @nn.compact
    def __call__(self, inputs: jax.Array, features_before_length: bool = False) -> jax.Array:
        """Maps ``inputs [..., in_dims]`` to ``[..., *features]``.

        With ``features_before_length`` (one contracted axis, ``inputs [batch,
        length, in]``) the result is ``[batch, *features, length]``, laid out so
        by the product itself: the KV cache's layout, which attention reads
        without a transpose.
        """
        features = _as_tuple(self.features)
        inputs = jnp.asarray(inputs, self.dtype)
        axis = tuple(a % inputs.ndim for a in _as_tuple(self.axis))
        in_dims = tuple(inputs.shape[a] for a in axis)
        natural = in_dims + features
        in_axis: int | tuple[int, ...]
        out_axis: int | tuple[int, ...]
        if self.joined_kernel:
            shape: tuple[int, ...] = (int(np.prod(in_dims)), int(np.prod(features)))
            in_axis, out_axis = 0, 1
        else:
            shape = natural
            in_axis = tuple(range(len(in_dims)))
            out_axis = tuple(range(len(in_dims), len(natural)))
        kernel = param_with_axes(
            "kernel",
            lambda key, shp, dt: self.kernel_init(key, shp, dt, in_axis, out_axis),
            shape,
            jnp.float32,
            axes=self.kernel_axes,
        )
        kernel = jnp.asarray(kernel, self.dtype)
        if features_before_length:
            if inputs.ndim != 3 or axis != (2,):
                raise ValueError(
                    f"features_before_length needs [batch, length, in] inputs, got {inputs.shape}"
                )
            # [batch, in, out] . [batch, length, in] -> [batch, out, length]
            flat = kernel.reshape(in_dims[0], -1)
            batched = jnp.broadcast_to(flat, (inputs.shape[0], *flat.shape))
            out = dot_general(batched, inputs, (((1,), (2,)), ((0,), (0,))), self.matmul_dtype)
            return out.reshape(inputs.shape[0], *features, inputs.shape[1])
        if axis == tuple(range(inputs.ndim - len(axis), inputs.ndim)):
            # Trailing axes: one [..., in] x [in, out] product (see `dense`).
            rows = inputs.reshape(*inputs.shape[: inputs.ndim - len(axis)], -1)
            flat = kernel.reshape(rows.shape[-1], -1)
            on_kernels = self.step_kernels == "packed" and float32_only(self.dtype, self.matmul_dtype)
            packed = packed_kernel(self, rows) if on_kernels else None
            if packed is not None:
                # A decoding step's few rows (see `pack_decode_kernels`).
                out = packed_matmul(rows, packed, flat.shape[1])
            else:
                out = dense(rows, flat, self.matmul_dtype)
            return out.reshape(*out.shape[:-1], *features)
        kernel = jnp.reshape(kernel, natural)
        contract = tuple(range(len(axis)))
        return dot_general(inputs, kernel, ((axis, contract), ((), ())), self.matmul_dtype)


class Embed(nn.Module):
    """Token embedding ``token_embedder/embedding`` of shape ``[vocab, embed]``.

    Looks rows up with a gather; upstream's one-hot contraction gives the same
    numbers but costs ``vocab`` times more FLOPs.
    """

    num_embeddings: int
    features: int
    dtype: Any = jnp.float32
    attend_dtype: Any = jnp.float32
    matmul_dtype: Any = None
    embedding_init: Initializer = nn.initializers.normal(stddev=1.0)

    def setup(self) -> None:
        self.embedding = param_with_axes(
            "embedding",
            self.embedding_init,
            (self.num_embeddings, self.features),
            jnp.float32,
            axes=("vocab", "embed"),
        )

    def __call__(self, inputs: jax.Array) -> jax.Array:
        """Embeds integer ids ``[...]`` into ``[..., features]``."""
        if not jnp.issubdtype(inputs.dtype, jnp.integer):
            raise ValueError(f"token ids must be integers, got dtype {inputs.dtype}")
        out = jnp.take(jnp.asarray(self.embedding, self.dtype), inputs, axis=0)
        return constrain(out, ("batch", "length", "embed"))

    def attend(self, query: jax.Array) -> jax.Array:
        """Scores ``query [..., features]`` against every row: ``[..., vocab]``."""
        query = jnp.asarray(query, self.attend_dtype)
        embedding = jnp.asarray(self.embedding, self.attend_dtype)
        return dot_general(query, embedding, (((query.ndim - 1,), (1,)), ((), ())), self.matmul_dtype)


class LayerNorm(nn.Module):
    """T5's RMS norm: no mean subtraction, no bias, statistics in float32."""

    epsilon: float = 1e-6
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        """Normalises the last axis of ``x [..., embed]``."""
        x = jnp.asarray(x, jnp.float32)
        mean2 = jnp.mean(jnp.square(x), axis=-1, keepdims=True)
        y = jnp.asarray(x * jax.lax.rsqrt(mean2 + self.epsilon), self.dtype)
        scale = param_with_axes("scale", nn.initializers.ones, (x.shape[-1],), jnp.float32, axes=("embed",))
        return y * jnp.asarray(scale, self.dtype)


def relative_position_bucket(
    relative_position: np.ndarray, bidirectional: bool = True, num_buckets: int = 32, max_distance: int = 128
) -> np.ndarray:
    """Maps ``memory_position - query_position`` to T5's relative-position buckets.

    Half the buckets (all of them when causal) cover exact small distances; the
    rest grow logarithmically up to ``max_distance``, beyond which every distance
    shares the last bucket. Bidirectional tables give keys after the query the
    upper half of the buckets. Causal tables send every later key to bucket 0.

    Args:
      relative_position: integer array of any shape.
      bidirectional: whether keys after the query get their own buckets.
      num_buckets: total buckets.
      max_distance: distance from which all positions share a bucket.

    Returns:
      int32 array of the same shape with values in ``[0, num_buckets)``.
    """
    n = -np.asarray(relative_position, dtype=np.int64)
    buckets = np.zeros(n.shape, dtype=np.int32)
    if bidirectional:
        num_buckets //= 2
        buckets += (n < 0).astype(np.int32) * num_buckets
        n = np.abs(n)
    else:
        n = np.maximum(n, 0)
    max_exact = num_buckets // 2
    # Same float32 / float64 mix as upstream, so boundary distances fall in the same bucket.
    scaled = np.log(n.astype(np.float32) / max_exact + np.finfo(np.float32).eps) / np.log(
        max_distance / max_exact
    )
    large = max_exact + (scaled * (num_buckets - max_exact)).astype(np.int32)
    large = np.minimum(large, num_buckets - 1)
    return buckets + np.where(n < max_exact, n, large).astype(np.int32)


class RelativePositionBiases(nn.Module):
    """The ``relpos_bias/rel_embedding`` table ``[heads, buckets]`` and its lookup."""

    num_buckets: int
    max_distance: int
    num_heads: int
    dtype: Any = jnp.float32
    embedding_init: Initializer = nn.initializers.variance_scaling(1.0, "fan_avg", "uniform")

    def setup(self) -> None:
        self.rel_embedding = param_with_axes(
            "rel_embedding",
            self.embedding_init,
            (self.num_heads, self.num_buckets),
            jnp.float32,
            axes=("heads", "relpos_buckets"),
        )

    def __call__(self, qlen: int, klen: int, bidirectional: bool = True) -> jax.Array:
        """Returns the attention bias ``[1, heads, qlen, klen]``."""
        return self.lazy(qlen, klen, bidirectional).full()

    def lazy(self, qlen: int, klen: int, bidirectional: bool = True) -> RelativeBias:
        """The same bias as a :class:`RelativeBias`: a decoding step reads only its rows."""
        rel = np.arange(klen)[None, :] - np.arange(qlen)[:, None]
        buckets = relative_position_bucket(rel, bidirectional, self.num_buckets, self.max_distance)
        return RelativeBias(jnp.asarray(self.rel_embedding, self.dtype), jnp.asarray(buckets))


@flax.struct.dataclass
class RelativeBias:
    """A relative-position bias kept as its table and bucket ids.

    A decoding step needs one row of the ``[qlen, klen]`` bias per example; gathering
    only those rows spares building the whole bias at every step.

    Attributes:
      table: ``[heads, num_buckets]``.
      buckets: ``[qlen, klen]`` bucket ids.
    """

    table: jax.Array
    buckets: jax.Array

    def full(self) -> jax.Array:
        """The whole bias, ``[1, heads, qlen, klen]``."""
        return self.table[:, self.buckets][None]

    def rows(self, positions: jax.Array) -> jax.Array:
        """``[n, heads, 1, klen]``: the rows of query ``positions [n]`` (clamped to the table)."""
        ids = jnp.take(self.buckets, positions, axis=0, mode="clip")  # [n, klen]
        return jnp.transpose(self.table[:, ids], (1, 0, 2))[:, :, None, :]


def activation(name: str) -> Callable[[jax.Array], jax.Array]:
    """Resolves an ``mlp_activations`` entry (``'linear'`` is the identity)."""
    if name == "linear":
        return lambda x: x
    return getattr(nn, name)


class MlpBlock(nn.Module):
    """Feed-forward block: ``wi`` (or gated ``wi_0``, ``wi_1``, ...) then ``wo``."""

    intermediate_dim: int
    activations: tuple[str, ...] = ("relu",)
    intermediate_dropout_rate: float = 0.1
    dtype: Any = jnp.float32
    matmul_dtype: Any = None
    joined_kernel: bool = True
    step_kernels: str = "xla"

    @nn.compact
    def __call__(self, inputs: jax.Array, deterministic: bool = False) -> jax.Array:
        """Maps ``[batch, length, embed]`` to the same shape."""
        init = nd_init(1.0, "fan_in", "truncated_normal")
        gated = len(self.activations) > 1 and self.joined_kernel
        gates = self._step_gates(inputs) if gated else None
        if gates is not None:
            hidden = [activation(act)(g) for act, g in zip(self.activations, gates, strict=True)]
        else:
            hidden = []
            for idx, act in enumerate(self.activations):
                name = "wi" if len(self.activations) == 1 else f"wi_{idx}"
                h = DenseGeneral(
                    self.intermediate_dim,
                    dtype=self.dtype,
                    matmul_dtype=self.matmul_dtype,
                    kernel_init=init,
                    kernel_axes=("embed", "mlp"),
                    joined_kernel=self.joined_kernel,
                    step_kernels=self.step_kernels,
                    name=name,
                )(inputs)
                hidden.append(activation(act)(h))
        x = functools.reduce(operator.mul, hidden)
        x = nn.Dropout(rate=self.intermediate_dropout_rate, broadcast_dims=(-2,))(
            x, deterministic=deterministic
        )
        x = constrain(x, ("batch", "length", "mlp"))
        return DenseGeneral(
            inputs.shape[-1],
            dtype=self.dtype,
            matmul_dtype=self.matmul_dtype,
            kernel_init=init,
            kernel_axes=("mlp", "embed"),
            joined_kernel=self.joined_kernel,
            step_kernels=self.step_kernels,
            name="wo",
        )(x)

    def _step_gates(self, inputs: jax.Array) -> list[jax.Array] | None:
        """A decoding step's gate inputs ``wi_0``, ``wi_1``, ... as one call, or None."""
        if self.step_kernels == "joined" and (joined := joined_kernel(self, "wi", inputs)) is not None:
            # One decoding row: all gate inputs in one product (see `join_decode_kernels`).
            h = dense(jnp.asarray(inputs, self.dtype), joined.astype(self.dtype), self.matmul_dtype)
            return jnp.split(h, len(self.activations), axis=-1)
        if self.step_kernels == "packed" and float32_only(self.dtype, self.matmul_dtype):
            names = [f"wi_{i}" for i in range(len(self.activations))]
            packed = packed_kernels(self, names, inputs)
            if packed is not None:
                return packed_matmuls(inputs, [(kernel, self.intermediate_dim) for kernel in packed])
        return None


def make_attention_mask(
    query_input: jax.Array,
    key_input: jax.Array,
    pairwise_fn: Callable[..., jax.Array] = jnp.multiply,
    dtype: Any = jnp.float32,
) -> jax.Array:
    """Builds ``[batch, 1, q_len, kv_len]`` from ``[batch, q_len]`` and ``[batch, kv_len]``."""
    mask = pairwise_fn(jnp.expand_dims(query_input, -1), jnp.expand_dims(key_input, -2))
    return jnp.expand_dims(mask, -3).astype(dtype)


def make_causal_mask(x: jax.Array, dtype: Any = jnp.float32) -> jax.Array:
    """Lower-triangular ``[batch, 1, len, len]`` mask; ignores the values of ``x [batch, len]``."""
    idx = jnp.broadcast_to(jnp.arange(x.shape[-1], dtype=jnp.int32), x.shape)
    return make_attention_mask(idx, idx, jnp.greater_equal, dtype=dtype)


def combine_masks(*masks: jax.Array | None, dtype: Any = jnp.float32) -> jax.Array | None:
    """Logical AND of the given masks (None entries skipped; None if none left)."""
    present = [m for m in masks if m is not None]
    if not present:
        return None
    return functools.reduce(jnp.logical_and, present).astype(dtype)


def make_decoder_mask(
    decoder_target_tokens: jax.Array,
    dtype: Any = jnp.float32,
    decoder_causal_attention: jax.Array | None = None,
    decoder_segment_ids: jax.Array | None = None,
) -> jax.Array:
    """Self-attention mask of a decoder: causal, padding and packing combined.

    Positions where ``decoder_causal_attention`` is 1 (a prefix-LM's inputs) also
    see each other bidirectionally.

    Args:
      decoder_target_tokens: ``[batch, length]``; 0 is padding.
      dtype: mask dtype.
      decoder_causal_attention: optional ``[batch, length]`` 0/1.
      decoder_segment_ids: optional ``[batch, length]`` packing ids.

    Returns:
      ``[batch, 1, length, length]`` mask.
    """
    causal = make_causal_mask(decoder_target_tokens, dtype=dtype)
    if decoder_causal_attention is not None:
        prefix = make_attention_mask(
            decoder_causal_attention, decoder_causal_attention, jnp.logical_and, dtype=dtype
        )
        causal = jnp.logical_or(causal, prefix).astype(dtype)
    padding = make_attention_mask(decoder_target_tokens > 0, decoder_target_tokens > 0, dtype=dtype)
    packing = None
    if decoder_segment_ids is not None:
        packing = make_attention_mask(decoder_segment_ids, decoder_segment_ids, jnp.equal, dtype=dtype)
    mask = combine_masks(causal, padding, packing, dtype=dtype)
    assert mask is not None
    return mask
