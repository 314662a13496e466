"""t5x.utils, t5x.adafactor, t5x.trainer and the network modules: upstream's names and defaults."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t5x import adafactor, models, optimizers, trainer, training, utils
from t5x.examples.decoder_only import network as decoder_network
from t5x.examples.scalable_t5 import network as scalable_network
from t5x.examples.t5 import network as t5_network


def test_dataset_config_has_upstreams_fields_and_defaults():
    cfg = utils.DatasetConfig("task", {"inputs": 8}, "train", 4, True, None)
    assert (cfg.use_cached, cfg.pack, cfg.use_custom_packing_ops, cfg.module) == (False, False, False, None)
    assert cfg.use_memory_cache and cfg.trim_output_features


def test_checkpoint_configs_check_their_values():
    assert utils.SaveCheckpointConfig().dtype == "float32"
    with pytest.raises(ValueError, match="SaveCheckpointConfig.dtype"):
        utils.SaveCheckpointConfig(dtype="int8")
    assert utils.RestoreCheckpointConfig(path=[]).mode == "latest"
    with pytest.raises(ValueError, match="RestoreCheckpointConfig.mode"):
        utils.RestoreCheckpointConfig(path="x", mode="newest")


def test_learning_rate_scheduler_is_trainings():
    ours = utils.create_learning_rate_scheduler(
        factors="constant * rsqrt_decay", base_learning_rate=1.0, warmup_steps=4
    )
    reference = training.create_learning_rate_scheduler(
        factors="constant * rsqrt_decay", base_learning_rate=1.0, warmup_steps=4
    )
    for step in (0, 3, 4, 100):
        assert float(ours(step)) == pytest.approx(float(reference(step)))
    assert float(ours(100)) == pytest.approx(0.1)  # 1 / sqrt(100)


def test_adafactor_takes_upstreams_keywords_and_updates_as_training_does():
    params = {"w": jnp.arange(12.0).reshape(3, 4) / 10, "b": jnp.ones(4)}
    grads = jax.tree.map(lambda p: p * 0.5 + 0.1, params)
    ours = adafactor.Adafactor(
        decay_rate=0.8, step_offset=0, learning_rate=0.1, multiply_by_parameter_scale=False
    )
    reference = training.adafactor(
        decay_rate=0.8, step_offset=0, learning_rate=0.1, multiply_by_parameter_scale=False
    )
    ours = optimizers.to_optax(ours)  # the OptimizerDef trains as t5x.training's transformation
    got, _ = ours.update(grads, ours.init(params), params)
    want, _ = reference.update(grads, reference.init(params), params)
    for name in params:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-6)
    assert adafactor.standard_logical_factor_rules()["embed"] == adafactor.FactorDim.ROW


def test_trainer_keeps_the_settings_gin_binds():
    settings = trainer.Trainer(learning_rate_fn=abs, num_microbatches=2)
    assert (settings.learning_rate_fn, settings.num_microbatches) == (abs, 2)
    assert trainer.Trainer(num_microbatches=0).num_microbatches is None  # upstream's 0: no microbatching
    with pytest.raises(ValueError, match="num_microbatches"):
        trainer.Trainer(num_microbatches=-1)
    nan = trainer.TerminateOnNanAction(task="t")
    assert nan.run(None, {"t": {"loss": float("nan")}}) and not nan.run(None, {"t": {"loss": 1.0}})


def test_upstream_networks_build_our_models_with_module_keyword():
    config = t5_network.T5Config(vocab_size=64, emb_dim=16, num_heads=2, head_dim=8, mlp_dim=32)
    model = models.EncoderDecoderModel(
        module=t5_network.Transformer(config), optimizer_def="opt", z_loss=1e-4
    )
    assert model.config == config and isinstance(model.module, models.EncoderDecoderTransformer)
    assert model.optimizer_def == "opt" and model.z_loss == pytest.approx(1e-4)
    positional = models.EncoderDecoderModel(t5_network.Transformer(config))  # upstream's positional order
    assert positional.config == config
    with pytest.raises(TypeError, match="module must be a EncoderDecoderTransformer"):
        models.EncoderDecoderModel(module=config)
    dec_config = decoder_network.TransformerConfig(
        vocab_size=64, emb_dim=16, num_heads=2, num_layers=1, head_dim=8
    )
    decoder = models.DecoderOnlyModel(
        module=decoder_network.DecoderWrapper(dec_config), inputs_bidirectional_attention=True
    )
    assert decoder.config.num_layers == 1 and decoder.inputs_bidirectional_attention


def test_upstream_networks_draw_their_initial_params_from_the_whole_key():
    # Upstream's models hand module.init the key itself; the same key then gives upstream's
    # initial parameters. Our own networks split it into params and dropout streams.
    config = t5_network.T5Config(vocab_size=64, emb_dim=16, num_heads=2, head_dim=8, mlp_dim=32,
                                 num_encoder_layers=1, num_decoder_layers=1)  # fmt: skip
    shapes = {"encoder_input_tokens": (2, 5), "decoder_input_tokens": (2, 3)}
    key = jax.random.PRNGKey(7)
    enc, dec = jnp.ones((2, 5), jnp.int32), jnp.ones((2, 3), jnp.int32)
    direct = t5_network.Transformer(config).init(key, enc, dec, dec, enable_dropout=False)["params"]
    upstream = models.EncoderDecoderModel(module=t5_network.Transformer(config))
    ours = models.EncoderDecoderModel(config)
    via_model = upstream.get_initial_variables(key, shapes)["params"]
    for got, want in zip(
        jax.tree_util.tree_leaves(via_model), jax.tree_util.tree_leaves(direct), strict=True
    ):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)  # one compiled program vs op by op
    split = ours.get_initial_variables(key, shapes)["params"]
    assert not np.array_equal(split["encoder"]["relpos_bias"]["rel_embedding"],
                              direct["encoder"]["relpos_bias"]["rel_embedding"])  # fmt: skip


def test_scalable_t5_config_scans_layers_by_default():
    config = scalable_network.T5Config(vocab_size=64)
    assert config.scan_layers and config.param_scan_axis == 1
    assert dataclasses.replace(config, scan_layers=False).scan_layers is False
    with pytest.raises(ValueError, match="param_scan_axis"):
        scalable_network.T5Config(vocab_size=64, param_scan_axis=0)
