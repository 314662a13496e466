"""dot_product_attention's backward pass recomputes the weights: same values and gradients as
autodiff of the plain formula, in less memory."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t5x.models import DecoderOnlyModel, _network, dot_product_attention, preset


def plain_attention(query, key, value, bias, dtype=jnp.float32):
    """The formula, differentiated by JAX: the reference."""
    logits = jnp.einsum("bqhd,bkhd->bhqk", query, key)
    if bias is not None:
        logits = logits + bias.astype(logits.dtype)
    weights = jax.nn.softmax(logits.astype(jnp.float32)).astype(dtype)
    return jnp.einsum("bhqk,bkhd->bqhd", weights, value.astype(dtype))


def _inputs(q_len, kv_len, bias_shape, dtype=jnp.float32, batch=2, heads=3, head_dim=8):
    keys = jax.random.split(jax.random.PRNGKey(0), 5)
    query = jax.random.normal(keys[0], (batch, q_len, heads, head_dim), dtype)
    key = jax.random.normal(keys[1], (batch, kv_len, heads, head_dim), dtype)
    value = jax.random.normal(keys[2], (batch, kv_len, heads, head_dim), dtype)
    bias = None if bias_shape is None else jax.random.normal(keys[3], bias_shape, dtype)
    cotangent = jax.random.normal(keys[4], (batch, q_len, heads, head_dim), dtype)
    return query, key, value, bias, cotangent


def _values_and_grads(fn, query, key, value, bias, cotangent):
    out, vjp = jax.vjp(fn, query, key, value, bias)
    return out, vjp(cotangent)


@pytest.mark.parametrize(
    "q_len, kv_len, bias_shape",
    [
        (7, 7, None),
        (7, 7, (1, 3, 7, 7)),  # a relative position bias, shared by the batch
        (7, 7, (2, 1, 7, 7)),  # a mask, shared by the heads
        (7, 7, (2, 3, 7, 7)),
        (5, 9, (2, 1, 1, 9)),  # cross attention with a padding mask
        (7, 7, (7, 7)),  # fewer axes than the logits
    ],
)
def test_values_and_gradients_match_autodiff(q_len, kv_len, bias_shape):
    args = _inputs(q_len, kv_len, bias_shape)
    ours = _values_and_grads(dot_product_attention, *args)
    reference = _values_and_grads(plain_attention, *args)
    np.testing.assert_array_equal(ours[0], dot_product_attention(*args[:4]))
    np.testing.assert_allclose(ours[0], reference[0], rtol=1e-5, atol=1e-6)
    for name, got, want in zip(("query", "key", "value", "bias"), ours[1], reference[1], strict=True):
        if want is None:
            assert got is None
            continue
        assert got.shape == want.shape and got.dtype == want.dtype, name
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=name)


def test_bfloat16_activations_with_float32_logits():
    query, key, value, bias, cotangent = _inputs(6, 6, (2, 1, 6, 6), jnp.bfloat16)

    def ours(q, k, v, b):
        return dot_product_attention(q, k, v, b, dtype=jnp.bfloat16, float32_logits=True)

    def reference(q, k, v, b):
        return plain_attention(q.astype(jnp.float32), k.astype(jnp.float32), v, b, jnp.bfloat16)

    got = _values_and_grads(ours, query, key, value, bias, cotangent)
    want = _values_and_grads(reference, query, key, value, bias, cotangent)
    np.testing.assert_array_equal(got[0], want[0])
    for g, w in zip(got[1], want[1], strict=True):
        assert g.dtype == w.dtype == jnp.bfloat16
        np.testing.assert_allclose(np.float32(g), np.float32(w), rtol=2e-2, atol=2e-2)


def test_the_backward_pass_keeps_no_weights():
    """Each attention layer of a stack adds its weights to the plain formula's memory, not to ours."""
    query, key, value, bias, _ = _inputs(256, 256, (2, 1, 256, 256), batch=2, heads=4)
    weights_bytes = 2 * 4 * 256 * 256 * 4

    def temp_bytes(attend, layers):
        def loss(q):
            x = q
            for _ in range(layers):
                x = attend(x, key, value, bias)
            return jnp.sum(x)

        compiled = jax.jit(jax.grad(loss)).lower(query).compile()
        return compiled.memory_analysis().temp_size_in_bytes

    plain = temp_bytes(plain_attention, 8) - temp_bytes(plain_attention, 2)
    ours = temp_bytes(dot_product_attention, 8) - temp_bytes(dot_product_attention, 2)
    assert plain >= 6 * weights_bytes, plain  # six layers more keep six sets of weights
    assert ours < 2 * weights_bytes, ours  # not per layer: at most one more at the peak


@pytest.mark.parametrize(
    "shapes",
    [((2, 1, 7, 7), (1, 3, 7, 7)), ((2, 1, 1, 7), (1, 3, 7, 7), (7, 7))],
    ids=["mask+relpos", "three"],
)
def test_bias_terms_match_their_sum(shapes):
    """Bias terms given apiece: the values of their sum, and each term's own gradient."""
    query, key, value, _, cotangent = _inputs(7, 7, None)
    terms = tuple(jax.random.normal(jax.random.PRNGKey(i), s) for i, s in enumerate(shapes))
    out, vjp = jax.vjp(lambda *t: dot_product_attention(query, key, value, t), *terms)
    want, want_vjp = jax.vjp(lambda *t: plain_attention(query, key, value, sum(t)), *terms)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)
    for term, got, expected in zip(terms, vjp(cotangent), want_vjp(cotangent), strict=True):
        assert got.shape == term.shape
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


def test_a_stack_sums_the_bias_gradient_layer_by_layer(monkeypatch):
    """Layers sharing one relative-position bias add no per-layer ``[batch, heads, q, k]`` gradient."""
    batch, heads, length = 2, 4, 256
    bias_bytes = batch * heads * length * length * 4
    tokens = np.random.default_rng(0).integers(2, 50, (batch, length)).astype(np.int32)
    features = {"decoder_input_tokens": tokens, "decoder_target_tokens": tokens,
                "decoder_loss_weights": np.ones(tokens.shape, np.float32)}  # fmt: skip

    def growth():
        """Temporaries of a train step's gradient, 8 layers against 2."""
        sizes = []
        for layers in (2, 8):
            cfg = preset("decoder_tiny", vocab_size=50, num_layers=layers, num_heads=heads, dropout_rate=0.0)
            model = DecoderOnlyModel(cfg)
            params = model.get_initial_variables(
                jax.random.PRNGKey(0), {k: v.shape for k, v in features.items()}
            )
            grad = jax.jit(jax.grad(lambda p, model=model: model.loss_fn(p, features, None)[0]))
            sizes.append(grad.lower(params["params"]).compile().memory_analysis().temp_size_in_bytes)
        return sizes[1] - sizes[0]

    ours = growth()
    monkeypatch.setattr(_network, "_sum_gradients_per_layer", lambda x, args: (x, args))
    untied = growth()
    assert untied >= 5 * bias_bytes, untied  # six layers more keep (about) six bias gradients
    assert ours < 2 * bias_bytes, ours
