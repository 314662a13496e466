"""The parts of upstream t5x's decoding surface that its own tests rely on.

Upstream's tests call the per-row loop ``_temperature_sample_single_trial`` directly, patch
``cache_map`` / that loop on the module, pass float ``inputs`` built with ``np.zeros``, map a
scalar ``cache_index`` and use ``top_k_two_stage``; each is pinned here.
"""

from __future__ import annotations

from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t5x import decoding

EOS = 1


def _constant_logits(rows_to_token):
    """A model that always puts all mass on ``rows_to_token[r]`` for row ``r``."""
    logits = np.full((len(rows_to_token), 5), -1e7, np.float32)
    logits[np.arange(len(rows_to_token)), rows_to_token] = 0.0
    return lambda state: (jnp.asarray(logits), state.cache)


def test_single_trial_decodes_each_row_and_keeps_the_prompt():
    inputs = np.array([[0, 4, 0, 0], [0, 0, 0, 0]])
    seqs, log_probs = decoding._temperature_sample_single_trial(
        inputs, {}, _constant_logits([2, 3]), EOS, jax.random.PRNGKey(0), topk=0
    )
    assert np.asarray(seqs).tolist() == [[4, 2, 2, 2], [3, 3, 3, 3]]
    assert np.asarray(log_probs).shape == (2,)


def test_single_trial_per_example_temperature_is_repeated_over_num_decodes():
    # Example 0 greedy (temperature 0), example 1 sampled; two rows per example.
    inputs = np.zeros((4, 3), np.int32)
    seqs, log_probs = decoding._temperature_sample_single_trial(
        inputs,
        {},
        _constant_logits([2, 2, 3, 3]),
        EOS,
        jax.random.PRNGKey(0),
        num_decodes=2,
        temperature=np.array([0.0, 1.0]),
        topk=0,
    )
    assert np.asarray(seqs).tolist() == [[2, 2, 2], [2, 2, 2], [3, 3, 3], [3, 3, 3]]
    np.testing.assert_allclose(log_probs, 0.0, atol=1e-5)


def test_eos_written_by_a_state_callback_ends_the_row():
    def stop_after_first_token(state):
        # Once a row has decoded its first token (index 1), write EOS right after it.
        write = (state.cur_index == 1)[:, None] & (jnp.arange(state.sequences.shape[1]) == 2)[None, :]
        return state.replace(sequences=jnp.where(write, EOS, state.sequences))

    seqs, _ = decoding._temperature_sample_single_trial(
        np.zeros((1, 5), np.int32),
        {},
        _constant_logits([3]),
        EOS,
        jax.random.PRNGKey(0),
        temperature=0.0,
        state_callback_fn=stop_after_first_token,
    )
    # The callback's EOS is kept and nothing is decoded after it.
    assert np.asarray(seqs).tolist() == [[3, EOS, 0, 0, 0]]


def test_an_eos_inside_the_prompt_does_not_end_the_row():
    seqs, _ = decoding.temperature_sample(
        np.array([[0, 4, EOS, 0, 0]]), {}, _constant_logits([2]), EOS, temperature=0.0
    )
    assert np.asarray(seqs)[0, 0].tolist() == [4, EOS, 2, 2, 2]


def test_temperature_sample_goes_through_the_patchable_module_names():
    with (
        mock.patch.object(decoding, "_temperature_sample_single_trial") as loop,
        mock.patch.object(decoding, "cache_map") as mapped,
    ):
        loop.return_value = (np.array([[5, 1], [6, 1], [7, 1], [8, 1]]), np.array([-2.0, -1.0, -0.5, -3.0]))
        seqs, scores = decoding.temperature_sample(
            np.array([[0, 5], [0, 7]]), {}, mock.Mock(), EOS, num_decodes=2, initial_index=np.array([1, 1])
        )
    np.testing.assert_array_equal(loop.call_args[0][0], [[0, 5], [0, 5], [0, 7], [0, 7]])
    np.testing.assert_array_equal(loop.call_args[1]["initial_index"], [1, 1, 1, 1])
    assert mapped.call_args[1]["apply_to_index"] is True
    # Decodes come back per example, sorted by increasing log-probability.
    assert np.asarray(seqs).tolist() == [[[5, 1], [6, 1]], [[8, 1], [7, 1]]]
    np.testing.assert_allclose(scores, [[-2.0, -1.0], [-3.0, -0.5]])


def test_whole_number_float_inputs_are_token_ids():
    float_seqs, _ = decoding.beam_search(np.zeros((1, 3)), {}, _constant_logits([2, 2]), EOS, num_decodes=2)
    int_seqs, _ = decoding.beam_search(
        np.zeros((1, 3), np.int32), {}, _constant_logits([2, 2]), EOS, num_decodes=2
    )
    np.testing.assert_array_equal(float_seqs, int_seqs)


@pytest.mark.parametrize("decode", ["sample", "beam"])
def test_fractional_inputs_are_refused_with_their_position(decode):
    inputs = np.array([[0.0, 2.0, 0.5]])
    if decode == "sample":
        run = lambda: decoding.temperature_sample(inputs, {}, _constant_logits([2]), EOS)  # noqa: E731
    else:
        run = lambda: decoding.beam_search(inputs, {}, _constant_logits([2, 2]), EOS, num_decodes=2)  # noqa: E731
    with pytest.raises(TypeError, match=r"integer token ids, got 0\.5 at inputs\[0, 2\]"):
        run()


def test_cache_map_maps_a_scalar_cache_index_only_with_apply_to_index():
    cache = {"attn": {"cache_index": jnp.array(3), "cached_key": jnp.ones((2, 1))}, "shared": jnp.array(7)}
    plain = decoding.cache_map(lambda x: x + 1, cache)
    with_index = decoding.cache_map(lambda x: x + 1, cache, apply_to_index=True)
    assert int(plain["attn"]["cache_index"]) == 3
    assert int(with_index["attn"]["cache_index"]) == 4
    # Other scalar leaves are shared by the batch either way.
    assert int(with_index["shared"]) == 7
    np.testing.assert_array_equal(with_index["attn"]["cached_key"], 2)


def test_prefilled_sampling_keeps_a_scalar_cache_index_as_it_is():
    seen = []

    def tokens_to_logits(state):
        seen.append(state.cache["cache_index"].shape)
        return _constant_logits([2, 2])(state)

    decoding.temperature_sample(
        np.array([[0, 4, 0]]),
        {"cache_index": jnp.array(1)},
        tokens_to_logits,
        EOS,
        num_decodes=2,
        initial_index=np.array([1]),
    )
    assert seen == [()]


@pytest.mark.parametrize(("shape", "k"), [((3, 5000), 7), ((2, 4, 300), 16), ((1, 10), 10)])
def test_top_k_two_stage_equals_lax_top_k(shape, k):
    rng = np.random.default_rng(0)
    # Few distinct values: many ties, which must resolve to the lower index as lax.top_k does.
    x = jnp.asarray(rng.integers(0, 50, size=shape), jnp.float32)
    values, indices = decoding.top_k_two_stage(x, k)
    want_values, want_indices = jax.lax.top_k(x, k)
    np.testing.assert_array_equal(values, want_values)
    np.testing.assert_array_equal(indices, want_indices)


def test_top_k_two_stage_rejects_k_beyond_the_row():
    with pytest.raises(ValueError, match="k=11 for rows of length n=10"):
        decoding.top_k_two_stage(jnp.zeros((2, 10)), 11)


def test_a_topk_above_the_vocabulary_only_matters_when_sampling():
    # Upstream's per-row loop defaults to topk=20; greedy decoding never filters.
    seqs, _ = decoding.temperature_sample(
        np.zeros((1, 2), np.int32), {}, _constant_logits([3]), EOS, temperature=0.0, topk=20
    )
    assert np.asarray(seqs).tolist() == [[[3, 3]]]
    with pytest.raises(ValueError, match="topk=20 is larger than the vocabulary size 5"):
        decoding.temperature_sample(np.zeros((1, 2), np.int32), {}, _constant_logits([3]), EOS, topk=20)
