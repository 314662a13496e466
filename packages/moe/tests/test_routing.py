"""Routing math against a plain NumPy reference: top-k choice, capacity and dropping, both losses."""

import numpy as np
import pytest

from t5x.moe import (
    MoeDecoderOnlyConfig,
    MoeT5Config,
    expert_capacity,
    experts_choose,
    load_balancing_loss,
    router_z_loss,
    tokens_choose,
    tokens_per_group,
)


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _reference_tokens_choose(logits, k, capacity, bpr=False, real=None):
    """Loops: choice rank by rank, tokens in order (or by top-1 probability), experts fill up.

    ``real`` (``[groups, tokens]`` 0/1) marks padding, which chooses nothing, has
    probability 0 in the load-balancing loss and logits 0 in the z-loss.
    """
    real = np.ones(logits.shape[:2]) if real is None else np.asarray(real, np.float64)
    logits = logits.astype(np.float64) * real[..., None]
    probs = _softmax(logits) * real[..., None]
    groups, tokens, experts = probs.shape
    dispatch = np.zeros((groups, tokens, experts, capacity))
    combine = np.zeros_like(dispatch)
    aux = 0.0
    for g in range(groups):
        choices = np.argsort(-probs[g], axis=-1, kind="stable")[:, :k]
        chose = np.zeros((tokens, experts))
        for t in range(tokens):
            chose[t, choices[t]] = real[g, t]
        aux += np.mean(chose.mean(0) * probs[g].mean(0)) * experts**2
        order = (
            np.argsort(-probs[g, np.arange(tokens), choices[:, 0]], kind="stable") if bpr else range(tokens)
        )
        fill = np.zeros(experts, int)
        for rank in range(k):
            for t in order:
                if not real[g, t]:
                    continue
                e = choices[t, rank]
                if fill[e] < capacity:
                    dispatch[g, t, e, fill[e]] = 1
                    combine[g, t, e, fill[e]] = probs[g, t, e]
                fill[e] += 1
    z = np.mean(np.log(np.exp(logits).sum(-1)) ** 2)
    return dispatch, combine, aux / groups, z


@pytest.mark.parametrize(
    ("k", "capacity", "bpr"), [(1, 2, False), (2, 3, False), (2, 2, True), (1, 8, False)]
)
def test_tokens_choose_matches_reference(k, capacity, bpr):
    logits = np.random.RandomState(k * 10 + capacity).normal(size=(3, 8, 4)).astype(np.float32) * 2
    got = tokens_choose(logits, k, capacity, bpr)
    dispatch, combine, aux, z = _reference_tokens_choose(logits, k, capacity, bpr)
    np.testing.assert_array_equal(np.asarray(got.dispatch), dispatch)
    np.testing.assert_allclose(np.asarray(got.combine), combine, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(float(got.aux_loss), aux, rtol=1e-5)
    np.testing.assert_allclose(float(got.z_loss), z, rtol=1e-5)


@pytest.mark.parametrize(("k", "capacity", "bpr"), [(1, 2, False), (2, 3, False), (1, 2, True)])
def test_ignoring_padding_matches_reference(k, capacity, bpr):
    rng = np.random.RandomState(7 + k)
    logits = rng.normal(size=(3, 8, 4)).astype(np.float32) * 2
    real = (rng.uniform(size=(3, 8)) < 0.6).astype(np.float32)
    got = tokens_choose(logits, k, capacity, bpr, padding_mask=real)
    dispatch, combine, aux, z = _reference_tokens_choose(logits, k, capacity, bpr, real)
    np.testing.assert_array_equal(np.asarray(got.dispatch), dispatch)
    np.testing.assert_allclose(np.asarray(got.combine), combine, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(float(got.aux_loss), aux, rtol=1e-5)
    np.testing.assert_allclose(float(got.z_loss), z, rtol=1e-5)
    assert not np.asarray(got.dispatch)[real == 0].any()


def test_padding_takes_no_slot_from_real_tokens():
    # Padding first in the group, every token preferring expert 0 with one slot:
    # routed, the padding takes the slot; ignored, the first real token gets it.
    logits = np.tile(np.array([5.0, 0.0], np.float32), (1, 4, 1))
    real = np.array([[0, 0, 1, 1]], np.float32)
    kept = lambda routing: np.asarray(routing.dispatch).sum(axis=(2, 3))[0]  # noqa: E731
    np.testing.assert_array_equal(kept(tokens_choose(logits, 1, 1)), [1, 0, 0, 0])
    np.testing.assert_array_equal(kept(tokens_choose(logits, 1, 1, padding_mask=real)), [0, 0, 1, 0])
    chosen = experts_choose(logits, 2, padding_mask=real)
    np.testing.assert_array_equal(np.asarray(chosen.dispatch)[0, :, 0].sum(-1), [0, 0, 1, 1])
    assert not np.asarray(chosen.combine)[0, :2].any()  # padding never weighs in


def test_tokens_choose_drops_what_overflows_capacity():
    # Every token prefers expert 0; with two slots only the first two tokens get it.
    logits = np.tile(np.array([5.0, 0.0, 0.0], np.float32), (1, 5, 1))
    got = tokens_choose(logits, 1, 2)
    kept = np.asarray(got.dispatch).sum(axis=(2, 3))[0]
    np.testing.assert_array_equal(kept, [1, 1, 0, 0, 0])


def test_experts_choose_matches_reference():
    logits = np.random.RandomState(3).normal(size=(2, 6, 3)).astype(np.float32)
    got = experts_choose(logits, 2)
    probs = _softmax(logits.astype(np.float64))
    for g in range(2):
        for e in range(3):
            top = np.argsort(-probs[g, :, e], kind="stable")[:2]
            for c, t in enumerate(top):
                assert np.asarray(got.dispatch)[g, t, e, c] == 1
                np.testing.assert_allclose(np.asarray(got.combine)[g, t, e, c], probs[g, t, e], rtol=1e-5)
    assert np.asarray(got.dispatch).sum() == 2 * 3 * 2
    assert float(got.aux_loss) == 0.0


def test_losses_on_known_values():
    # Uniform routing: the balancing loss is exactly 1; zero logits give z = log(E)^2.
    probs = np.full((1, 4, 4), 0.25, np.float32)
    index = np.arange(4).reshape(1, 4, 1)
    np.testing.assert_allclose(float(load_balancing_loss(probs, index)), 1.0, rtol=1e-6)
    np.testing.assert_allclose(float(router_z_loss(np.zeros((2, 3, 4)))), np.log(4.0) ** 2, rtol=1e-6)
    # All tokens on one expert with all the probability: E times the uniform value.
    probs = np.zeros((1, 4, 4), np.float32)
    probs[..., 0] = 1
    np.testing.assert_allclose(float(load_balancing_loss(probs, np.zeros((1, 4, 1), int))), 4.0, rtol=1e-6)


def test_capacity_and_groups():
    assert expert_capacity(64, 8, 1.25, 4) == 10
    assert expert_capacity(8, 8, 1.0, 4) == 4
    assert tokens_per_group(512, 128) == 128
    assert tokens_per_group(12, 8) == 6
    with pytest.raises(ValueError, match="expert capacity is 0"):
        expert_capacity(4, 64, 1.0, 0)


def test_bad_configs_are_named():
    common = dict(vocab_size=8, emb_dim=8, num_heads=1, head_dim=8, mlp_dim=8)
    with pytest.raises(ValueError, match="router must be one of"):
        MoeT5Config(**common, router="hash")
    with pytest.raises(ValueError, match="num_selected_experts"):
        MoeT5Config(**common, num_experts=2, num_selected_experts=3)
    with pytest.raises(ValueError, match=r"the encoder has 3 layers \(3 % 2 = 1\)"):
        MoeT5Config(**common, num_encoder_layers=3, num_decoder_layers=2, scan_layers=True)
    with pytest.raises(ValueError, match="without an MoE layer"):
        MoeT5Config(**common, num_encoder_layers=2, num_decoder_layers=2, moe_layer_period=3)
    with pytest.raises(ValueError, match="a decoder must route tokens-choose"):
        MoeDecoderOnlyConfig(**common, router="experts_choose")
