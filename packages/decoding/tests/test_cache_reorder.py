"""Beam search's reorder of only the written span of attention caches against a whole gather."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t5x.decoding import _beam_search, _reorder, beam_search
from t5x.decoding._beams import select_beams

from .toy_models import EOS

VOCAB, HEADS, DEPTH, LENGTH, LAYERS = 11, 2, 3, 7, 2


def _attention_model(offset: int, seed: int = 0):
    """Two attention layers over ``cached_key`` / ``cached_value`` in the t5x layout.

    Each step writes the fed token's key and value at ``cache_index`` and attends to every
    position up to it, so logits depend on the whole history each beam has in its cache.
    With ``offset`` 1 the layers are stacked in front (scanned layers).
    """
    rng = np.random.default_rng(seed)
    embed = jnp.asarray(rng.normal(size=(VOCAB, 3, HEADS, DEPTH)), jnp.float32)
    out = jnp.asarray(rng.normal(size=(LAYERS, HEADS * DEPTH, VOCAB)) * 3.0, jnp.float32)

    def layer(cache: dict, token: jax.Array, weights: jax.Array) -> tuple[jax.Array, dict]:
        index = jnp.broadcast_to(cache["cache_index"], token.shape)
        query, key, value = (embed[token, i] for i in range(3))  # [rows, heads, depth]
        at = (jnp.arange(LENGTH)[None, :] == index[:, None])[:, None, None, :]
        keys = jnp.where(at, key[..., None], cache["cached_key"])
        values = jnp.where(at, value[..., None], cache["cached_value"])
        scores = jnp.einsum("rhd,rhdl->rhl", query, keys)
        scores = jnp.where(jnp.arange(LENGTH)[None, None, :] <= index[:, None, None], scores, -1e9)
        mixed = jnp.einsum("rhl,rhdl->rhd", jax.nn.softmax(scores, axis=-1), values)
        new = {"cached_key": keys, "cached_value": values, "cache_index": cache["cache_index"] + 1}
        return mixed.reshape(token.shape[0], -1) @ weights, new

    def tokens_to_logits(state):
        token = state.cur_token[:, 0]
        if offset:
            logits, new = jax.vmap(lambda c, w: layer(c, token, w))(state.cache["decoder"], out)
            return jnp.sum(logits, axis=0), {"decoder": new}
        logits, new_cache = 0.0, {}
        for i in range(LAYERS):
            part, new_cache[f"layer_{i}"] = layer(state.cache[f"layer_{i}"], token, out[i])
            logits = logits + part
        return logits, new_cache

    return tokens_to_logits


def _cache(batch: int, offset: int, initial_index, seed: int = 1) -> dict:
    rng = np.random.default_rng(seed)

    def one_layer() -> dict:
        # Random everywhere, the unwritten tail too: every position must end up where a
        # whole gather puts it.
        keys = rng.normal(size=(2, batch, HEADS, DEPTH, LENGTH)).astype(np.float32)
        if initial_index is None:
            index = jnp.zeros((), jnp.int32)
        else:
            index = jnp.asarray(initial_index, jnp.int32)
        return {
            "cached_key": jnp.asarray(keys[0]),
            "cached_value": jnp.asarray(keys[1]),
            "cache_index": index,
        }

    layers = [one_layer() for _ in range(LAYERS)]
    if offset:
        return {"decoder": jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *layers)}
    return {f"layer_{i}": layer for i, layer in enumerate(layers)}


def _decode(offset, batch, inputs, initial_index, beams, written_span, monkeypatch):
    monkeypatch.setattr(_beam_search, "_REORDER_WRITTEN_SPAN", written_span)
    fn = _attention_model(offset)
    cache = _cache(batch, offset, initial_index)
    kwargs = {} if initial_index is None else {"initial_index": jnp.asarray(initial_index, jnp.int32)}
    seqs, scores = jax.jit(
        lambda i, c: beam_search(i, c, fn, EOS, num_decodes=beams, alpha=0.6, cache_offset=offset, **kwargs)
    )(jnp.asarray(inputs, jnp.int32), cache)
    return np.asarray(seqs), np.asarray(scores)


@pytest.mark.parametrize("chunk", [3, 64])
@pytest.mark.parametrize("offset", [0, 1])
@pytest.mark.parametrize("prefilled", [False, True])
def test_written_span_reorder_matches_a_whole_gather(chunk, offset, prefilled, monkeypatch):
    monkeypatch.setattr(_reorder, "CHUNK", chunk)
    monkeypatch.setattr(_reorder, "WHOLE_MAX_LENGTH", 0)  # this short cache takes the span too
    batch, beams = 3, 4
    inputs = np.zeros((batch, LENGTH), np.int32)
    initial_index = None
    if prefilled:
        # Examples start from different pre-fill points, so some sit still while others finish.
        initial_index = [1, 3, 2]
        inputs[0, 1] = 5
        inputs[1, 1:4] = [4, 2, 7]
        inputs[2, 1:3] = [3, 3]
    else:
        inputs[1, 1] = 6  # a forced first token for one example
    got = _decode(offset, batch, inputs, initial_index, beams, True, monkeypatch)
    expected = _decode(offset, batch, inputs, initial_index, beams, False, monkeypatch)
    np.testing.assert_array_equal(got[0], expected[0])
    np.testing.assert_array_equal(got[1], expected[1])
    # The beams really diverged: otherwise any reorder would pass.
    assert len({tuple(s) for s in got[0][0]}) == beams


@pytest.mark.parametrize("whole_max_length", [0, 9])
def test_reorder_cache_moves_only_the_span_and_gathers_other_leaves_whole(whole_max_length, monkeypatch):
    # Chunks of 2 cover the span [2, 6) exactly (a chunk may also move positions outside it);
    # a cache no longer than WHOLE_MAX_LENGTH is gathered whole.
    monkeypatch.setattr(_reorder, "CHUNK", 2)
    monkeypatch.setattr(_reorder, "WHOLE_MAX_LENGTH", whole_max_length)
    batch, beams, length = 2, 3, 9
    rng = np.random.default_rng(4)
    keys = jnp.asarray(rng.normal(size=(batch * beams, 1, 2, length)), jnp.float32)
    other = jnp.asarray(rng.normal(size=(batch * beams, 5)), jnp.float32)
    cache = {"attn": {"cached_key": keys, "cache_index": jnp.array(4)}, "state": other}
    parent = jnp.array([[2, 0, 0], [1, 2, 1]])

    def pick(x):
        x = x.reshape(batch, beams, *x.shape[1:])
        return select_beams(x, parent).reshape(batch * beams, *x.shape[2:])

    out = _reorder.reorder_cache(cache, pick, (jnp.int32(2), jnp.int32(6)), 0)
    rows = np.asarray(parent + beams * np.arange(batch)[:, None]).reshape(-1)
    expected = np.asarray(keys).copy()
    expected[..., 2:6] = np.asarray(keys)[rows][..., 2:6]
    if length <= whole_max_length:
        expected = np.asarray(keys)[rows]
    np.testing.assert_array_equal(out["attn"]["cached_key"], expected)
    np.testing.assert_array_equal(out["state"], np.asarray(other)[rows])
    assert int(out["attn"]["cache_index"]) == 4


@pytest.mark.parametrize("offset", [0, 1])
def test_select_beams_matches_indexing_and_keeps_inf(offset):
    x = jnp.asarray(np.random.default_rng(0).normal(size=(2, 3, 4)), jnp.float32).at[0, 1, 0].set(jnp.inf)
    idx = jnp.array([[1, 1, 0, 2], [2, 0, 0, 1]])
    expected = np.stack([np.asarray(x)[b][np.asarray(idx)[b]] for b in range(2)])
    if offset:
        got = select_beams(jnp.stack([x, -x]), idx, offset=1)
        np.testing.assert_array_equal(got[0], expected)
        np.testing.assert_array_equal(got[1], -expected)
    else:
        np.testing.assert_array_equal(select_beams(x, idx), expected)
