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
    MoeBlock,
    MoeDecoderOnlyConfig,
    MoeDecoderOnlyModel,
    MoeEncoderDecoderModel,
    dense_twin,
    moe_preset,
    scan_moe_params,
    unscan_moe_params,
    upcycle_params,
)

SHAPES = {"encoder_input_tokens": (8, 8), "decoder_input_tokens": (8, 6)}


@pytest.fixture(scope="module")
def model_and_params(tiny_config):
    model = MoeEncoderDecoderModel(tiny_config)
    variables = model.get_initial_variables(jax.random.PRNGKey(0), SHAPES)
    return model, variables["params"], variables["params_axes"]


def test_expert_parameters_have_flaxformer_names_and_axes(model_and_params, tiny_config):
    _, params, params_axes = model_and_params
    flat = {"/".join(k): v.shape for k, v in traverse_util.flatten_dict(params).items()}
    axes = {"/".join(k): v.names for k, v in traverse_util.flatten_dict(params_axes).items()}
    assert flat["encoder/layers_1/mlp/expert/wi/kernel"] == (4, 16, 32)
    assert flat["decoder/layers_1/mlp/expert/wo/kernel"] == (4, 32, 16)
    assert flat["encoder/layers_1/mlp/router/router_weights/w/kernel"] == (16, 4)
    assert "encoder/layers_0/mlp/wi/kernel" in flat  # layer 0 stays dense (period 2)
    assert axes["encoder/layers_1/mlp/expert/wi/kernel_axes"] == ("expert", "embed", "mlp")
    assert axes["encoder/layers_1/mlp/router/router_weights/w/kernel_axes"] == ("embed", "unmodeled")


def test_loss_adds_the_weighted_router_losses(model_and_params, tiny_config, random_batch):
    model, params, _ = model_and_params  # aux_loss_factor 0.01, router_z_loss_factor 0
    batch = random_batch(0)
    loss, metrics = model.loss_fn(params, batch, None)
    base = float(metrics["cross_ent_loss"]) + float(metrics["z_loss"])
    heavy = MoeEncoderDecoderModel(tiny_config, aux_loss_factor=0.5, router_z_loss_factor=0.1)
    heavy_loss, heavy_metrics = heavy.loss_fn(params, batch, None)
    aux = float(metrics["experts/auxiliary_loss"]) / 0.01
    z = float(heavy_metrics["experts/router_z_loss"]) / 0.1
    np.testing.assert_allclose(
        float(heavy_metrics["cross_ent_loss"]), float(metrics["cross_ent_loss"]), rtol=1e-6
    )
    np.testing.assert_allclose(float(heavy_metrics["experts/auxiliary_loss"]) / 0.5, aux, rtol=1e-5)
    np.testing.assert_allclose(float(loss), base + 0.01 * aux, rtol=1e-6)
    np.testing.assert_allclose(float(heavy_loss), base + 0.5 * aux + 0.1 * z, rtol=1e-6)
    assert float(metrics["experts/router_z_loss"]) == 0.0
    assert 0.5 < aux <= 4.0  # 1 for uniform routing, num_experts when every token picks one expert
    assert z > 0.0
    for name in ("fraction_tokens_left_behind", "expert_usage", "router_confidence"):
        assert 0.0 <= float(metrics[f"experts/{name}"]) <= 1.0


def test_capacity_drops_jitter_and_determinism(tiny_config, random_batch):
    # One slot per expert (eval) and strong jitter (training).
    cfg = dataclasses.replace(tiny_config, eval_capacity_factor=0.25, min_expert_capacity=1, jitter_noise=0.5)
    model = MoeEncoderDecoderModel(cfg)
    params = model.get_initial_variables(jax.random.PRNGKey(0), SHAPES)["params"]
    batch = random_batch(1)
    _, metrics = model.loss_fn(params, batch, None)
    # At most 4 of a group's 8 (encoder) or 6 (decoder) tokens are routed.
    assert float(metrics["experts/fraction_tokens_left_behind"]) >= (0.5 + 1 / 3) / 2 - 1e-6
    assert 0.0 < float(metrics["experts/expert_usage"]) <= 1.0
    again = model.loss_fn(params, batch, None)[1]
    assert float(again["experts/router_confidence"]) == float(metrics["experts/router_confidence"])
    # Jitter is drawn from the dropout RNG: two keys, two routings.
    a = model.loss_fn(params, batch, jax.random.PRNGKey(1))[1]["experts/router_confidence"]
    b = model.loss_fn(params, batch, jax.random.PRNGKey(2))[1]["experts/router_confidence"]
    assert float(a) != float(b)


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


@pytest.fixture(scope="module")
def dense_model(tiny_config):
    dense = EncoderDecoderModel(dense_twin(tiny_config))
    return dense, dense.get_initial_variables(jax.random.PRNGKey(5), SHAPES)["params"]


def _moe_shapes(cfg):
    model = MoeEncoderDecoderModel(cfg)
    return model, jax.eval_shape(
        lambda rng: model.get_initial_variables(rng, SHAPES)["params"], jax.random.PRNGKey(6)
    )


def _zero_routers(params):
    flat = traverse_util.flatten_dict(params)
    return traverse_util.unflatten_dict(
        {k: (np.zeros(np.shape(v), np.float32) if "router" in k else v) for k, v in flat.items()}
    )


def test_upcycled_from_a_checkpoint_with_one_expert_reproduces_the_dense_model(
    tmp_path, tiny_config, dense_model, random_batch
):
    # One expert: the router's softmax is exactly 1, every token goes to it with weight 1.
    from t5x.checkpointing import save_t5x_checkpoint

    dense, dense_params = dense_model
    save_t5x_checkpoint(tmp_path, 10, {"target": dense_params, "state": {"step": np.int32(10)}})
    cfg = dataclasses.replace(tiny_config, num_experts=1, eval_capacity_factor=1.0)
    model = MoeEncoderDecoderModel(cfg, upcycle_from=str(tmp_path))
    params = model.get_initial_variables(jax.random.PRNGKey(6), SHAPES)["params"]
    got = np.asarray(params["decoder"]["layers_1"]["mlp"]["expert"]["wo"]["kernel"])
    np.testing.assert_array_equal(
        got[0], np.asarray(dense_params["decoder"]["layers_1"]["mlp"]["wo"]["kernel"])
    )
    assert np.any(np.asarray(params["decoder"]["layers_1"]["mlp"]["router"]["router_weights"]["w"]["kernel"]))
    batch = random_batch(4)
    want = np.asarray(dense.compute_logits(dense_params, batch))
    np.testing.assert_allclose(np.asarray(model.compute_logits(params, batch)), want, rtol=1e-5, atol=1e-5)


def test_upcycled_top_all_reproduces_the_dense_model(tiny_config, dense_model, random_batch):
    # Four copies of the dense MLP, every token routed to all of them (a zero router: weights
    # 1/4 each, summing to 1), capacity for every token.
    dense, dense_params = dense_model
    cfg = dataclasses.replace(tiny_config, num_experts=4, num_selected_experts=4, eval_capacity_factor=4.0)
    model, fresh = _moe_shapes(cfg)
    params = upcycle_params(dense_params, fresh, cfg)
    flat = traverse_util.flatten_dict(params)
    wi = np.asarray(flat[("encoder", "layers_1", "mlp", "expert", "wi", "kernel")])
    for e in range(4):
        np.testing.assert_array_equal(
            wi[e], np.asarray(dense_params["encoder"]["layers_1"]["mlp"]["wi"]["kernel"])
        )
    params = _zero_routers(params)
    batch = random_batch(4)
    want = np.asarray(dense.compute_logits(dense_params, batch))
    np.testing.assert_allclose(np.asarray(model.compute_logits(params, batch)), want, rtol=1e-5, atol=1e-5)


def test_upcycle_shape_mismatch_is_named(tiny_config, dense_model):
    cfg = dataclasses.replace(tiny_config, expert_mlp_dim=48)
    _, fresh = _moe_shapes(cfg)
    with pytest.raises(
        ValueError, match=r"mlp/wi/kernel' has shape \(16, 32\) but one expert of .* needs \(16, 48\)"
    ):
        upcycle_params(dense_model[1], fresh, cfg)
    partial = {k: v for k, v in dense_model[1].items() if k != "token_embedder"}
    with pytest.raises(ValueError, match="the dense checkpoint has no 'token_embedder/embedding'"):
        upcycle_params(partial, _moe_shapes(tiny_config)[1], tiny_config)


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


@pytest.fixture(scope="module")
def scanned_pair(tiny_config):
    # 4 + 2 layers, period 2: the encoder scans two blocks (dense, sparse), the decoder one.
    cfg = dataclasses.replace(tiny_config, num_encoder_layers=4, eval_capacity_factor=8.0)
    scanned_cfg = dataclasses.replace(cfg, scan_layers=True)
    sample = decoding.temperature_sample  # greedy below: cheaper to compile than beam search
    model = MoeEncoderDecoderModel(cfg, decode_fn=sample)
    scanned = MoeEncoderDecoderModel(scanned_cfg, decode_fn=sample)
    params = model.get_initial_variables(jax.random.PRNGKey(7), SHAPES)["params"]
    return cfg, model, scanned, params


def test_scanned_moe_matches_unscanned_with_restacked_params(scanned_pair, random_batch):
    cfg, model, scanned, params = scanned_pair
    fresh = jax.eval_shape(lambda rng: scanned.get_initial_variables(rng, SHAPES), jax.random.PRNGKey(7))
    restacked = scan_moe_params(params, cfg)
    shapes = {"/".join(k): np.shape(v) for k, v in traverse_util.flatten_dict(restacked).items()}
    assert shapes == {"/".join(k): v.shape for k, v in traverse_util.flatten_dict(fresh["params"]).items()}
    # Upstream's scanned MoE layout: [experts, layers, embed, mlp] experts, [embed, layers, experts] router.
    assert shapes["encoder/layers/subblock_1/mlp/expert/wi/kernel"] == (4, 2, 16, 32)
    assert shapes["encoder/layers/subblock_1/mlp/router/router_weights/w/kernel"] == (16, 2, 4)
    assert shapes["encoder/layers/subblock_0/mlp/wi/kernel"] == (16, 2, 32)
    axes = traverse_util.flatten_dict(fresh["params_axes"])
    assert axes[("encoder", "layers", "subblock_1", "mlp", "expert", "wi", "kernel_axes")].names == (
        "expert",
        "layers",
        "embed",
        "mlp",
    )
    np.testing.assert_array_equal(
        restacked["encoder"]["layers"]["subblock_1"]["mlp"]["expert"]["wo"]["kernel"][:, 1],
        params["encoder"]["layers_3"]["mlp"]["expert"]["wo"]["kernel"],
    )
    back = traverse_util.flatten_dict(unscan_moe_params(restacked, cfg))
    assert all(np.array_equal(back[k], v) for k, v in traverse_util.flatten_dict(params).items())
    batch = random_batch(5)
    loss, metrics = model.loss_fn(params, batch, None)
    scanned_loss, scanned_metrics = scanned.loss_fn(restacked, batch, None)
    np.testing.assert_allclose(float(scanned_loss), float(loss), rtol=1e-6)
    for name in ("auxiliary_loss", "expert_usage", "fraction_tokens_left_behind", "router_confidence"):
        np.testing.assert_allclose(
            float(scanned_metrics[f"experts/{name}"]), float(metrics[f"experts/{name}"]), rtol=1e-6
        )
    # Decoding steps through the scanned cache and gives the unscanned model's tokens.
    greedy = {"temperature": 0.0, "max_decode_steps": 4}
    want, _ = model.predict_batch_with_aux(params, batch, decoder_params=greedy)
    got, _ = scanned.predict_batch_with_aux(restacked, batch, decoder_params=greedy)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_upcycling_into_a_scanned_moe(tiny_config, dense_model, model_and_params):
    cfg = dataclasses.replace(tiny_config, scan_layers=True)
    fresh = scan_moe_params(model_and_params[1], tiny_config)  # the scanned init's tree (test above)
    upcycled = upcycle_params(dense_model[1], fresh, cfg)
    assert set(traverse_util.flatten_dict(upcycled)) == set(traverse_util.flatten_dict(fresh))
    flat = traverse_util.flatten_dict(unscan_moe_params(upcycled, tiny_config))
    dense_wi = np.asarray(dense_model[1]["decoder"]["layers_1"]["mlp"]["wi"]["kernel"])
    for e in range(4):
        np.testing.assert_array_equal(
            flat[("decoder", "layers_1", "mlp", "expert", "wi", "kernel")][e], dense_wi
        )
    router = ("encoder", "layers", "subblock_1", "mlp", "router", "router_weights", "w", "kernel")
    np.testing.assert_array_equal(
        traverse_util.flatten_dict(upcycled)[router], traverse_util.flatten_dict(fresh)[router]
    )


def test_routing_groups_of_whole_sequences(tiny_config):
    # Capacity binds (0.5 of an even split), so how tokens are grouped changes who is dropped.
    cfg = dataclasses.replace(tiny_config, eval_capacity_factor=0.5, min_expert_capacity=1)
    x = np.random.default_rng(4).standard_normal((4, 6, cfg.emb_dim)).astype(np.float32)
    per_sequence = MoeBlock(config=cfg)
    params = per_sequence.init(jax.random.PRNGKey(0), x, deterministic=True)

    def run(config, inputs):
        return np.asarray(MoeBlock(config=config).apply(params, inputs, deterministic=True))

    pairs = run(dataclasses.replace(cfg, sequences_per_group=2), x)
    # A group of two sequences routes as one 12-token sequence does.
    np.testing.assert_allclose(pairs, run(cfg, x.reshape(2, 12, -1)).reshape(x.shape), rtol=1e-6, atol=1e-6)
    assert not np.allclose(pairs, run(cfg, x), atol=1e-4)
    # A batch the setting does not divide (3 rows, e.g. decoding) groups gcd(2, 3) = 1 sequence.
    np.testing.assert_allclose(run(dataclasses.replace(cfg, sequences_per_group=2), x[:3]), run(cfg, x[:3]),
                               rtol=1e-6, atol=1e-6)  # fmt: skip
    with pytest.raises(ValueError, match="sequences_per_group must be a positive int, got 0"):
        dataclasses.replace(cfg, sequences_per_group=0)


def test_stacks_hand_the_padding_to_the_router(tiny_config, random_batch):
    # Slots for every token (nothing dropped), so what is left behind is exactly what is ignored.
    batch = dict(random_batch(5))
    batch["encoder_input_tokens"] = batch["encoder_input_tokens"].copy()
    batch["encoder_input_tokens"][:, 5:] = 0  # 3 of 8 input tokens are padding
    batch["decoder_target_tokens"] = batch["decoder_target_tokens"].copy()
    batch["decoder_target_tokens"][:4, 3:] = 0  # half the rows end after 3 of 6 targets
    cfg = dataclasses.replace(tiny_config, eval_capacity_factor=8.0)
    params = MoeEncoderDecoderModel(cfg).get_initial_variables(jax.random.PRNGKey(0), SHAPES)["params"]

    def left_behind(ignore: bool) -> float:
        model = MoeEncoderDecoderModel(dataclasses.replace(cfg, ignore_padding_tokens=ignore))
        return float(model.loss_fn(params, batch, None)[1]["experts/fraction_tokens_left_behind"])

    assert abs(left_behind(False)) < 1e-6
    # The mean over the encoder's and the decoder's MoE layer of each one's padding share.
    np.testing.assert_allclose(left_behind(True), (3 / 8 + 0.5 * 3 / 6) / 2, rtol=1e-6)
