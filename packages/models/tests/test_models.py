"""Model classes: contract, losses, scores, decoding, training, errors."""

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import traverse_util

from t5x import decoding
from t5x.interfaces.testing import check_model
from t5x.models import (
    BaseModel,
    DecoderOnlyModel,
    EncoderDecoderModel,
    LazyReference,
    SpecialLossNormalizingFactor,
    compute_weighted_cross_entropy,
    cross_entropy_with_logits,
    preset,
    token_cross_entropy,
)

VOCAB = 40


def _encdec_batch():
    rng = np.random.default_rng(0)
    enc = rng.integers(2, VOCAB, size=(3, 7)).astype(np.int32)
    tgt = rng.integers(2, VOCAB, size=(3, 6)).astype(np.int32)
    enc[1, -3:] = 0
    tgt[1, -2:] = 0
    tgt[2, -1:] = 0
    dec_in = np.concatenate([np.zeros((3, 1), np.int32), tgt[:, :-1]], axis=1)
    return {
        "encoder_input_tokens": enc,
        "decoder_input_tokens": dec_in,
        "decoder_target_tokens": tgt,
        "decoder_loss_weights": (tgt > 0).astype(np.float32),
    }


@pytest.fixture(scope="module")
def encdec():
    model = EncoderDecoderModel(preset("t5_1_1_tiny", vocab_size=VOCAB))
    batch = _encdec_batch()
    params = model.get_initial_variables(jax.random.PRNGKey(0), {k: v.shape for k, v in batch.items()})[
        "params"
    ]
    return model, params, batch


def _prefix_batch():
    rng = np.random.default_rng(1)
    tgt = rng.integers(2, VOCAB, size=(2, 8)).astype(np.int32)
    tgt[1, -2:] = 0
    dec_in = np.concatenate([np.zeros((2, 1), np.int32), tgt[:, :-1]], axis=1)
    dca = (np.arange(8)[None, :] <= np.array([[3], [2]])).astype(np.int32)
    weights = ((tgt > 0) & (dca == 0)).astype(np.float32)
    return {
        "decoder_input_tokens": dec_in,
        "decoder_target_tokens": tgt,
        "decoder_causal_attention": dca,
        "decoder_loss_weights": weights,
    }


@pytest.fixture(scope="module")
def prefix_lm():
    model = DecoderOnlyModel(preset("decoder_tiny", vocab_size=VOCAB), inputs_bidirectional_attention=True)
    params = model.get_initial_variables(jax.random.PRNGKey(1), {"decoder_input_tokens": (2, 8)})["params"]
    return model, params, _prefix_batch()


def test_encoder_decoder_meets_model_contract(encdec):
    check_model(*encdec)


def test_prefix_lm_meets_model_contract(prefix_lm):
    check_model(*prefix_lm)


def test_both_models_are_upstreams_base_model(encdec, prefix_lm):
    for model, params, batch in (encdec, prefix_lm):
        assert isinstance(model, BaseModel)
        np.testing.assert_array_equal(
            model.predict_batch(params, batch), model.predict_batch_with_aux(params, batch)[0]
        )
        np.testing.assert_allclose(model.eval_fn(params, batch)[0], model.loss_fn(params, batch, None)[0])
    with pytest.raises(TypeError, match="abstract"):
        BaseModel()


def test_models_name_their_feature_converters():
    assert (
        EncoderDecoderModel.feature_converter_cls.dotted_name
        == "t5x.feature_converters.EncDecFeatureConverter"
    )
    assert (
        DecoderOnlyModel.feature_converter_cls.dotted_name == "t5x.feature_converters.DecoderFeatureConverter"
    )
    ref = LazyReference("collections.OrderedDict")
    assert ref(a=1) == {"a": 1} and ref.__name__ == "OrderedDict"
    with pytest.raises(ImportError, match="no_such_pkg.mod.Thing"):
        LazyReference("no_such_pkg.mod.Thing").resolve()


def test_score_batch_is_gathered_log_softmax(encdec):
    model, params, batch = encdec
    logits = np.asarray(model.compute_logits(params, batch), np.float64)
    log_probs = (
        logits
        - np.log(np.sum(np.exp(logits - logits.max(-1, keepdims=True)), -1, keepdims=True))
        - logits.max(-1, keepdims=True)
    )
    gathered = np.take_along_axis(log_probs, batch["decoder_target_tokens"][..., None], -1)[..., 0]
    want = np.sum(gathered * batch["decoder_loss_weights"], axis=-1)
    scores, aux = model.score_batch(params, batch, return_intermediates=True)
    np.testing.assert_allclose(np.asarray(scores), want, rtol=1e-5)
    np.testing.assert_allclose(
        np.asarray(aux["token_scores"]), gathered * batch["decoder_loss_weights"], rtol=1e-5, atol=1e-6
    )


def _direct_loss(logits, targets, weights, smoothing, z):
    logits = np.asarray(logits, np.float64)
    vocab = logits.shape[-1]
    m = logits.max(-1, keepdims=True)
    log_z = np.log(np.sum(np.exp(logits - m), -1, keepdims=True)) + m
    soft = np.full(logits.shape, smoothing / (vocab - 1))
    np.put_along_axis(soft, targets[..., None], 1.0 - smoothing, -1)
    entropy = -np.sum(np.where(soft > 0, soft * np.log(np.maximum(soft, 1e-30)), 0.0), -1)
    per_token = -np.sum(soft * (logits - log_z), -1) - entropy + z * log_z[..., 0] ** 2
    return per_token * weights, z * log_z[..., 0] ** 2 * weights


def test_weighted_cross_entropy_matches_direct_formula():
    rng = np.random.default_rng(2)
    logits = rng.normal(size=(2, 5, 11)).astype(np.float32) * 3
    targets = rng.integers(0, 11, size=(2, 5))
    weights = rng.integers(0, 2, size=(2, 5)).astype(np.float32)
    for smoothing, z in [(0.0, 0.0), (0.1, 0.0), (0.0, 1e-3), (0.2, 1e-2)]:
        loss, z_loss, weight_sum = compute_weighted_cross_entropy(
            logits, targets, weights, smoothing, z, loss_normalizing_factor=4.0
        )
        per_token, z_tok = _direct_loss(logits, targets, weights, smoothing, z)
        np.testing.assert_allclose(float(loss), per_token.sum() / 4.0, rtol=1e-5)
        np.testing.assert_allclose(float(z_loss), z_tok.sum() / 4.0, rtol=1e-5, atol=1e-9)
        assert float(weight_sum) == weights.sum()


def test_token_cross_entropy_equals_soft_target_form_and_its_gradient():
    rng = np.random.default_rng(3)
    logits = jnp.asarray(rng.normal(size=(3, 4, 9)).astype(np.float32) * 2)
    targets = jnp.asarray(rng.integers(0, 9, size=(3, 4)))
    for smoothing, z in [(0.0, 0.0), (0.1, 1e-2)]:
        low = smoothing / 8
        soft = jax.nn.one_hot(targets, 9) * (1.0 - smoothing - low) + low

        def by_gather(x, smoothing=smoothing, z=z):
            loss, z_term = token_cross_entropy(x, targets, smoothing, z)
            return jnp.sum(loss * jnp.arange(12.0).reshape(3, 4)), z_term

        def by_soft_targets(x, soft=soft, z=z):
            loss, z_term = cross_entropy_with_logits(x, soft, z)
            return jnp.sum(loss * jnp.arange(12.0).reshape(3, 4)), z_term

        (a, za), ga = jax.value_and_grad(by_gather, has_aux=True)(logits)
        (b, zb), gb = jax.value_and_grad(by_soft_targets, has_aux=True)(logits)
        np.testing.assert_allclose(a, b, rtol=1e-5)
        np.testing.assert_allclose(za, zb, rtol=1e-5)
        np.testing.assert_allclose(ga, gb, rtol=1e-5, atol=1e-6)


def test_loss_normalizing_factor_modes(encdec):
    model, params, batch = encdec
    batch = dict(batch)
    # Two sequences packed in row 0.
    batch["decoder_segment_ids"] = np.array(
        [[1, 1, 2, 2, 2, 2], [1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 0]], np.int32
    )
    batch["encoder_segment_ids"] = np.array([[1, 1, 1, 2, 2, 2, 2], [1, 1, 1, 1, 0, 0, 0], [1] * 7], np.int32)
    logits = np.asarray(model.compute_logits(params, batch))
    targets, weights = batch["decoder_target_tokens"], batch["decoder_loss_weights"]
    per_token, _ = _direct_loss(logits, targets, np.ones_like(weights), 0.1, 1e-4)
    seq_len = np.array([[2, 2, 4, 4, 4, 4], [4, 4, 4, 4, 1, 1], [5, 5, 5, 5, 5, 1]], np.float64)
    cases = {
        None: (per_token * weights).sum(),
        10.0: (per_token * weights).sum() / 10.0,
        "NUM_REAL_TARGET_TOKENS": (per_token * weights).sum() / weights.sum(),
        SpecialLossNormalizingFactor.NUM_TOTAL_TARGET_TOKENS: (per_token * weights).sum() / weights.size,
        "average_per_sequence": (per_token * weights / seq_len).sum() / (weights / seq_len).sum(),
    }

    @jax.jit
    def all_losses(params, batch):
        # One compilation for every mode (the forward passes are common subexpressions).
        models = [
            EncoderDecoderModel(model.config, z_loss=1e-4, label_smoothing=0.1, loss_normalizing_factor=f)
            for f in cases
        ]
        return [m.loss_fn(params, batch, None) for m in models]

    results = all_losses(params, batch)
    for (factor, want), (loss, _) in zip(cases.items(), results, strict=True):
        np.testing.assert_allclose(float(loss), want, rtol=2e-5, err_msg=str(factor))
    metrics = results[-1][1]  # AVERAGE_PER_SEQUENCE re-weights the loss, not the metrics
    assert 0.0 <= float(metrics["accuracy"]) <= 1.0
    np.testing.assert_allclose(float(metrics["nonpadding_fraction"]), weights.mean(), rtol=1e-6)
    with pytest.raises(ValueError, match="NUM_REAL_TARGET_TOKENS"):
        EncoderDecoderModel(model.config, loss_normalizing_factor="per_token").loss_fn(params, batch, None)


def test_dropout_changes_loss_only_with_rng():
    model = EncoderDecoderModel(preset("t5_1_1_tiny", vocab_size=VOCAB, dropout_rate=0.3))
    batch = _encdec_batch()
    params = model.get_initial_variables(jax.random.PRNGKey(0), {k: v.shape for k, v in batch.items()})[
        "params"
    ]
    plain = float(model.loss_fn(params, batch, None)[0])
    assert plain == pytest.approx(float(model.eval_fn(params, batch)[0]))
    dropped = [float(model.loss_fn(params, batch, jax.random.PRNGKey(i))[0]) for i in range(2)]
    assert dropped[0] != plain and dropped[0] != dropped[1]


def test_tiny_model_loss_falls_with_optax(encdec):
    model, params, batch = encdec
    opt = optax.adam(3e-2)
    state = opt.init(params)

    @jax.jit
    def step(params, state, rng):
        (loss, _), grads = jax.value_and_grad(model.loss_fn, has_aux=True)(params, batch, rng)
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state, loss

    losses = []
    for i in range(12):
        params, state, loss = step(params, state, jax.random.PRNGKey(i))
        losses.append(float(loss))
    assert losses[-1] < 0.5 * losses[0], losses


def test_prefix_lm_greedy_continuation_is_argmax_of_full_logits(prefix_lm):
    model, params, batch = prefix_lm
    cont, aux = model.predict_batch_with_aux(params, batch, decoder_params={"temperature": 0.0})
    cont = np.asarray(cont)
    prompt_len = batch["decoder_causal_attention"].sum(1) - 1
    assert cont.shape == (2, 8) and aux["scores"].shape == (2,)
    for b in range(2):
        n = 8 - prompt_len[b]
        assert np.all(cont[b, n:] == 0), cont[b]
        # Teacher-force prompt + continuation and check each token is the argmax.
        full = np.concatenate([batch["decoder_target_tokens"][b, : prompt_len[b]], cont[b, :n]])
        one = {
            "decoder_target_tokens": full[None],
            "decoder_input_tokens": np.concatenate([[0], full[:-1]])[None].astype(np.int32),
            "decoder_causal_attention": batch["decoder_causal_attention"][b : b + 1],
        }
        logits = np.asarray(model.compute_logits(params, one))[0]
        for i in range(n):
            if i > 0 and cont[b, i - 1] == model.eos_id:
                break
            assert cont[b, i] == np.argmax(logits[prompt_len[b] + i]), (b, i)


def _while_bodies(hlo: str) -> list[str]:
    names = set(re.findall(r"body=%([\w.\-]+)", hlo))
    return [m.group(0) for m in re.finditer(r"^%([\w.\-]+) .*?^}", hlo, re.M | re.S) if m.group(1) in names]


@pytest.mark.parametrize("rows", [1, 2])
def test_decoding_loop_updates_the_kv_cache_in_place(encdec, prefix_lm, rows):
    # A copy of a [batch, heads, head_dim, length] cache array inside the loop is a whole
    # cache read and written per step, on top of the one-slot write.
    # (Beam search reorders the cache every step by design; sampling only appends to it.)
    sampled = EncoderDecoderModel(encdec[0].config, decode_fn=decoding.temperature_sample)
    causal = DecoderOnlyModel(prefix_lm[0].config)  # prompt prefilled, then decoded causally
    for model, params, batch in ((sampled, *encdec[1:]), prefix_lm, (causal, *prefix_lm[1:])):
        batch = {k: v[:rows] for k, v in batch.items()}
        predict = jax.jit(lambda p, b, m=model: m.predict_batch_with_aux(p, b)[0])
        # At the optimisation level users run (conftest lowers it for these tests' speed).
        compiled = predict.lower(params, batch).compile({"xla_backend_optimization_level": 3})
        bodies = _while_bodies(compiled.as_text())
        assert bodies, "no decoding loop found"
        cache_copy = re.compile(r"= f32\[\d+(,\d+){3}\]\S* copy\(")
        copies = [line for body in bodies for line in body.splitlines() if cache_copy.search(line)]
        assert not copies, copies[:3]


def greedy_and_teacher_forced_logits(model, params, batch):
    """Greedy decodes of an encoder-decoder and its logits when fed those decodes back."""
    greedy = EncoderDecoderModel(model.config, decode_fn=decoding.temperature_sample)
    pred, _ = greedy.predict_batch_with_aux(params, batch, decoder_params={"temperature": 0.0})
    pred = np.asarray(pred)
    forced = dict(batch, decoder_target_tokens=np.where(pred > 0, pred, 2))
    forced["decoder_input_tokens"] = np.concatenate(
        [np.zeros((pred.shape[0], 1), np.int32), forced["decoder_target_tokens"][:, :-1]], 1
    )
    logits = np.asarray(model.compute_logits(params, forced))
    # Positions after a row's EOS (or padding) are not compared.
    live = [
        [i == 0 or pred[b, i - 1] not in (0, model.eos_id) for i in range(pred.shape[1])]
        for b in range(len(pred))
    ]
    return pred, logits, np.cumprod(live, axis=1).astype(bool)


def test_encdec_greedy_prediction_is_argmax_of_teacher_forced_logits(encdec):
    model, params, batch = encdec
    pred, logits, live = greedy_and_teacher_forced_logits(model, params, batch)
    np.testing.assert_array_equal(pred[live], np.argmax(logits, -1)[live])
    beams, aux = model.predict_batch_with_aux(params, batch, num_decodes=3, return_all_decodes=True)
    assert beams.shape == (3, 3, 6) and aux["scores"].shape == (3, 3)
    assert np.all(np.diff(np.asarray(aux["scores"]), axis=1) >= 0)


def test_bfloat16_matmuls_decode_like_their_teacher_forced_logits(encdec):
    model, params, batch = encdec
    rounded = EncoderDecoderModel(dataclasses.replace(model.config, matmul_dtype="bfloat16"))
    pred, logits, live = greedy_and_teacher_forced_logits(rounded, params, batch)
    top2 = np.sort(logits, -1)[..., -2:]
    # Cached and full-sequence products round alike; near-ties within rounding may differ.
    agree = (pred == np.argmax(logits, -1)) | (top2[..., 1] - top2[..., 0] < 1e-2)
    assert np.all(agree[live]), (pred, np.argmax(logits, -1))


def test_missing_feature_and_bad_shapes_are_named(encdec, prefix_lm):
    model, params, batch = encdec
    partial = {k: v for k, v in batch.items() if k != "decoder_target_tokens"}
    with pytest.raises(ValueError, match="missing feature 'decoder_target_tokens'"):
        model.loss_fn(params, partial, None)
    with pytest.raises(
        ValueError, match=r"'encoder_input_tokens' must be \[batch, length\], got shape \(7,\)"
    ):
        model.score_batch(params, dict(batch, encoder_input_tokens=batch["encoder_input_tokens"][0]))
    lm, lm_params, lm_batch = prefix_lm
    with pytest.raises(ValueError, match="missing feature 'decoder_causal_attention'"):
        lm.predict_batch_with_aux(
            lm_params, {k: v for k, v in lm_batch.items() if k != "decoder_causal_attention"}
        )
    with pytest.raises(ValueError, match=r"max_decode_len=9 does not fit the KV cache.*\(3, 6\)"):
        model.predict_batch_with_aux(params, batch, decoder_params={"max_decode_len": 9})
    with pytest.raises(TypeError, match="needs a T5Config"):
        EncoderDecoderModel(preset("decoder_tiny"))


def _matmul_params(params):
    flat = traverse_util.flatten_dict(params, sep="/")
    return sum(int(np.prod(v.shape)) for k, v in flat.items() if k.endswith("kernel"))


def test_flops_per_token_counts_matmul_parameters(prefix_lm, encdec):
    lm, lm_params, _ = prefix_lm
    cfg = lm.config
    want = 6 * _matmul_params(lm_params) + 12 * cfg.num_layers * cfg.num_heads * cfg.head_dim * 8
    assert lm.flops_per_token({"decoder_target_tokens": 8}) == pytest.approx(want)
    model, params, _ = encdec
    c = model.config
    li, lt = 7, 6
    n = _matmul_params(params)
    # Decoder matmuls (and logits) run per target token, encoder ones (and cross-attention K/V) per input token.
    cross_kv = c.num_decoder_layers * 2 * c.emb_dim * c.num_heads * c.head_dim
    enc_n = _matmul_params(params["encoder"]) + cross_kv
    dec_n = n - enc_n
    hq = c.num_heads * c.head_dim
    total = li * (6 * enc_n + 12 * c.num_encoder_layers * hq * li) + lt * (
        6 * dec_n + 12 * c.num_decoder_layers * hq * (li + lt)
    )
    got = model.flops_per_token({"encoder_input_tokens": li, "decoder_target_tokens": lt})
    assert got == pytest.approx(total / (li + lt))
    with pytest.raises(ValueError, match="encoder_input_tokens"):
        model.flops_per_token({"decoder_target_tokens": 6})


def test_logits_via_embedding_scales_by_inverse_sqrt_emb_dim():
    model = DecoderOnlyModel(preset("decoder_tiny", vocab_size=VOCAB, logits_via_embedding=True))
    params = model.get_initial_variables(jax.random.PRNGKey(3), {"decoder_input_tokens": (1, 4)})["params"]
    assert "logits_dense" not in params["decoder"]
    tokens = np.array([[5, 6, 7, 8]], np.int32)
    captured = model.module.apply(
        {"params": params},
        tokens,
        tokens,
        enable_dropout=False,
        capture_intermediates=lambda m, _: m.name == "decoder_norm",
        mutable=["intermediates"],
    )
    logits, inter = captured
    normed = inter["intermediates"]["decoder"]["decoder_norm"]["__call__"][0]
    want = np.asarray(normed) @ np.asarray(params["decoder"]["token_embedder"]["embedding"]).T / np.sqrt(8)
    np.testing.assert_allclose(np.asarray(logits), want, rtol=1e-5, atol=1e-6)
    assert jnp.asarray(logits).dtype == jnp.float32
