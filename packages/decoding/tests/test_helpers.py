"""Beam layout helpers, cache mapping and the sharding-friendly top-k."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t5x.decoding import (
    DecodingState,
    _select,
    add_beam_dim,
    cache_gather_beams,
    cache_map,
    flat_batch_beam_expand,
    flatten_beam_dim,
    gather_beams,
    gather_topk_beams,
    temperature_sample,
    unflatten_beam_dim,
)
from t5x.decoding._select import top_k


def test_expand_flatten_unflatten_round_trip():
    x = jnp.arange(6).reshape(3, 2)
    expanded = flat_batch_beam_expand(x, 2)
    np.testing.assert_array_equal(expanded, np.repeat(np.asarray(x), 2, axis=0))
    assert add_beam_dim(x, 4).shape == (3, 4, 2)
    np.testing.assert_array_equal(unflatten_beam_dim(expanded, 3, 2)[:, 1], x)
    np.testing.assert_array_equal(flatten_beam_dim(unflatten_beam_dim(expanded, 3, 2)), expanded)
    scanned = jnp.arange(12).reshape(2, 3, 2)  # [layers, batch, d]
    out = flat_batch_beam_expand(scanned, 2, offset=1)
    np.testing.assert_array_equal(out, np.repeat(np.asarray(scanned), 2, axis=1))
    with pytest.raises(ValueError, match=r"batch_size \* beam_size = 4 \* 2 = 8"):
        unflatten_beam_dim(expanded, 4, 2)


def test_cache_map_skips_shared_leaves():
    cache = {
        "layer": {
            "cached_key": jnp.ones((2, 3)),
            "cache_index": jnp.array([1, 2]),
            "cached_bias": jnp.ones((1, 4)),
        },
        "position_embedder_index": jnp.array([5, 5]),
        "scalar": jnp.zeros(()),
    }
    out = cache_map(lambda x: x * 10, cache)
    np.testing.assert_array_equal(out["layer"]["cached_key"], 10)
    np.testing.assert_array_equal(out["layer"]["cache_index"], [1, 2])
    np.testing.assert_array_equal(out["layer"]["cached_bias"], 1)
    np.testing.assert_array_equal(out["position_embedder_index"], [5, 5])
    assert float(out["scalar"]) == 0
    with_index = cache_map(lambda x: x * 10, cache, apply_to_index=True)
    np.testing.assert_array_equal(with_index["layer"]["cache_index"], [10, 20])


@pytest.mark.parametrize("one_hot", [True, False])
def test_gather_beams(one_hot):
    x = jnp.arange(2 * 3 * 4, dtype=jnp.float32).reshape(2, 3, 4)
    flags = x[..., 0] > 5
    idx = jnp.array([[2, 2, 0, 1], [1, 0, 0, 2]])
    out, out_flags = gather_beams([x, flags], idx, 2, 3, 4, one_hot=one_hot)
    expected = np.stack([np.asarray(x)[b][np.asarray(idx)[b]] for b in range(2)])
    np.testing.assert_array_equal(out, expected)
    np.testing.assert_array_equal(out_flags, expected[..., 0] > 5)
    assert out_flags.dtype == jnp.bool_
    scanned = {"k": jnp.stack([x, -x])}  # [layers, batch, beam, d]
    gathered = cache_gather_beams(scanned, idx[:, :3], 2, 3, 3, one_hot=one_hot, offset=1)["k"]
    np.testing.assert_array_equal(gathered[1], -expected[:, :3])
    with pytest.raises(ValueError, match=r"beam_indices shape \(2, 4\) should be"):
        gather_beams(x, idx, 2, 3, 3)


def test_gather_topk_beams_orders_worst_to_best():
    scores = jnp.array([[0.1, 0.9, 0.5, 0.3]])
    seqs = jnp.arange(4)[None, :, None]
    out = gather_topk_beams(seqs, scores, 1, 3)
    assert out[0, :, 0].tolist() == [3, 2, 1]


@pytest.mark.parametrize("native", [True, False], ids=["lax-top-k", "passes"])
@pytest.mark.parametrize(("n", "k"), [(40, 5), (40, 30), (9000, 5)])
def test_top_k_matches_lax_top_k_including_ties(n, k, native, monkeypatch):
    # One CPU device takes lax.top_k; the sort and argmax passes serve partitioned operands.
    monkeypatch.setattr(_select, "native_top_k", lambda x: native)
    rng = np.random.default_rng(n + k)
    # Rounding makes many ties; + 0.0 drops signed zeros, which lax.top_k orders -0 < +0.
    x = np.round(rng.normal(size=(3, n)), 1).astype(np.float32) + np.float32(0.0)
    x[0, :3] = -np.inf
    values, indices = jax.jit(lambda x: top_k(x, k))(jnp.asarray(x))  # a fresh trace per path
    ref_values, ref_indices = jax.lax.top_k(jnp.asarray(x), k)
    np.testing.assert_array_equal(values, ref_values)
    np.testing.assert_array_equal(indices, ref_indices)


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("n", [384, 1000])  # block-wise (a multiple of 128), and jnp.argmax's
def test_argmax_matches_jnp_argmax_with_ties_nans_and_infinities(n, native, monkeypatch):
    monkeypatch.setattr(_select, "native_top_k", lambda x: native)
    rng = np.random.default_rng(3)
    x = np.round(rng.standard_normal((2, 5, n)), 1).astype(np.float32)  # many ties
    x[0, 1, [7, 300, 301]] = x[0, 1].max() + 1  # ties for the top in two blocks
    x[0, 2, [200, 40]] = np.nan  # the first NaN wins, in a later block than another maximum
    x[0, 2, 3] = np.inf
    x[0, 3] = -np.inf
    x[1, 0, -1] = np.inf  # the very last entry
    x[1, 1] = 0.0
    x[1, 1, 129] = -0.0
    got = jax.jit(_select.argmax)(jnp.asarray(x))  # a fresh trace per path
    assert got.dtype == jnp.int32
    np.testing.assert_array_equal(got, np.asarray(jnp.argmax(jnp.asarray(x), axis=-1)))
    assert got[0, 1] == 7 and got[0, 2] == 40 and got[0, 3] == 0 and got[1, 0] == n - 1


def test_frozen_dict_cache_is_kept_frozen():
    flax_core = pytest.importorskip("flax.core")
    cache = flax_core.freeze(
        {"decoder": {"cached_key": jnp.zeros((2, 3)), "cache_index": jnp.zeros((), jnp.int32)}}
    )
    expanded = cache_map(lambda x: flat_batch_beam_expand(x, 2), cache)
    assert isinstance(expanded, flax_core.FrozenDict)
    assert expanded["decoder"]["cached_key"].shape == (4, 3)

    def model(state: DecodingState):
        # Like many flax models: hands back a plain dict for a frozen cache.
        inner = flax_core.unfreeze(state.cache)
        inner["decoder"]["cache_index"] = inner["decoder"]["cache_index"] + 1
        return jnp.zeros((state.cur_token.shape[0], 5)), inner

    seqs, _ = temperature_sample(
        jnp.zeros((2, 3), jnp.int32), cache, model, 1, num_decodes=2, temperature=0.0
    )
    assert seqs.shape == (2, 2, 3)


def test_cache_structure_mismatch_is_reported():
    def model(state):
        return jnp.zeros((state.cur_token.shape[0], 5)), {"other": jnp.zeros(2)}

    with pytest.raises(ValueError, match="cache whose structure differs"):
        temperature_sample(jnp.zeros((2, 3), jnp.int32), {"cache": jnp.zeros(2)}, model, 1)


def test_cache_returned_in_another_container_type_is_accepted():
    # What flax users hit without flax in the picture: same leaves, different containers.
    def model(state: DecodingState):
        first, second = state.cache
        return jnp.zeros((state.cur_token.shape[0], 5)), [first + 1, second]

    seqs, _ = temperature_sample(
        jnp.zeros((2, 3), jnp.int32),
        (jnp.zeros((2,)), jnp.ones((2, 4))),
        model,
        1,
        num_decodes=2,
        temperature=0.0,
    )
    assert seqs.shape == (2, 2, 3)
