"""MoE models: router losses in the loss, decoding unchanged, sparse upcycling."""

import dataclasses

import jax
import numpy as np
import optax
import pytest
from flax import traverse_util

from t5x import decoding
from t5x.models import EncoderDecoderModel
from t5x.moe import (
    MoeDecoderOnlyConfig,
    MoeDecoderOnlyModel,
    MoeEncoderDecoderModel,
    dense_twin,
    moe_preset,
    upcycle_params,
)

SHAPES = {"encoder_input_tokens": (8, 8), "decoder_input_tokens": (8, 6)}


@pytest.fixture(scope="module")
def model_and_params(tiny_config):
    model = MoeEncoderDecoderModel(tiny_config)
    return model, model.get_initial_variables(jax.random.PRNGKey(0), SHAPES)["params"]


def test_expert_parameters_have_flaxformer_names_and_axes(model_and_params, tiny_config):
    model, params = model_and_params
    variables = model.get_initial_variables(jax.random.PRNGKey(0), SHAPES)
    flat = {"/".join(k): v.shape for k, v in traverse_util.flatten_dict(params).items()}
    axes = {"/".join(k): v.names for k, v in traverse_util.flatten_dict(variables["params_axes"]).items()}
    assert flat["encoder/layers_1/mlp/expert/wi/kernel"] == (4, 16, 32)
    assert flat["decoder/layers_1/mlp/expert/wo/kernel"] == (4, 32, 16)
    assert flat["encoder/layers_1/mlp/router/router_weights/w/kernel"] == (16, 4)
    assert "encoder/layers_0/mlp/wi/kernel" in flat  # layer 0 stays dense (period 2)
    assert axes["encoder/layers_1/mlp/expert/wi/kernel_axes"] == ("expert", "embed", "mlp")
    assert axes["encoder/layers_1/mlp/router/router_weights/w/kernel_axes"] == ("embed", "unmodeled")


def test_loss_adds_the_weighted_router_losses(model_and_params, tiny_config, random_batch):
    model, params = model_and_params
    batch = random_batch(0)
    loss, metrics = model.loss_fn(params, batch, None)
    plain = MoeEncoderDecoderModel(tiny_config, aux_loss_factor=0.0)
    base, _ = plain.loss_fn(params, batch, None)
    heavy = MoeEncoderDecoderModel(tiny_config, aux_loss_factor=0.5, router_z_loss_factor=0.1)
    heavy_loss, heavy_metrics = heavy.loss_fn(params, batch, None)
    aux = float(metrics["experts/auxiliary_loss"]) / 0.01
    z = float(heavy_metrics["experts/router_z_loss"]) / 0.1
    np.testing.assert_allclose(float(loss), float(base) + 0.01 * aux, rtol=1e-6)
    np.testing.assert_allclose(float(heavy_loss), float(base) + 0.5 * aux + 0.1 * z, rtol=1e-6)
    assert aux >= 1.0 - 1e-5  # the balancing loss is at least 1 (uniform routing)
    np.testing.assert_allclose(float(metrics["cross_ent_loss"]), float(base), rtol=1e-6)
    for name in ("fraction_tokens_left_behind", "expert_usage", "router_confidence"):
        assert 0.0 <= float(metrics[f"experts/{name}"]) <= 1.0


def test_capacity_drops_are_counted(tiny_config, random_batch):
    cfg = dataclasses.replace(tiny_config, eval_capacity_factor=0.25, min_expert_capacity=1)
    model = MoeEncoderDecoderModel(cfg)
    params = model.get_initial_variables(jax.random.PRNGKey(0), SHAPES)["params"]
    _, metrics = model.loss_fn(params, random_batch(1), None)
    # One slot per expert: at most 4 of a group's 8 (encoder) or 6 (decoder) tokens are routed.
    assert float(metrics["experts/fraction_tokens_left_behind"]) >= (0.5 + 1 / 3) / 2 - 1e-6
    assert 0.0 < float(metrics["experts/expert_usage"]) <= 1.0


def test_jitter_and_dropout_use_the_dropout_rng(tiny_config, random_batch):
    cfg = dataclasses.replace(tiny_config, jitter_noise=0.5)
    model = MoeEncoderDecoderModel(cfg)
    params = model.get_initial_variables(jax.random.PRNGKey(0), SHAPES)["params"]
    batch = random_batch(2)
    a = model.loss_fn(params, batch, jax.random.PRNGKey(1))[1]["experts/router_confidence"]
    b = model.loss_fn(params, batch, jax.random.PRNGKey(2))[1]["experts/router_confidence"]
    c = model.loss_fn(params, batch, None)[1]["experts/router_confidence"]
    d = model.loss_fn(params, batch, None)[1]["experts/router_confidence"]
    assert float(a) != float(b)
    assert float(c) == float(d)


def test_decoding_greedy_and_beam_work_unchanged(tiny_config, random_batch):
    cfg = dataclasses.replace(
        tiny_config, eval_capacity_factor=8.0
    )  # no drops: steps route like teacher forcing
    model = MoeEncoderDecoderModel(cfg, decode_fn=decoding.beam_search)
    params = model.get_initial_variables(jax.random.PRNGKey(0), SHAPES)["params"]
    batch = random_batch(3)
    beams, aux = model.predict_batch_with_aux(params, batch, num_decodes=3)
    assert beams.shape == (8, 6) and aux["scores"].shape == (8,)
    greedy_model = MoeEncoderDecoderModel(cfg, decode_fn=decoding.temperature_sample)
    greedy, _ = greedy_model.predict_batch_with_aux(
        params, batch, decoder_params={"temperature": 0.0, "max_decode_steps": 6}
    )
    # Greedy decoding picks, at every position, the argmax of the teacher-forced logits.
    forced = np.asarray(greedy)
    shifted = np.concatenate([np.zeros((8, 1), np.int32), forced[:, :-1]], axis=1)
    teacher = {**batch, "decoder_input_tokens": shifted, "decoder_target_tokens": np.maximum(forced, 1)}
    logits = np.asarray(greedy_model.compute_logits(params, teacher))
    alive = np.cumsum(forced == 1, axis=1) - (forced == 1) == 0  # positions up to the first EOS
    np.testing.assert_array_equal(np.argmax(logits, -1)[alive], forced[alive])


def test_decoder_only_trains_and_samples():
    cfg = MoeDecoderOnlyConfig(
        vocab_size=32,
        emb_dim=16,
        num_heads=2,
        head_dim=8,
        mlp_dim=32,
        num_layers=2,
        dropout_rate=0.0,
        num_experts=4,
        num_selected_experts=2,
    )
    model = MoeDecoderOnlyModel(cfg)
    params = model.get_initial_variables(jax.random.PRNGKey(0), {"decoder_input_tokens": (4, 8)})["params"]
    tokens = np.tile(np.arange(1, 9, dtype=np.int32), (4, 1))
    batch = {
        "decoder_input_tokens": np.concatenate([np.zeros((4, 1), np.int32), tokens[:, :-1]], 1),
        "decoder_target_tokens": tokens,
    }
    opt = optax.adam(3e-2)
    state = opt.init(params)
    grad_fn = jax.jit(jax.value_and_grad(lambda p: model.loss_fn(p, batch, None)[0]))
    first = None
    for _ in range(15):
        loss, grads = grad_fn(params)
        first = float(loss) if first is None else first
        updates, state = opt.update(grads, state)
        params = optax.apply_updates(params, updates)
    assert float(loss) < 0.5 * first
    prompt = {**batch, "decoder_causal_attention": np.concatenate([np.ones((4, 2)), np.zeros((4, 6))], 1)}
    out, _ = model.predict_batch_with_aux(params, prompt)
    assert out.shape == (4, 8)


def _dense_and_upcycled(tiny_config, **moe):
    cfg = dataclasses.replace(tiny_config, **moe)
    dense = EncoderDecoderModel(dense_twin(cfg))
    dense_params = dense.get_initial_variables(jax.random.PRNGKey(5), SHAPES)["params"]
    model = MoeEncoderDecoderModel(cfg)
    fresh = model.get_initial_variables(jax.random.PRNGKey(6), SHAPES)["params"]
    return dense, dense_params, model, upcycle_params(dense_params, fresh, cfg)


def test_upcycled_one_expert_reproduces_the_dense_model(tiny_config, random_batch):
    # One expert: the router's softmax is exactly 1, every token goes to it with weight 1.
    dense, dense_params, model, params = _dense_and_upcycled(
        tiny_config, num_experts=1, eval_capacity_factor=1.0
    )
    batch = random_batch(4)
    want = np.asarray(dense.compute_logits(dense_params, batch))
    np.testing.assert_allclose(np.asarray(model.compute_logits(params, batch)), want, rtol=1e-5, atol=1e-5)


def test_upcycled_top_all_reproduces_the_dense_model(tiny_config, random_batch):
    # Four copies of the dense MLP, every token routed to all of them: weights sum to 1.
    dense, dense_params, model, params = _dense_and_upcycled(
        tiny_config, num_experts=4, num_selected_experts=4, eval_capacity_factor=4.0
    )
    batch = random_batch(4)
    want = np.asarray(dense.compute_logits(dense_params, batch))
    np.testing.assert_allclose(np.asarray(model.compute_logits(params, batch)), want, rtol=1e-5, atol=1e-5)
    flat = traverse_util.flatten_dict(params)
    wi = np.asarray(flat[("encoder", "layers_1", "mlp", "expert", "wi", "kernel")])
    dense_wi = np.asarray(dense_params["encoder"]["layers_1"]["mlp"]["wi"]["kernel"])
    for e in range(4):
        np.testing.assert_array_equal(wi[e], dense_wi)


def test_upcycle_shape_mismatch_is_named(tiny_config):
    cfg = dataclasses.replace(tiny_config, expert_mlp_dim=48)
    dense = EncoderDecoderModel(dense_twin(tiny_config))
    dense_params = dense.get_initial_variables(jax.random.PRNGKey(5), SHAPES)["params"]
    fresh = MoeEncoderDecoderModel(cfg).get_initial_variables(jax.random.PRNGKey(6), SHAPES)["params"]
    with pytest.raises(
        ValueError, match=r"mlp/wi/kernel' has shape \(16, 32\) but one expert of .* needs \(16, 48\)"
    ):
        upcycle_params(dense_params, fresh, cfg)


def test_upcycle_from_a_dense_checkpoint(tmp_path, tiny_config):
    from t5x.checkpointing import save_t5x_checkpoint

    dense = EncoderDecoderModel(dense_twin(tiny_config))
    dense_params = dense.get_initial_variables(jax.random.PRNGKey(5), SHAPES)["params"]
    save_t5x_checkpoint(tmp_path, 10, {"target": dense_params, "state": {"step": np.int32(10)}})
    model = MoeEncoderDecoderModel(tiny_config, upcycle_from=str(tmp_path))
    params = model.get_initial_variables(jax.random.PRNGKey(6), SHAPES)["params"]
    got = np.asarray(params["decoder"]["layers_1"]["mlp"]["expert"]["wo"]["kernel"])
    want = np.asarray(dense_params["decoder"]["layers_1"]["mlp"]["wo"]["kernel"])
    np.testing.assert_array_equal(got[2], want)
    np.testing.assert_array_equal(
        np.asarray(params["token_embedder"]["embedding"]),
        np.asarray(dense_params["token_embedder"]["embedding"]),
    )


def test_active_flops_and_presets(tiny_config):
    model = MoeEncoderDecoderModel(tiny_config)
    lengths = {"encoder_input_tokens": 8, "decoder_target_tokens": 6}
    dense = EncoderDecoderModel(dense_twin(tiny_config)).flops_per_token(lengths)
    router = 6 * 16 * 4 * (8 + 6) / 14  # one router per stack
    assert model.flops_per_token(lengths) == pytest.approx(dense + router)
    top2 = MoeEncoderDecoderModel(dataclasses.replace(tiny_config, num_selected_experts=2))
    assert top2.flops_per_token(lengths) == pytest.approx(dense + router + 6 * 2 * 16 * 32)
    base = moe_preset("switch_base")
    assert (base.num_experts, base.emb_dim, base.mlp_dim, base.num_encoder_layers) == (64, 768, 3072, 12)
    with pytest.raises(KeyError, match="unknown MoE preset"):
        moe_preset("switch_huge")
