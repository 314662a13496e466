"""Layer-level behaviour: relative-position buckets, masks, norm, attention init."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t5x.models import (
    DenseGeneral,
    LayerNorm,
    MultiHeadDotProductAttention,
    RelativePositionBiases,
    make_causal_mask,
    make_decoder_mask,
    relative_position_bucket,
)

# (memory_position - query_position, bucket), worked out by hand from T5's formula:
# bidirectional: 16 buckets per direction, 8 exact, log-spaced up to distance 128.
BIDIRECTIONAL = [
    (0, 0), (-1, 1), (-7, 7), (-8, 8), (-11, 8), (-12, 9), (-16, 10), (-32, 12),
    (-64, 14), (-127, 15), (-128, 15), (-5000, 15),
    (1, 17), (7, 23), (8, 24), (16, 26), (32, 28), (127, 31), (200, 31),
]  # fmt: skip
# causal: 32 buckets for the past, 16 exact; every future key is bucket 0.
CAUSAL = [
    (0, 0), (5, 0), (300, 0), (-1, 1), (-15, 15), (-16, 16), (-20, 17), (-32, 21),
    (-64, 26), (-127, 31), (-128, 31), (-1000, 31),
]  # fmt: skip


@pytest.mark.parametrize(("bidirectional", "table"), [(True, BIDIRECTIONAL), (False, CAUSAL)])
def test_relative_position_buckets_match_hand_computed_table(bidirectional, table):
    rel = np.array([r for r, _ in table])
    want = np.array([b for _, b in table])
    got = relative_position_bucket(rel, bidirectional=bidirectional, num_buckets=32, max_distance=128)
    np.testing.assert_array_equal(got, want)


def test_relative_position_bias_gathers_table_by_bucket():
    module = RelativePositionBiases(num_buckets=32, max_distance=128, num_heads=2)
    variables = module.init(jax.random.PRNGKey(0), 5, 5, True)
    table = np.asarray(variables["params"]["rel_embedding"])
    assert table.shape == (2, 32)
    bias = np.asarray(module.apply(variables, 5, 5, True))
    assert bias.shape == (1, 2, 5, 5)
    # Query 3 attending to key 0: relative position -3 -> bucket 3; key 4: +1 -> bucket 17.
    np.testing.assert_array_equal(bias[0, :, 3, 0], table[:, 3])
    np.testing.assert_array_equal(bias[0, :, 3, 4], table[:, 17])
    causal = np.asarray(module.apply(variables, 5, 5, False))
    np.testing.assert_array_equal(causal[0, :, 1, 4], table[:, 0])


def test_relative_bias_rows_on_demand_are_rows_of_the_full_bias():
    module = RelativePositionBiases(num_buckets=8, max_distance=16, num_heads=3)
    variables = module.init(jax.random.PRNGKey(0), 6, 6, False)
    full = np.asarray(module.apply(variables, 6, 6, False))
    lazy = module.apply(variables, 6, 6, False, method="lazy")
    np.testing.assert_array_equal(np.asarray(lazy.full()), full)
    # One row per example; a position past the end reads the last row.
    rows = np.asarray(lazy.rows(jnp.array([4, 0, 9])))
    assert rows.shape == (3, 3, 1, 6)
    for i, position in enumerate([4, 0, 5]):
        np.testing.assert_array_equal(rows[i, :, 0], full[0, :, position])


def test_packed_prefix_lm_decoder_mask():
    # Two packed prefix-LM examples: inputs [6, 7] -> 8 and [3, 4] -> 5, then padding.
    targets = np.array([[6, 7, 8, 3, 4, 5, 0]])
    segments = np.array([[1, 1, 1, 2, 2, 2, 0]])
    causal_attention = np.array([[1, 1, 0, 1, 1, 0, 0]])
    want = np.array(
        [
            [1, 1, 0, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0, 0],
            [1, 1, 1, 0, 0, 0, 0],
            [0, 0, 0, 1, 1, 0, 0],
            [0, 0, 0, 1, 1, 0, 0],
            [0, 0, 0, 1, 1, 1, 0],
            [0, 0, 0, 0, 0, 0, 0],
        ]
    )
    mask = make_decoder_mask(targets, jnp.float32, causal_attention, segments)
    assert mask.shape == (1, 1, 7, 7)
    np.testing.assert_array_equal(np.asarray(mask)[0, 0], want)


def test_causal_and_padding_mask():
    targets = np.array([[4, 5, 6, 0]])
    mask = np.asarray(make_decoder_mask(targets, jnp.float32))[0, 0]
    want = np.tril(np.ones((4, 4)))
    want[3, :] = 0
    want[:, 3] = 0
    np.testing.assert_array_equal(mask, want)
    np.testing.assert_array_equal(np.asarray(make_causal_mask(targets))[0, 0], np.tril(np.ones((4, 4))))


def test_layer_norm_is_rms_norm_in_float32():
    x = jnp.asarray(np.random.default_rng(0).normal(size=(2, 3, 8)), jnp.bfloat16)
    module = LayerNorm(dtype=jnp.bfloat16)
    variables = module.init(jax.random.PRNGKey(0), x)
    assert set(variables["params"]) == {"scale"}
    out = module.apply({"params": {"scale": jnp.full((8,), 2.0)}}, x)
    assert out.dtype == jnp.bfloat16
    x32 = np.asarray(x, np.float32)
    want = 2.0 * x32 / np.sqrt(np.mean(x32**2, axis=-1, keepdims=True) + 1e-6)
    np.testing.assert_allclose(np.asarray(out, np.float32), want, rtol=1e-2)


def test_query_init_folds_in_one_over_sqrt_head_dim():
    module = MultiHeadDotProductAttention(num_heads=4, head_dim=64)
    x = jnp.ones((1, 2, 256))
    params = module.init(jax.random.PRNGKey(0), x, x)["params"]
    q_std = float(np.std(params["query"]["kernel"]))
    k_std = float(np.std(params["key"]["kernel"]))
    # key ~ N(0, 1/fan_in); query additionally divided by sqrt(64) = 8.
    assert params["query"]["kernel"].shape == (256, 256)
    assert k_std == pytest.approx(1 / 16, rel=0.05)
    assert q_std == pytest.approx(1 / 16 / 8, rel=0.05)


def test_decode_step_rejects_query_that_does_not_fit_cache():
    module = MultiHeadDotProductAttention(num_heads=2, head_dim=4)
    x = jnp.ones((2, 6, 8))
    variables = module.init(jax.random.PRNGKey(0), x, x, decode=True)
    with pytest.raises(ValueError, match=r"expected a decoding-step query of shape \(2, 1, 2, 4\)"):
        module.apply(variables, x, x, decode=True, mutable=["cache"])


@pytest.mark.parametrize("joined_kernel", [True, False])
def test_one_query_attention_uses_cache_layout_keys_with_same_result(joined_kernel):
    # A single query (a decoding step's cross-attention) takes the keys/values projected
    # straight into [batch, heads, head_dim, length]; the result must not change.
    module = MultiHeadDotProductAttention(num_heads=2, head_dim=4, joined_kernel=joined_kernel)
    q = jax.random.normal(jax.random.PRNGKey(1), (3, 1, 8))
    kv = jax.random.normal(jax.random.PRNGKey(2), (3, 5, 8))
    mask = jnp.asarray(
        np.arange(5)[None, None, None, :] < np.array([5, 3, 1])[:, None, None, None], jnp.float32
    )
    params = module.init(jax.random.PRNGKey(0), q, kv, mask)["params"]
    one = module.apply({"params": params}, q, kv, mask, deterministic=True)
    # The same query repeated twice goes through the ordinary [batch, length, heads, kv] path.
    two = module.apply(
        {"params": params}, jnp.concatenate([q, q], 1), kv, jnp.repeat(mask, 2, 2), deterministic=True
    )
    assert one.shape == (3, 1, 8)
    np.testing.assert_allclose(one[:, 0], two[:, 0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(one[:, 0], two[:, 1], rtol=1e-5, atol=1e-6)


def test_dense_features_before_length_is_the_transposed_product():
    dense = DenseGeneral(features=(2, 3), joined_kernel=True)
    x = jax.random.normal(jax.random.PRNGKey(0), (4, 5, 6))
    params = dense.init(jax.random.PRNGKey(1), x)
    plain = dense.apply(params, x)  # [4, 5, 2, 3]
    moved = dense.apply(params, x, features_before_length=True)  # [4, 2, 3, 5]
    np.testing.assert_allclose(moved, jnp.moveaxis(plain, 1, -1), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match=r"features_before_length needs \[batch, length, in\]"):
        dense.apply(params, x[0], features_before_length=True)
