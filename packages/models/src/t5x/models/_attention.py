"""Multi-head dot-product attention with T5's conventions and a KV cache."""

from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

from t5x.models._cpu_kernels import cache_attention, cache_step, float32_only, packed_kernels, packed_matmuls
from t5x.models._joined import joined_kernel
from t5x.models._layers import DenseGeneral, RelativeBias, combine_masks, constrain, nd_init
from t5x.models._matmul import dense, dot_general


def dot_product_attention(
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    bias: jax.Array | tuple[jax.Array, ...] | None = None,
    dropout_rng: jax.Array | None = None,
    dropout_rate: float = 0.0,
    deterministic: bool = True,
    dtype: Any = jnp.float32,
    float32_logits: bool = False,
    matmul_dtype: Any = None,
) -> jax.Array:
    """Unscaled dot-product attention (T5 folds ``1/sqrt(head_dim)`` into the query init).

    Args:
      query: ``[batch, q_len, heads, head_dim]``.
      key: ``[batch, kv_len, heads, head_dim]``.
      value: ``[batch, kv_len, heads, head_dim]``.
      bias: broadcastable to ``[batch, heads, q_len, kv_len]``, or a tuple of such terms
        (a mask's bias and a relative-position bias): they are added where the logits are
        made, so their broadcast sum is never stored, and each gets its own gradient.
      dropout_rng: key for attention-weight dropout.
      dropout_rate: dropout rate on the weights (broadcast over queries).
      deterministic: disables dropout.
      dtype: dtype of the returned weights and output.
      float32_logits: compute the logits in float32.
      matmul_dtype: dtype the operands of both products are rounded to, or None.

    Returns:
      ``[batch, q_len, heads, head_dim]``.
    """
    if float32_logits:
        query, key = query.astype(jnp.float32), key.astype(jnp.float32)
    dropout = not deterministic and dropout_rate > 0.0
    if not dropout and matmul_dtype is None:
        return _attention_recomputed(query, key, value, bias, jnp.dtype(dtype))
    weights = _attention_weights(query, key, bias, dtype, matmul_dtype)[1]
    if dropout:
        assert dropout_rng is not None, "attention dropout needs a PRNG key"
        keep_prob = 1.0 - dropout_rate
        shape = list(weights.shape)
        shape[-2] = 1
        keep = jax.random.bernoulli(dropout_rng, keep_prob, shape)
        weights = weights * (
            jnp.broadcast_to(keep, weights.shape).astype(dtype) / jnp.asarray(keep_prob, dtype)
        )
    return _weighted_values(weights, value, dtype, matmul_dtype)


def _attention_weights(
    query: jax.Array, key: jax.Array, bias: Any, dtype: Any, matmul_dtype: Any = None
) -> tuple[jax.Array, jax.Array]:
    """The softmax over ``q.k + bias``: ``([batch, heads, q_len, kv_len]`` float32, the same in ``dtype``)."""
    # bqhd,bkhd->bhqk
    logits = dot_general(query, key, (((3,), (3,)), ((0, 2), (0, 2))), matmul_dtype)
    if isinstance(bias, tuple):
        bias = _summed(bias)
    if bias is not None:
        logits = logits + bias.astype(logits.dtype)
    # Softmax statistics in float32 whatever the activation dtype.
    weights = jax.nn.softmax(logits.astype(jnp.float32))
    return weights, weights.astype(dtype)


def _summed(terms: tuple[jax.Array, ...]) -> jax.Array | None:
    """The sum of bias terms, in their order, or None for none."""
    return functools.reduce(jnp.add, terms) if terms else None


def _weighted_values(weights: jax.Array, value: jax.Array, dtype: Any, matmul_dtype: Any = None) -> jax.Array:
    # bhqk,bkhd->bhqd, then bqhd
    out = dot_general(weights, value.astype(dtype), (((3,), (1,)), ((0, 1), (0, 2))), matmul_dtype)
    return jnp.swapaxes(out, 1, 2)


# Attention whose backward pass recomputes the weights from the query and key instead of keeping
# them: autodiff of the plain formula keeps three [batch, heads, q_len, kv_len] arrays per layer
# for the backward pass (the exponentials, the broadcast normaliser, the weights), the largest
# part of a training step's memory at long sequences (DEC-S at 512 tokens: 2.4 of 5.7 GiB). The
# recomputation costs one q.k product and one softmax per layer.
@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _attention_recomputed(
    query: jax.Array, key: jax.Array, value: jax.Array, bias: Any, dtype: Any
) -> jax.Array:
    return _weighted_values(_attention_weights(query, key, bias, dtype)[1], value, dtype)


def _attention_recomputed_fwd(query, key, value, bias, dtype):  # type: ignore[no-untyped-def]
    return _attention_recomputed(query, key, value, bias, dtype), (query, key, value, bias)


def _attention_recomputed_bwd(dtype, residuals, grad):  # type: ignore[no-untyped-def]
    # The barrier keeps XLA from merging this recomputation with the forward pass's (the same
    # operations on the same operands), and, as it takes the incoming gradient too, from
    # scheduling it before the backward pass reaches this layer: either would keep every
    # layer's weights alive after all.
    (query, key, value, bias), grad = lax.optimization_barrier((residuals, grad))
    weights32, weights = _attention_weights(query, key, bias, dtype)
    grad = jnp.swapaxes(grad, 1, 2)  # bhqd
    # bhqk,bhqd->bhkd: the values' gradient; bhqd,bkhd->bhqk: the weights'.
    d_value = jnp.swapaxes(lax.dot_general(weights, grad, (((2,), (2,)), ((0, 1), (0, 1)))), 1, 2)
    d_weights = lax.dot_general(grad, value.astype(dtype), (((3,), (3,)), ((0, 1), (0, 2))))
    # The softmax's backward pass, in float32 as its forward pass.
    d_weights = d_weights.astype(jnp.float32)
    d_logits = weights32 * (d_weights - jnp.sum(weights32 * d_weights, axis=-1, keepdims=True))
    logits_dtype = jnp.result_type(query.dtype, key.dtype)
    d_logits = d_logits.astype(logits_dtype)
    # bhqk,bkhd->bhqd and bhqk,bqhd->bhkd, each then b?hd.
    d_query = jnp.swapaxes(lax.dot_general(d_logits, key, (((3,), (1,)), ((0, 1), (0, 2)))), 1, 2)
    d_key = jnp.swapaxes(lax.dot_general(d_logits, query, (((2,), (1,)), ((0, 1), (0, 2)))), 1, 2)
    d_bias = jax.tree_util.tree_map(lambda b: _sum_to_shape(d_logits, b.shape).astype(b.dtype), bias)
    return (
        d_query.astype(query.dtype),
        d_key.astype(key.dtype),
        d_value.astype(value.dtype),
        d_bias,
    )


_attention_recomputed.defvjp(_attention_recomputed_fwd, _attention_recomputed_bwd)


def _sum_to_shape(x: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """``x`` summed over the axes along which an array of ``shape`` was broadcast to it."""
    x = jnp.sum(x, axis=tuple(range(x.ndim - len(shape))))
    return jnp.sum(x, axis=tuple(i for i, n in enumerate(shape) if n == 1 and x.shape[i] != 1), keepdims=True)


def _write_slot(cache: jax.Array, new: jax.Array, index: jax.Array) -> jax.Array:
    """Returns ``cache [batch, heads, head_dim, length]`` with ``new [batch, 1, heads, head_dim]`` at ``index``.

    ``index`` is ``[1]`` (one position for all) or ``[batch]``. A position past the end is
    clamped to the last slot: only a row that already ended is stepped that far (while
    others finish), and the slot it overwrites is its own. A plain in-place update (no
    bounds check reading the old values) lets XLA update the loop-carried cache without
    copying it.
    """
    column = jnp.moveaxis(new, -3, -1).astype(cache.dtype)  # [batch, heads, head_dim, 1]
    # Row by row even for one shared index: XLA:CPU copied the whole cache at every step
    # around a single dynamic_update_slice, but updates this scatter in place.
    index = jnp.broadcast_to(index, (cache.shape[0],))
    write_row = functools.partial(jax.lax.dynamic_update_slice_in_dim, axis=-1)
    # The barrier makes the updated cache one buffer for both its readers (this step's
    # attention and the loop state). Without it XLA fused the write into each reader, and
    # each fused copy needed its own copy of the cache: at batch 1, four copies of every
    # layer's keys and values per step.
    return jax.lax.optimization_barrier(jax.vmap(write_row)(cache, column, index))


def _attend_to_cache(
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    bias: jax.Array | None,
    dtype: Any,
    float32_logits: bool,
    matmul_dtype: Any = None,
    cpu_kernels: bool = False,
) -> jax.Array:
    """``dot_product_attention`` without dropout, for keys and values in the cache layout.

    Args:
      query: ``[rows, q_len, heads, head_dim]``; ``rows`` is a multiple of the keys' batch:
        each example's keys and values serve that many consecutive rows (its beams or
        samples), which read them as one row with all their queries.
      key: ``[batch, heads, head_dim, kv_len]``.
      value: ``[batch, heads, head_dim, kv_len]``.
      bias: broadcastable to ``[rows, heads, q_len, kv_len]`` (per row) or to
        ``[batch, heads, q_len, kv_len]`` (per example).
      dtype: dtype of the output.
      float32_logits: compute the logits in float32.
      matmul_dtype: dtype the operands of both products are rounded to, or None.
      cpu_kernels: a decoding step on the CPU kernels: one float32 query per row then
        reads the cache through them.

    Returns:
      ``[rows, q_len, heads, head_dim]``.
    """
    rows, q_len, heads, depth = query.shape
    batch = key.shape[0]
    if rows % batch:
        raise ValueError(f"{rows} query rows cannot share keys and values of batch {batch}")
    query = query.reshape(batch, rows // batch * q_len, heads, depth)
    bias = _rows_as_queries(bias, rows, batch, q_len)
    if float32_logits:
        query, key = query.astype(jnp.float32), key.astype(jnp.float32)
    if cpu_kernels and q_len == 1 and _cache_kernels_take(query, key, value, dtype, matmul_dtype):
        # One kernel per layer reads the keys, then the values, of each (example, head) while
        # the scores of its rows stay in L1, and skips the masked tail of the cache.
        out = cache_attention(jnp.swapaxes(query, 1, 2), key, value, bias)  # bhqd
    else:
        # bqhd,bhdk->bhqk
        logits = dot_general(query, key, (((3,), (2,)), ((0, 2), (0, 1))), matmul_dtype)
        if bias is not None:
            logits = logits + bias.astype(logits.dtype)
        weights = jax.nn.softmax(logits.astype(jnp.float32)).astype(dtype)
        # bhqk,bhdk->bhqd
        out = dot_general(weights, value.astype(dtype), (((3,), (3,)), ((0, 1), (0, 1))), matmul_dtype)
    return jnp.swapaxes(out, 1, 2).reshape(rows, q_len, heads, depth)


def _rows_as_queries(bias: jax.Array | None, rows: int, batch: int, q_len: int) -> jax.Array | None:
    """A bias of ``rows`` rows of ``q_len`` queries as one of ``batch`` rows of ``rows / batch * q_len``."""
    if bias is None or rows == batch:
        return bias
    bias = bias.reshape((1,) * (4 - bias.ndim) + bias.shape)
    share = rows // batch
    if bias.shape[0] == rows:  # per row: each row's queries go into its example's row
        _, heads, _, length = bias.shape
        grouped = jnp.broadcast_to(bias, (batch * share, heads, q_len, length)).reshape(
            batch, share, heads, q_len, length
        )
        return jnp.moveaxis(grouped, 1, 2).reshape(batch, heads, share * q_len, length)
    # Per example (or for all): the same for each of an example's rows.
    return bias if bias.shape[2] == 1 else jnp.tile(bias, (1, 1, share, 1))


def _one_query_bias(bias: jax.Array | None, batch: int, heads: int, length: int) -> jax.Array | None:
    """A bias broadcastable to ``[batch, heads, 1, length]`` as the CPU kernels take it: ``[batch, heads, length]``."""
    return None if bias is None else jnp.broadcast_to(bias, (batch, heads, 1, length))[:, :, 0]


def _cache_kernels_take(
    query: jax.Array, key: jax.Array, value: jax.Array, dtype: Any, matmul_dtype: Any
) -> bool:
    """Whether the CPU cache kernels take these operands: float32 throughout."""
    return query.dtype == key.dtype == value.dtype == jnp.dtype(dtype) and float32_only(dtype, matmul_dtype)


def _mask_to_bias(mask: jax.Array, dtype: Any) -> jax.Array:
    return jax.lax.select(mask > 0, jnp.zeros(mask.shape, dtype), jnp.full(mask.shape, -1e10, dtype))


class MultiHeadDotProductAttention(nn.Module):
    """Bias-free multi-head attention with ``query``/``key``/``value``/``out`` kernels.

    Decoding keeps ``cached_key``/``cached_value`` as ``[batch, heads, head_dim,
    max_length]`` and ``cache_index`` (a scalar, or ``[batch]`` after a
    per-example prefill) in the ``cache`` collection.

    Attributes:
      num_heads: heads.
      head_dim: width of each head.
      dtype: computation dtype.
      matmul_dtype: dtype the operands of every product are rounded to
        (float32 accumulation), or None.
      dropout_rate: dropout on the attention weights.
      float32_logits: compute ``q.k`` in float32.
      joined_kernel: t5 layout (``[embed, heads*head_dim]``) versus the
        scalable-T5 layout (``[embed, heads, head_dim]``).
      step_kernels: how a decoding step multiplies and attends: ``"xla"``, ``"packed"``
        (the CPU kernels: packed projections, and one float32 query per row reading the
        cache through them) or ``"joined"`` (one row's query, key and value in one
        product). The model chooses it per decode call; other calls ignore it.
    """

    num_heads: int
    head_dim: int
    dtype: Any = jnp.float32
    matmul_dtype: Any = None
    dropout_rate: float = 0.0
    float32_logits: bool = False
    joined_kernel: bool = True
    step_kernels: str = "xla"

    @nn.compact
    def __call__(
        self,
        inputs_q: jax.Array,
        inputs_kv: jax.Array,
        mask: jax.Array | None = None,
        bias: jax.Array | RelativeBias | None = None,
        *,
        decode: bool = False,
        deterministic: bool = False,
        prefill: bool = False,
        prefill_lengths: jax.Array | None = None,
    ) -> jax.Array:
        """Attends ``inputs_q [batch, q_len, embed]`` to ``inputs_kv [batch, kv_len, embed]``.

        Args:
          inputs_q: queries' inputs.
          inputs_kv: keys' and values' inputs.
          mask: ``[batch, 1, q_len, kv_len]`` 0/1, or None.
          bias: ``[1 or batch, heads, q_len, kv_len]`` additive bias (relative
            positions), or a ``RelativeBias``; during single-step decoding it
            spans the whole cache and the row of the current position is taken.
          decode: single-step decoding against the cache (the first call, under
            ``init``, only creates the cache).
          deterministic: disables dropout.
          prefill: write keys/values of a whole prompt into the cache (its first
            ``q_len`` slots; a prompt may be shorter than the cache).
          prefill_lengths: ``[batch]`` positions filled per example; the cache
            index of each example starts there.

        Returns:
          ``[batch, q_len, embed]``.

        Raises:
          ValueError: for a decoding step whose query does not fit the cache.
        """
        if prefill and decode:
            raise ValueError(
                "prefill and decode cannot both be set: prefill the prompt first, then decode step by step"
            )
        # The cache exists once `init` (or a first call) has created it.
        cached = (prefill or decode) and self.has_variable("cache", "cached_key")
        if decode and cached:
            x = self._cached_step(inputs_q, inputs_kv, mask, bias, deterministic)
        elif prefill and cached:
            x = self._prefill(inputs_q, inputs_kv, mask, bias, prefill_lengths, deterministic)
        elif self._one_query_cross_attention(inputs_q, inputs_kv, deterministic, prefill or decode):
            x = self._cross_step(inputs_q, inputs_kv, mask, bias)
        else:
            x = self._full(inputs_q, inputs_kv, mask, bias, deterministic, create_cache=prefill or decode)
        return self._output(x, inputs_q.shape[-1])

    # ------------------------------------------------------------------ one method per mode
    def _full(
        self,
        inputs_q: jax.Array,
        inputs_kv: jax.Array,
        mask: jax.Array | None,
        bias: Any,
        deterministic: bool,
        create_cache: bool,
    ) -> jax.Array:
        """Training, scoring and a prompt pass without a cache (creating it under ``init``)."""
        query, key, value = self._qkv(inputs_q, inputs_kv)
        if create_cache:
            self._cache_variables(key, value)
        return self._attend(query, key, value, self._bias_terms(mask, bias), deterministic)

    def _prefill(
        self,
        inputs_q: jax.Array,
        inputs_kv: jax.Array,
        mask: jax.Array | None,
        bias: Any,
        prefill_lengths: jax.Array | None,
        deterministic: bool,
    ) -> jax.Array:
        """A prompt pass that also writes each example's keys and values into the cache."""
        query, key, value = self._qkv(inputs_q, inputs_kv)
        cached_key, cached_value, cache_index = self._cache_variables(key, value)
        length = cached_key.value.shape[-1]
        span = query.shape[1]
        if span > length:
            raise ValueError(f"prefill of {span} positions does not fit the cache length {length}")
        if prefill_lengths is None:
            assert mask is not None, "prefill without prefill_lengths needs a mask"
            prefill_lengths = jnp.sum(mask[:, 0, 0, :], axis=-1)
        lengths = jnp.asarray(prefill_lengths, jnp.int32).reshape(-1)
        keep = (jnp.arange(span)[None, :] < lengths[:, None])[:, None, None, :]
        # A prompt shorter than the cache fills its first `span` slots; the rest stay zero.
        rest = ((0, 0),) * 3 + ((0, length - span),)
        cached_key.value = jnp.pad(jnp.moveaxis(key, -3, -1) * keep.astype(key.dtype), rest)
        cached_value.value = jnp.pad(jnp.moveaxis(value, -3, -1) * keep.astype(value.dtype), rest)
        cache_index.value = lengths
        return self._attend(query, key, value, self._bias_terms(mask, bias), deterministic)

    def _cached_step(
        self,
        inputs_q: jax.Array,
        inputs_kv: jax.Array,
        mask: jax.Array | None,
        bias: Any,
        deterministic: bool,
    ) -> jax.Array:
        """One decoding position per row: write its key and value, attend to the cache."""
        query, key, value = self._qkv(inputs_q, inputs_kv, step=True)
        cached_key, cached_value, cache_index = self._cache_variables(key, value)
        batch, heads, depth, length = cached_key.value.shape
        expected = (batch, 1, heads, depth)
        if query.shape != expected:
            raise ValueError(
                f"autoregressive cache holds batch={batch}, heads={heads}, head_dim={depth}, "
                f"length={length}: expected a decoding-step query of shape {expected}, got {query.shape}"
            )
        cur = jnp.reshape(cache_index.value, (-1,))
        cache_index.value = cache_index.value + 1
        visible = jnp.arange(length)[None, None, None, :] <= cur[:, None, None, None]
        mask = combine_masks(mask, jnp.broadcast_to(visible, (batch, 1, 1, length)))
        attention_bias = self._attention_bias(mask, _bias_rows(bias, cur))
        dropout = not deterministic and self.dropout_rate > 0.0
        if (
            self.step_kernels == "packed"
            and not dropout
            and _cache_kernels_take(
                query, cached_key.value, cached_value.value, self.dtype, self.matmul_dtype
            )
        ):
            # One kernel writes the step's key and value in place and attends.
            row_bias = _one_query_bias(attention_bias, batch, heads, length)
            out, cached_key.value, cached_value.value = cache_step(
                query[:, 0], key[:, 0], value[:, 0], cached_key.value, cached_value.value, cur, row_bias
            )
            return out[:, None]
        # Writing one slot in place (not a one-hot sum over the whole cache) and attending
        # in the cache layout keep a step's memory traffic to one read of the cache.
        full_key = _write_slot(cached_key.value, key, cur)
        full_value = _write_slot(cached_value.value, value, cur)
        cached_key.value = full_key
        cached_value.value = full_value
        if dropout:
            keys, values = jnp.moveaxis(full_key, -1, -3), jnp.moveaxis(full_value, -1, -3)
            return self._attend(query, keys, values, attention_bias, deterministic)
        return self._attend_to_cache(query, full_key, full_value, attention_bias)

    def _cross_step(
        self, inputs_q: jax.Array, inputs_kv: jax.Array, mask: jax.Array | None, bias: Any
    ) -> jax.Array:
        """One query per row attending outside the cache: a decoding step's cross-attention.

        Its keys and values are the same at every step; projected straight into the cache
        layout, they need no per-step transpose (XLA would re-lay them out inside the loop).
        ``inputs_kv`` may hold one row per example for several consecutive query rows (its
        beams or samples): each example's keys and values are then made and read once.
        """
        query, key, value = self._qkv(inputs_q, inputs_kv, cache_layout=True)
        return self._attend_to_cache(query, key, value, self._attention_bias(mask, bias))

    # ------------------------------------------------------------------ shared pieces
    def _one_query_cross_attention(
        self, inputs_q: jax.Array, inputs_kv: jax.Array, deterministic: bool, cache: bool
    ) -> bool:
        return (
            inputs_q.shape[-2] == 1
            and inputs_kv.ndim == 3
            and inputs_q.shape[0] % inputs_kv.shape[0] == 0
            and not cache
            and (deterministic or self.dropout_rate == 0.0)
        )

    def _projection(
        self, name: str, x: jax.Array, *, query: bool = False, cache_layout: bool = False
    ) -> jax.Array:
        init = nd_init(1.0, "fan_in", "normal")
        depth_scaling = jnp.sqrt(self.head_dim).astype(jnp.float32)

        def query_init(*args: Any) -> jax.Array:
            return init(*args) / depth_scaling  # T5's 1/sqrt(head_dim), folded into the query

        y = DenseGeneral(
            features=(self.num_heads, self.head_dim),
            axis=-1,
            dtype=self.dtype,
            matmul_dtype=self.matmul_dtype,
            kernel_init=query_init if query else init,
            kernel_axes=("embed", "joined_kv") if self.joined_kernel else ("embed", "heads", "kv"),
            joined_kernel=self.joined_kernel,
            step_kernels=self.step_kernels,
            name=name,
        )(x, features_before_length=cache_layout)
        if cache_layout:
            return constrain(y, ("batch", "heads", "kv", "length"))
        return constrain(y, ("batch", "length", "heads", "kv"))

    def _qkv(
        self, inputs_q: jax.Array, inputs_kv: jax.Array, *, step: bool = False, cache_layout: bool = False
    ) -> tuple[jax.Array, jax.Array, jax.Array]:
        """Query ``[batch, q_len, heads, head_dim]``, key and value (``cache_layout``: ``[batch, heads, head_dim, kv_len]``)."""
        products = None
        if step and self.joined_kernel and inputs_q is inputs_kv:
            products = self._step_qkv(inputs_q)
        if products is not None:
            query, key, value = (
                constrain(
                    p.reshape(*p.shape[:-1], self.num_heads, self.head_dim),
                    ("batch", "length", "heads", "kv"),
                )
                for p in products
            )
            return query, key, value
        return (
            self._projection("query", inputs_q, query=True),
            self._projection("key", inputs_kv, cache_layout=cache_layout),
            self._projection("value", inputs_kv, cache_layout=cache_layout),
        )

    def _step_qkv(self, inputs: jax.Array) -> list[jax.Array] | None:
        """A decoding step's query, key and value ``[..., heads * head_dim]`` as one call, or None."""
        if self.step_kernels == "joined" and (joined := joined_kernel(self, "qkv", inputs)) is not None:
            # One decoding row: query, key and value in one product (see `join_decode_kernels`).
            qkv = dense(jnp.asarray(inputs, self.dtype), joined.astype(self.dtype), self.matmul_dtype)
            return jnp.split(qkv, 3, axis=-1)
        if self.step_kernels == "packed" and float32_only(self.dtype, self.matmul_dtype):
            packed = packed_kernels(self, ("query", "key", "value"), inputs)
            if packed is not None:
                features = self.num_heads * self.head_dim
                return packed_matmuls(inputs, [(kernel, features) for kernel in packed])
        return None

    def _cache_variables(self, key: jax.Array, value: jax.Array) -> tuple[Any, Any, Any]:
        """``cached_key``, ``cached_value`` and ``cache_index``, created for ``key``'s shape if new."""
        shape = (*key.shape[:-3], key.shape[-2], key.shape[-1], key.shape[-3])
        return (
            self.variable("cache", "cached_key", jnp.zeros, shape, key.dtype),
            self.variable("cache", "cached_value", jnp.zeros, shape, value.dtype),
            self.variable("cache", "cache_index", lambda: jnp.array(0, dtype=jnp.int32)),
        )

    def _attention_bias(self, mask: jax.Array | None, bias: Any) -> jax.Array | None:
        return _summed(self._bias_terms(mask, bias))

    def _bias_terms(self, mask: jax.Array | None, bias: Any) -> tuple[jax.Array, ...]:
        """The mask's bias and the (relative-position) bias, in the mask bias's dtype."""
        if isinstance(bias, RelativeBias):
            bias = bias.full()
        if mask is None:
            return () if bias is None else (bias,)
        attention_bias = _mask_to_bias(mask, self.dtype)
        return (attention_bias,) if bias is None else (attention_bias, bias.astype(attention_bias.dtype))

    def _attend(
        self, query: jax.Array, key: jax.Array, value: jax.Array, bias: Any, deterministic: bool
    ) -> jax.Array:
        dropout_rng = None
        if not deterministic and self.dropout_rate > 0.0:
            dropout_rng = self.make_rng("dropout")
        return dot_product_attention(
            query,
            key,
            value,
            bias=bias,
            dropout_rng=dropout_rng,
            dropout_rate=self.dropout_rate,
            deterministic=deterministic,
            dtype=self.dtype,
            float32_logits=self.float32_logits,
            matmul_dtype=self.matmul_dtype,
        )

    def _attend_to_cache(
        self, query: jax.Array, key: jax.Array, value: jax.Array, bias: jax.Array | None
    ) -> jax.Array:
        return _attend_to_cache(
            query,
            key,
            value,
            bias,
            self.dtype,
            self.float32_logits,
            self.matmul_dtype,
            cpu_kernels=self.step_kernels == "packed",
        )

    def _output(self, x: jax.Array, features: int) -> jax.Array:
        return DenseGeneral(
            features=features,
            axis=(-2, -1),
            dtype=self.dtype,
            matmul_dtype=self.matmul_dtype,
            kernel_init=nd_init(1.0, "fan_in", "normal"),
            kernel_axes=("joined_kv", "embed") if self.joined_kernel else ("heads", "kv", "embed"),
            joined_kernel=self.joined_kernel,
            step_kernels=self.step_kernels,
            name="out",
        )(x)


def _bias_rows(bias: Any, cur: jax.Array) -> Any:
    """Row ``cur`` (``[1]`` or ``[batch]``) of a whole-cache bias: ``[1 or batch, heads, 1, length]``."""
    if isinstance(bias, RelativeBias):
        return bias.rows(cur)
    if bias is None:
        return None
    rows = jnp.take(bias[0], cur, axis=1)  # [heads, 1 or batch, length]
    return jnp.transpose(rows, (1, 0, 2))[:, :, None, :]
