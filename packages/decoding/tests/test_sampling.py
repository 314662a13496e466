"""temperature_sample: greedy, sampling statistics, EOS, prompts, pre-fill, errors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t5x.decoding import DecodingState, temperature_sample, topk_mask, topp_mask

from .toy_models import EOS, MarkovModel, greedy_reference, tempered


def _greedy(model, starts, inputs, **kwargs):
    decode = jax.jit(
        lambda i, c: temperature_sample(i, c, model.tokens_to_logits, EOS, temperature=0.0, **kwargs)
    )
    seqs, lp = decode(jnp.asarray(inputs, jnp.int32), model.init_cache(starts))
    return np.asarray(seqs), np.asarray(lp)


def test_greedy_is_the_argmax_chain_and_stops_at_eos():
    model = MarkovModel(vocab=6, length=8, seed=1, eos_bias=1.5)
    starts = list(range(7))
    seqs, lp = _greedy(model, starts, np.zeros((7, 8)), rescale_log_probs=False)
    assert seqs.shape == (7, 1, 8)
    references = [greedy_reference(model, s, [], 8) for s in starts]
    assert [seqs[b, 0].tolist() for b in range(7)] == [r[0] for r in references]
    np.testing.assert_allclose(lp[:, 0], [r[1] for r in references], atol=1e-4)
    # The fixture must exercise both early EOS (then zeros) and running to the full length.
    ended = [EOS in r[0][:-1] for r in references]
    assert any(ended) and not all(ended)
    for tokens, _ in references:
        if EOS in tokens:
            assert all(t == 0 for t in tokens[tokens.index(EOS) + 1 :])


def test_greedy_log_prob_is_zero_when_rescaled():
    model = MarkovModel(vocab=6, length=5, seed=2)
    _, lp = _greedy(model, [0, 1], np.zeros((2, 5)))
    np.testing.assert_array_equal(lp, 0.0)


def test_forced_prompt_is_kept_and_costs_nothing():
    model = MarkovModel(vocab=6, length=8, seed=3, eos_bias=1.0)
    prompts = [[4, EOS, 5], [2], [3, 3, 3, 3]]
    inputs = np.zeros((3, 8), np.int32)
    for b, prompt in enumerate(prompts):
        inputs[b, 1 : 1 + len(prompt)] = prompt
    seqs, lp = _greedy(model, [0, 1, 2], inputs, rescale_log_probs=False)
    for b, prompt in enumerate(prompts):
        tokens, total = greedy_reference(model, b, prompt, 8)
        assert seqs[b, 0].tolist() == tokens
        assert seqs[b, 0, : len(prompt)].tolist() == prompt  # an EOS inside the prompt does not stop
        assert lp[b, 0] == pytest.approx(total, abs=1e-4)


def test_prefilled_cache_matches_forced_prompt():
    model = MarkovModel(vocab=6, length=8, seed=4, eos_bias=0.5)
    prompts = [[4, 2, 5], [2], [3, 3, 3, 3, 2]]
    inputs = np.zeros((3, 8), np.int32)
    for b, prompt in enumerate(prompts):
        inputs[b, 1 : 1 + len(prompt)] = prompt
    forced, forced_lp = _greedy(model, [0, 1, 2], inputs, rescale_log_probs=False)
    # The cache has seen BOS and all prompt tokens but the last, which is fed first.
    starts = [model.fed_state(b, [0, *p[:-1]]) for b, p in enumerate(prompts)]
    index = jnp.array([len(p) for p in prompts], jnp.int32)
    seqs, lp = _greedy(model, starts, inputs, rescale_log_probs=False, initial_index=index)
    np.testing.assert_array_equal(seqs, forced)
    np.testing.assert_allclose(lp, forced_lp, atol=1e-5)


def test_prefill_with_several_decodes_expands_the_cache_index():
    model = MarkovModel(vocab=6, length=6, seed=5)
    inputs = jnp.array([[0, 2, 3, 0, 0, 0], [0, 4, 0, 0, 0, 0]], jnp.int32)
    cache = model.init_cache([model.fed_state(0, [0, 2]), model.fed_state(1, [0])])
    cache["decoder"]["cache_index"] = jnp.array([2, 1], jnp.int32)
    seen = {}

    def fn(state: DecodingState):
        seen["index_shape"] = state.cache["decoder"]["cache_index"].shape
        seen["cur_index"] = state.cur_index.shape
        return model.tokens_to_logits(state)

    seqs, _ = temperature_sample(
        inputs,
        cache,
        fn,
        EOS,
        jax.random.PRNGKey(0),
        num_decodes=3,
        temperature=0.0,
        initial_index=jnp.array([2, 1]),
    )
    assert seen == {"index_shape": (6,), "cur_index": (6,)}
    for b, prompt in enumerate([[2, 3], [4]]):
        expected, _ = greedy_reference(model, b, prompt, 6)
        assert np.asarray(seqs)[b].tolist() == [expected] * 3


def test_max_decode_steps_limits_tokens_after_the_prompt():
    model = MarkovModel(vocab=6, length=10, seed=6, eos_bias=-np.inf)
    inputs = np.zeros((2, 10), np.int32)
    inputs[0, 1:4] = [2, 3, 4]
    seqs, _ = _greedy(model, [0, 1], inputs, max_decode_steps=2)
    full, _ = _greedy(model, [0, 1], inputs)
    assert seqs[0, 0].tolist() == full[0, 0, :5].tolist() + [0] * 5
    assert seqs[1, 0].tolist() == full[1, 0, :2].tolist() + [0] * 8
    per_example, _ = _greedy(model, [0, 1], inputs, max_decode_steps=jnp.array([1, 4]))
    assert per_example[0, 0].tolist() == full[0, 0, :4].tolist() + [0] * 6
    assert per_example[1, 0].tolist() == full[1, 0, :4].tolist() + [0] * 6


class _FixedLogits:
    """One decoding step (length 1) with the same logits for every row."""

    def __init__(self, logits):
        self.logits = logits

    def __call__(self, state):
        rows = state.cur_token.shape[0]
        return jnp.broadcast_to(self.logits, (rows, self.logits.shape[0])), state.cache


def _first_tokens(logits, batch, num_decodes, seed=0, **kwargs):
    # Logits enter as an argument: as a constant XLA would spend seconds folding them.
    seqs, lp = jax.jit(
        lambda r, z: temperature_sample(
            jnp.zeros((batch, 1), jnp.int32), {}, _FixedLogits(z), EOS, r, num_decodes=num_decodes, **kwargs
        )
    )(jax.random.PRNGKey(seed), jnp.asarray(logits))
    return np.asarray(seqs)[..., 0], np.asarray(lp)


LOGITS = np.array([0.3, -1.0, 1.2, 0.9, -0.4, 0.0, 0.7], np.float32)  # no EOS-ending issue: length 1


def _frequency_check(tokens, expected):
    """Each token's frequency is within 5 standard errors of its probability; excluded ones never occur.

    With n = 40000 draws, 5 standard errors is at most 0.0125; the chance that a correct
    sampler fails this for any of 7 tokens is below 1e-5.
    """
    n = tokens.size
    counts = np.bincount(tokens.ravel(), minlength=expected.size) / n
    for token, p in enumerate(expected):
        if p == 0:
            assert counts[token] == 0, (token, counts)
        else:
            assert abs(counts[token] - p) <= 5 * np.sqrt(p * (1 - p) / n), (token, counts[token], p)


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"temperature": 1.0}, tempered(LOGITS, 1.0)),
        ({"temperature": 0.5}, tempered(LOGITS, 0.5)),
        ({"temperature": 2.0, "topk": 3}, tempered(np.where(LOGITS >= 0.7, LOGITS, -np.inf), 2.0)),
        ({"temperature": 1.0, "topp": 0.6}, tempered(np.where(LOGITS >= 0.7, LOGITS, -np.inf), 1.0)),
    ],
)
def test_sample_frequencies_match_the_tempered_distribution(kwargs, expected):
    tokens, lp = _first_tokens(LOGITS, 400, 100, **kwargs)
    _frequency_check(tokens, expected)
    # Rescaled log-probs are those of the distribution actually sampled from.
    with np.errstate(divide="ignore"):
        log_expected = np.log(expected)
    np.testing.assert_allclose(lp, log_expected[tokens], atol=1e-4)


def test_topp_cutoff_reference():
    # The test above relies on top-p 0.6 of LOGITS keeping exactly the three best tokens.
    probs = tempered(LOGITS, 1.0)
    order = np.argsort(-probs)
    before = np.cumsum(probs[order]) - probs[order]
    assert sorted(order[before < 0.6].tolist()) == [2, 3, 6]


def test_per_example_temperature():
    tokens, _ = _first_tokens(LOGITS, 2, 20000, temperature=jnp.array([0.0, 1.0]))
    assert np.all(tokens[0] == np.argmax(LOGITS))
    _frequency_check(tokens[1], tempered(LOGITS, 1.0))


def test_samples_are_sorted_by_log_prob_and_reproducible():
    model = MarkovModel(vocab=6, length=6, seed=9, eos_bias=0.5)
    decode = jax.jit(
        lambda r: temperature_sample(
            jnp.zeros((3, 6), jnp.int32),
            model.init_cache([0, 1, 2]),
            model.tokens_to_logits,
            EOS,
            r,
            num_decodes=5,
        )
    )
    seqs, lp = decode(jax.random.PRNGKey(7))
    again, _ = decode(jax.random.PRNGKey(7))
    other, _ = decode(jax.random.PRNGKey(8))
    np.testing.assert_array_equal(seqs, again)
    assert not np.array_equal(seqs, other)
    lp = np.asarray(lp)
    assert np.all(np.diff(lp, axis=1) >= 0)
    # Each returned log-prob is that sequence's log-probability under the model.
    for b in range(3):
        for j in range(5):
            tokens = np.asarray(seqs)[b, j].tolist()
            total = 0.0
            for pos, token in enumerate(tokens):
                total += model.log_probs(b, [0, *tokens[:pos]])[token]
                if token == EOS:
                    break
            assert lp[b, j] == pytest.approx(total, abs=1e-4)


def test_topk_one_is_greedy():
    model = MarkovModel(vocab=6, length=6, seed=10)
    sampled = jax.jit(
        lambda r: temperature_sample(
            jnp.zeros((2, 6), jnp.int32),
            model.init_cache([0, 1]),
            model.tokens_to_logits,
            EOS,
            r,
            num_decodes=4,
            topk=1,
        )
    )
    seqs, lp = sampled(jax.random.PRNGKey(0))
    greedy, _ = _greedy(model, [0, 1], np.zeros((2, 6)))
    np.testing.assert_array_equal(np.asarray(seqs), np.repeat(greedy, 4, axis=1))
    np.testing.assert_array_equal(lp, 0.0)


def test_one_compilation_for_the_whole_decode():
    model = MarkovModel(vocab=6, length=6, seed=11)
    traces = []

    def fn(state):
        traces.append(1)
        return model.tokens_to_logits(state)

    decode = jax.jit(lambda i, c, r: temperature_sample(i, c, fn, EOS, r, num_decodes=2, topp=0.9))
    decode(jnp.zeros((2, 6), jnp.int32), model.init_cache([0, 1]), jax.random.PRNGKey(0))
    first = len(traces)
    decode(jnp.ones((2, 6), jnp.int32), model.init_cache([2, 3]), jax.random.PRNGKey(1))
    assert first >= 1 and len(traces) == first


def test_topk_and_topp_masks_are_exact():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(6, 11)).astype(np.float32)
    logits[0, [2, 5]] = logits[0].max() + 1.0  # tie at the top
    logits[1, [1, 3, 7]] = 0.25  # three-way tie in the middle
    # One compilation each: k and p are traced (per-row arrays); the static-int top-k path
    # is checked once.
    topk_per_row = jax.jit(topk_mask)
    topp_per_row = jax.jit(topp_mask)
    descending = np.sort(logits, axis=1)[:, ::-1]
    for k in (1, 2, 3, 5, 11):
        out = np.asarray(topk_per_row(jnp.asarray(logits), jnp.full((6,), k)))
        np.testing.assert_array_equal(out, np.where(logits >= descending[:, k - 1 : k], logits, -1e7))
    for k in (1, 2, 3, 11):  # a constant k takes lax.top_k's k-th value on one CPU device
        np.testing.assert_array_equal(
            np.asarray(topk_mask(jnp.asarray(logits), k)),
            np.where(logits >= descending[:, k - 1 : k], logits, -1e7),
        )
    probs = np.exp(logits.astype(np.float64))
    probs /= probs.sum(axis=1, keepdims=True)
    for p in (0.05, 0.3, 0.5, 0.77, 0.95):
        out = np.asarray(topp_per_row(jnp.asarray(logits), jnp.full((6,), p)))
        # Kept iff the mass of strictly more likely tokens is below p.
        keep = np.array([[probs[r][probs[r] > probs[r, t]].sum() < p for t in range(11)] for r in range(6)])
        np.testing.assert_array_equal(out, np.where(keep, logits, -1e7))
    per_row = np.asarray(topp_per_row(jnp.asarray(logits), jnp.array([0.0, 1.0, 0.3, 0.3, 0.3, 0.3])))
    np.testing.assert_array_equal(per_row[:2], logits[:2])
    np.testing.assert_array_equal(
        per_row[2:], np.asarray(topp_per_row(jnp.asarray(logits), jnp.full((6,), 0.3)))[2:]
    )


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"topk": 8}, ValueError, "topk=8 is larger than the vocabulary size 7"),
        ({"topk": -1}, ValueError, r"topk must be >= 0 .*got topk=-1"),
        ({"topp": 1.5}, ValueError, r"topp must be in \[0, 1\].*1.5"),
        ({"topp": -0.1}, ValueError, r"topp must be in \[0, 1\].*-0.1"),
        ({"num_decodes": 0}, ValueError, "num_decodes must be >= 1, got num_decodes=0"),
        ({"temperature": -1.0}, ValueError, "temperature must be >= 0"),
        ({"temperature": jnp.ones(3)}, ValueError, r"temperature must be a scalar or \[batch\]"),
        ({"initial_index": jnp.array([1, 4])}, ValueError, r"initial_index\[1\]=4 .*prompt is longer"),
    ],
)
def test_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        temperature_sample(
            jnp.zeros((2, 4), jnp.int32), {}, _FixedLogits(LOGITS), EOS, jax.random.PRNGKey(0), **kwargs
        )


def test_bad_logits_shape():
    def wrong(state):
        return jnp.zeros((1, 5)), state.cache

    with pytest.raises(ValueError, match=r"logits of shape \[rows, vocab\] with rows=2"):
        temperature_sample(jnp.zeros((2, 4), jnp.int32), {}, wrong, EOS)


def test_scanned_cache_with_several_decodes():
    # Cache leaves of scanned layers carry the batch on axis 1 (cache_offset=1).
    model = MarkovModel(vocab=6, length=6, seed=12, eos_bias=0.5)
    decode = jax.jit(
        lambda c: temperature_sample(
            jnp.zeros((3, 6), jnp.int32),
            c,
            lambda s: model.tokens_to_logits(s, offset=1),
            EOS,
            num_decodes=2,
            temperature=0.0,
            cache_offset=1,
        )
    )
    seqs, _ = decode(model.init_cache([0, 3, 5], offset=1))
    for b, start in enumerate([0, 3, 5]):
        expected, _ = greedy_reference(model, start, [], 6)
        assert np.asarray(seqs)[b].tolist() == [expected] * 2
