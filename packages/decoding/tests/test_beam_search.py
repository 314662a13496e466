"""Beam search against exhaustive search on tiny vocabularies and lengths."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t5x.decoding import NEG_INF, beam_search, brevity_penalty

from .toy_models import (
    EOS,
    MarkovModel,
    assert_close_scores,
    brevity,
    exhaustive_finished,
    exhaustive_unfinished,
)


def _run(model, starts, inputs, beams, alpha, offset=0, **kwargs):
    cache = model.init_cache(starts, offset)
    fn = functools.partial(model.tokens_to_logits, offset=offset)
    seqs, scores = jax.jit(
        lambda i, c, a: beam_search(i, c, fn, EOS, num_decodes=beams, alpha=a, cache_offset=offset, **kwargs)
    )(jnp.asarray(inputs, jnp.int32), cache, jnp.float32(alpha))
    return np.asarray(seqs), np.asarray(scores)


@pytest.mark.parametrize("offset", [0, 1])
def test_matches_exhaustive_search_with_scores(offset):
    # vocab 4 (one EOS), length 3: at most 9 live prefixes and 36 candidates per step, so
    # 18 beams keep every candidate and beam search must find every finished sequence.
    model = MarkovModel(vocab=4, length=3, seed=3)
    starts = [0, 2, 5]
    cache = model.init_cache(starts, offset)
    fn = functools.partial(model.tokens_to_logits, offset=offset)
    decode = jax.jit(lambda i, c, a: beam_search(i, c, fn, EOS, num_decodes=18, alpha=a, cache_offset=offset))
    for alpha in (0.0, 0.6, 1.5):
        seqs, scores = (np.asarray(x) for x in decode(jnp.zeros((3, 3), jnp.int32), cache, alpha))
        _check_against_exhaustive(model, starts, seqs, scores, alpha)


def _check_against_exhaustive(model, starts, seqs, scores, alpha):
    assert seqs.shape == (3, 18, 3) and scores.shape == (3, 18)
    for b, start in enumerate(starts):
        expected = exhaustive_finished(model, start, [], 3, alpha)
        assert len(expected) == 13  # 1 + 3 + 9 ways to end with EOS
        real = scores[b] > NEG_INF / 2
        assert real.sum() == 13
        # Best last; the empty slots first.
        got_scores = scores[b][real][::-1]
        got_seqs = seqs[b][real][::-1].tolist()
        assert_close_scores(got_scores, [s for s, _ in expected])
        assert got_seqs == [t for _, t in expected]
        assert np.all(np.diff(scores[b]) >= 0)


def test_small_beam_finds_the_exhaustive_best_when_eos_is_likely():
    model = MarkovModel(vocab=5, length=4, seed=11, eos_bias=1.0)
    starts = [0, 1, 3, 6]
    seqs, scores = _run(model, starts, np.zeros((4, 4)), beams=4, alpha=0.6)
    for b, start in enumerate(starts):
        best_score, best_seq = exhaustive_finished(model, start, [], 4, 0.6)[0]
        assert seqs[b, -1].tolist() == best_seq
        assert scores[b, -1] == pytest.approx(best_score, abs=2e-4)


def test_length_penalty_changes_the_winner():
    # Short sequences win without a length penalty and long ones win with a strong one.
    def winner(model, alpha):
        return tuple(exhaustive_finished(model, 4, [], 3, alpha)[0][1])

    seed = next(
        s
        for s in range(100)
        if winner(MarkovModel(4, 3, seed=s), 0.0) != winner(MarkovModel(4, 3, seed=s), 5.0)
    )
    model = MarkovModel(vocab=4, length=3, seed=seed)
    decode = jax.jit(
        lambda a: beam_search(
            jnp.zeros((1, 3), jnp.int32),
            model.init_cache([4]),
            model.tokens_to_logits,
            EOS,
            num_decodes=18,
            alpha=a,
        )
    )
    winners = set()
    for alpha in (0.0, 5.0):
        seqs = np.asarray(decode(alpha)[0])
        best = exhaustive_finished(model, 4, [], 3, alpha)[0][1]
        assert seqs[0, -1].tolist() == best
        winners.add(tuple(best))
    assert len(winners) == 2


def test_no_finished_sequence_returns_live_beams_with_log_probs():
    model = MarkovModel(vocab=4, length=3, seed=2, eos_bias=-np.inf)
    seqs, scores = _run(model, [1, 3], np.zeros((2, 3)), beams=9, alpha=0.6)
    for b, start in enumerate([1, 3]):
        expected = exhaustive_unfinished(model, start, 3)[:9]
        assert seqs[b][::-1].tolist() == [t for _, t in expected]
        assert_close_scores(scores[b][::-1], [s for s, _ in expected])


def test_forced_prefix_matches_exhaustive_search():
    model = MarkovModel(vocab=4, length=5, seed=8)
    # Output positions 0 and 1 are forced; the forced EOS must not end the sequence.
    prompts = [[3, EOS], [2, 0]]
    inputs = np.zeros((2, 5), np.int32)
    for b, prompt in enumerate(prompts):
        inputs[b, 1 : 1 + len(prompt)] = prompt
    seqs, scores = _run(model, [0, 4], inputs, beams=18, alpha=0.6)
    for b, start in enumerate([0, 4]):
        expected = exhaustive_finished(model, start, prompts[b], 5, 0.6)
        top = expected[:5]
        assert seqs[b, ::-1][:5].tolist() == [t for _, t in top]
        assert_close_scores(scores[b, ::-1][:5], [s for s, _ in top])
        real = scores[b] > NEG_INF / 2
        assert np.all(seqs[b][real][:, 0] == prompts[b][0])


def test_prefilled_cache_matches_forced_prompt():
    model = MarkovModel(vocab=4, length=6, seed=21)
    prompts = [[2, 3, 2], [3]]
    inputs = np.zeros((2, 6), np.int32)
    for b, prompt in enumerate(prompts):
        inputs[b, 1 : 1 + len(prompt)] = prompt
    forced_seqs, forced_scores = _run(model, [0, 5], inputs, beams=6, alpha=0.6)
    # Pre-fill: the cache has seen BOS and every prompt token but the last one.
    starts = [model.fed_state(s, [0, *p[:-1]]) for s, p in zip([0, 5], prompts)]
    seqs, scores = _run(
        model, starts, inputs, beams=6, alpha=0.6, initial_index=jnp.array([len(p) for p in prompts])
    )
    np.testing.assert_array_equal(seqs, forced_seqs)
    np.testing.assert_allclose(scores, forced_scores, atol=1e-5)


def test_max_decode_len_shorter_than_inputs():
    model = MarkovModel(vocab=4, length=3, seed=13)
    seqs, scores = _run(model, [0], np.zeros((1, 8)), beams=18, alpha=0.6, max_decode_len=3)
    assert seqs.shape == (1, 18, 3)
    best_score, best = exhaustive_finished(model, 0, [], 3, 0.6)[0]
    assert seqs[0, -1].tolist() == best
    assert scores[0, -1] == pytest.approx(best_score, abs=2e-4)


def test_stops_early_when_no_live_beam_can_win():
    model = MarkovModel(vocab=3, length=8, seed=4, eos_bias=4.0)
    steps = []

    def counting(state):
        jax.debug.callback(lambda index: steps.append(int(index[0])), state.cur_index)
        return model.tokens_to_logits(state)

    seqs, scores = beam_search(
        jnp.zeros((2, 8), jnp.int32), model.init_cache([0, 1]), counting, EOS, num_decodes=3
    )
    jax.effects_barrier()
    assert 1 <= len(steps) < 8
    assert steps == list(range(len(steps)))
    # Stopping early must not lose the best sequence.
    for b, start in enumerate([0, 1]):
        best_score, best = exhaustive_finished(model, start, [], 8, 0.6)[0]
        assert np.asarray(seqs)[b, -1].tolist() == best
        assert float(scores[b, -1]) == pytest.approx(best_score, abs=2e-4)


def test_brevity_penalty_values():
    assert float(brevity_penalty(0.6, 1)) == pytest.approx(1.0)
    assert float(brevity_penalty(0.6, 7)) == pytest.approx(2.0**0.6)
    assert float(brevity_penalty(0.0, 50)) == 1.0
    assert brevity(1.0, 13) == pytest.approx(3.0)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_decodes": 0}, "num_decodes must be >= 1, got num_decodes=0"),
        ({"max_decode_len": 2}, "longer than the decode length"),
        ({"initial_index": jnp.array([4, 6])}, r"initial_index\[1\]=6"),
    ],
)
def test_bad_arguments(kwargs, match):
    model = MarkovModel(vocab=4, length=6)
    inputs = jnp.array([[0, 2, 3, 0, 0, 0], [0, 2, 3, 2, 0, 0]], jnp.int32)
    with pytest.raises(ValueError, match=match):
        beam_search(inputs, model.init_cache([0, 0]), model.tokens_to_logits, EOS, **kwargs)


def test_single_token_vocabulary_is_rejected():
    def one_token(state):
        return jnp.zeros((state.cur_token.shape[0], 1)), state.cache

    with pytest.raises(ValueError, match="at least 2 tokens, got 1"):
        beam_search(jnp.zeros((1, 3), jnp.int32), {}, one_token, EOS, num_decodes=2)
