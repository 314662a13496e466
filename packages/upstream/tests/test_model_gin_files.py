"""The shipped mT5, ByT5, UMT5, AdamW and local_tiny gin files build upstream's published models."""

import os
import pathlib
import subprocess
import sys

import gin
import jax
import numpy as np
import optax
import pytest
from _upstream_fixtures import TASK, write_experiment
from test_gin_files import _clean_gin, _model  # noqa: F401 (_clean_gin: autouse, clears gin)

from t5x import adafactor, models, optimizers, seqio, training
from t5x.examples.scalable_t5 import network as scalable_network
from t5x.examples.t5 import network as t5_network
from t5x.launch._gin_config import GinArgs, macro_value, parse_gin

SIZES = ["small", "base", "large", "xl", "xxl"]
ARCHITECTURE = (
    "vocab_size", "emb_dim", "num_heads", "num_encoder_layers", "num_decoder_layers", "head_dim", "mlp_dim",
)  # fmt: skip
MC4_VOCABULARY = "gs://t5-data/vocabs/mc4.250000.100extra/sentencepiece.model"
UMT5_VOCABULARY = "gs://t5-data/vocabs/umt5.256000/sentencepiece.model"
# Upstream's umt5/pretrain_large.gin uses mT5 Large's sizes; t5x.models has no umt5_large preset.
UMT5_PRESETS = {"small": "umt5_small", "base": "umt5_base", "xl": "umt5_xl", "xxl": "umt5_xxl"}
UMT5_PIECES = [
    "t5x/examples/scalable_t5/umt5/architectures/encoder_decoder.gin",
    "t5x/examples/scalable_t5/umt5/optimizer/adafactor.gin",
    "t5x/examples/scalable_t5/umt5/vocab.gin",
]


def _architecture(config):
    return {field: getattr(config, field) for field in ARCHITECTURE}


def _assert_t5_1_1_family(model):
    """What every mT5 / ByT5 file keeps from T5.1.1's base file."""
    assert isinstance(model, models.EncoderDecoderModel)
    assert model.config.mlp_activations == ("gelu", "linear") and not model.config.logits_via_embedding
    assert model.config.dtype == "bfloat16" and model.z_loss == pytest.approx(1e-4)
    assert model.label_smoothing == 0.0 and model.loss_normalizing_factor is None
    assert isinstance(model.optimizer_def, adafactor.Adafactor)
    assert model.optimizer_def.hyper_params.decay_rate == 0.8
    assert isinstance(optimizers.to_optax(model.optimizer_def), training.Adafactor)


def _param_count(model):
    shapes = {"encoder_input_tokens": (1, 8), "decoder_input_tokens": (1, 8)}
    abstract = jax.eval_shape(lambda: model.get_initial_variables(jax.random.PRNGKey(0), shapes))
    return sum(int(np.prod(leaf.shape)) for leaf in jax.tree_util.tree_leaves(abstract["params"]))


def _flat_param_shapes(model):
    from flax import traverse_util

    shapes = {"encoder_input_tokens": (1, 8), "decoder_input_tokens": (1, 8)}
    abstract = jax.eval_shape(lambda: model.get_initial_variables(jax.random.PRNGKey(0), shapes))
    return {k: v.shape for k, v in traverse_util.flatten_dict(abstract["params"], sep="/").items()}


# ---- mT5 --------------------------------------------------------------------------------------


@pytest.mark.parametrize("size", SIZES)
def test_mt5_sizes_match_the_published_configs(size, spm_path):
    model = _model([f"t5x/examples/t5/mt5/{size}.gin"], spm_path)
    _assert_t5_1_1_family(model)
    assert type(model.config) is t5_network.T5Config and not model.config.scan_layers
    assert _architecture(model.config) == _architecture(models.PRESETS[f"mt5_{size}"])
    assert model.config.vocab_size == 250112
    assert isinstance(model.input_vocabulary, seqio.SentencePieceVocabulary)
    assert model.output_vocabulary == model.input_vocabulary


def test_mt5_small_hyperparameters_and_vocabulary_file(spm_path):
    # The size files leave the dropout rate to the run file's DROPOUT_RATE.
    model = _model(["t5x/examples/t5/mt5/small.gin"], spm_path, "DROPOUT_RATE = 0.1")
    assert _architecture(model.config) == {
        "vocab_size": 250112, "emb_dim": 512, "num_heads": 6, "num_encoder_layers": 8,
        "num_decoder_layers": 8, "head_dim": 64, "mlp_dim": 1024,
    }  # fmt: skip
    assert model.config.dropout_rate == 0.1
    # Without the test's local copy, the model file names mT5's public vocabulary.
    parse_gin(GinArgs(("t5x/examples/t5/mt5/small.gin",), ("DROPOUT_RATE = 0.0",)))
    assert gin.query_parameter("seqio.SentencePieceVocabulary.sentencepiece_model_file") == MC4_VOCABULARY
    assert _param_count(_model(["t5x/examples/t5/mt5/small.gin"], spm_path)) == pytest.approx(300e6, rel=0.01)


@pytest.mark.parametrize("size", SIZES)
def test_scalable_mt5_sizes_scan_their_layers(size, spm_path):
    model = _model([f"t5x/examples/scalable_t5/mt5/{size}.gin"], spm_path)
    _assert_t5_1_1_family(model)
    assert type(model.config) is scalable_network.T5Config
    assert model.config.scan_layers and model.config.remat_policy == "minimal"
    assert _architecture(model.config) == _architecture(models.PRESETS[f"mt5_{size}"])


# ---- ByT5 -------------------------------------------------------------------------------------


@pytest.mark.parametrize("size", SIZES)
def test_byt5_sizes_match_the_published_configs(size, spm_path):
    model = _model([f"t5x/examples/t5/byt5/{size}.gin"], spm_path)
    _assert_t5_1_1_family(model)
    assert _architecture(model.config) == _architecture(models.PRESETS[f"byt5_{size}"])
    assert model.config.vocab_size == 384
    assert isinstance(model.input_vocabulary, seqio.ByteVocabulary)
    assert model.output_vocabulary == model.input_vocabulary


def test_byt5_small_hyperparameters(spm_path):
    model = _model(["t5x/examples/t5/byt5/small.gin"], spm_path)
    assert _architecture(model.config) == {
        "vocab_size": 384, "emb_dim": 1472, "num_heads": 6, "num_encoder_layers": 12,
        "num_decoder_layers": 4, "head_dim": 64, "mlp_dim": 3584,
    }  # fmt: skip
    assert model.input_vocabulary.vocab_size == 259  # 3 special ids + 256 bytes
    assert _param_count(model) == pytest.approx(300e6, rel=0.01)


# ---- T5.1.1 with AdamW ------------------------------------------------------------------------


def test_adamw_opt_replaces_adafactor_with_clipped_adamw(spm_path):
    model = _model(["t5x/examples/t5/t5_1_1/small.gin", "t5x/examples/t5/t5_1_1/adamw_opt.gin"], spm_path)
    assert isinstance(model.optimizer_def, optimizers.OptaxWrapper)
    assert model.config.emb_dim == 512  # the model file's network is unchanged
    tx = optimizers.to_optax(model.optimizer_def)
    want = optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(learning_rate=1e-4, weight_decay=0.01))
    params = {"w": np.linspace(-1.0, 1.0, 12, dtype=np.float32).reshape(3, 4)}
    grads = {"w": np.full((3, 4), 5.0, np.float32)}  # global norm 17.3: clipped to 1
    got_state, want_state = tx.init(params), want.init(params)
    for _ in range(2):
        got, got_state = tx.update(grads, got_state, params)
        expected, want_state = want.update(grads, want_state, params)
        np.testing.assert_allclose(got["w"], expected["w"], rtol=1e-6)


# ---- UMT5 -------------------------------------------------------------------------------------


def test_umt5_pieces_build_umt5_on_a_scalable_mt5_size(spm_path):
    model = _model(["t5x/examples/scalable_t5/mt5/small.gin", *UMT5_PIECES], spm_path)
    want = models.PRESETS["umt5_small"]
    assert _architecture(model.config) == _architecture(want) and model.config.vocab_size == 256384
    assert model.config.per_layer_relpos_bias and model.config.scan_layers
    assert model.config.mlp_activations == want.mlp_activations
    assert isinstance(model.input_vocabulary, seqio.SentencePieceVocabulary)
    assert model.input_vocabulary.extra_ids == 300
    # One relative-position table per layer (upstream scalable-T5 names), scanned on axis 1: [heads, layers, buckets].
    shapes = _flat_param_shapes(model)
    assert shapes["encoder/layers/relative_posemb/rel_embedding"] == (6, 8, 32)
    assert shapes["decoder/layers/relative_posemb/rel_embedding"] == (6, 8, 32)
    assert gin.query_parameter("seqio.SentencePieceVocabulary.sentencepiece_model_file") == spm_path
    parse_gin(GinArgs(("t5x/examples/scalable_t5/mt5/small.gin", *UMT5_PIECES), ("DROPOUT_RATE = 0.0",)))
    assert gin.query_parameter("seqio.SentencePieceVocabulary.sentencepiece_model_file") == UMT5_VOCABULARY


@pytest.mark.parametrize(("size", "preset"), sorted(UMT5_PRESETS.items()))
def test_umt5_sizes_match_the_published_configs(size, preset, spm_path):
    config = _model([f"t5x/examples/scalable_t5/mt5/{size}.gin", *UMT5_PIECES], spm_path).config
    want = models.PRESETS[preset]
    assert _architecture(config) == _architecture(want)
    assert config.per_layer_relpos_bias == want.per_layer_relpos_bias is True


def test_umt5_momentum_nofactor_optimizer(spm_path):
    files = ["t5x/examples/scalable_t5/mt5/xxl.gin", *UMT5_PIECES]
    files.append("t5x/examples/scalable_t5/umt5/optimizer/adafactor_momentum_nofactor.gin")
    model = _model(files, spm_path)
    hp = model.optimizer_def.hyper_params
    assert (hp.beta1, hp.factored, hp.global_norm_clip_threshold) == (0.9, False, 1.0)
    # The model file's Adafactor bindings stay, as under upstream.
    assert (hp.decay_rate, hp.step_offset) == (0.8, 0) and hp.logical_factor_rules is not None
    assert isinstance(optimizers.to_optax(model.optimizer_def), training.Adafactor)
    # umt5/optimizer/adafactor.gin adds nothing to them.
    default = _model(["t5x/examples/scalable_t5/mt5/base.gin", *UMT5_PIECES], spm_path).optimizer_def
    assert default.hyper_params.beta1 is None and default.hyper_params.factored
    assert default.hyper_params.global_norm_clip_threshold is None


def test_umt5_finetuning_run_as_upstreams_tydiqa_file_composes_it(spm_path):
    # Upstream's umt5/tydiqa_base.gin: model, architecture, run, optimizer, vocabulary.
    files = (
        "t5x/examples/scalable_t5/mt5/base.gin",
        "t5x/examples/scalable_t5/umt5/architectures/encoder_decoder.gin",
        "t5x/examples/scalable_t5/umt5/runs/finetuning_common.gin",
        "t5x/examples/scalable_t5/umt5/optimizer/adafactor.gin",
        "t5x/examples/scalable_t5/umt5/vocab.gin",
    )
    bindings = (
        f"seqio.SentencePieceVocabulary.sentencepiece_model_file = {spm_path!r}",
        "MIXTURE_OR_TASK_NAME = 'task'",
        "MODEL_DIR = '/tmp/unused'",
        "INITIAL_CHECKPOINT_PATH = '/tmp/unused/checkpoint_1000000'",
        "TRAIN_STEPS = 1_050_000",
    )
    parse_gin(GinArgs(files, bindings))
    model = macro_value("MODEL")
    assert model.config.dropout_rate == 0.1 and model.config.vocab_size == 256384
    assert model.config.per_layer_relpos_bias
    assert model.loss_normalizing_factor == "NUM_REAL_TARGET_TOKENS"
    assert macro_value("TASK_FEATURE_LENGTHS") == {"inputs": 512, "targets": 512}
    assert macro_value("BATCH_SIZE") == 64 and macro_value("LEARNING_RATE") == 0.0005
    # runs/finetune.gin's constant schedule at LEARNING_RATE.
    learning_rate_fn = gin.query_parameter("trainer.Trainer.learning_rate_fn").scoped_configurable_fn()
    assert float(learning_rate_fn(0)) == float(learning_rate_fn(10**6)) == pytest.approx(0.0005)
    assert gin.query_parameter("train_script.train.stats_period") == 1000
    assert gin.query_parameter("utils.SaveCheckpointConfig.period") == 1000
    assert gin.query_parameter("train/utils.DatasetConfig.seed") == 42


# ---- local_tiny -------------------------------------------------------------------------------


def test_t5_local_tiny_shrinks_a_run(spm_path):
    _model(
        ["t5x/examples/t5/mt5/small.gin", "t5x/configs/runs/pretrain.gin", "t5x/examples/t5/local_tiny.gin"],
        spm_path,
        "MODEL_DIR = '/tmp/unused'",
        "MIXTURE_OR_TASK_NAME = 'task'",
    )
    config = macro_value("MODEL").config
    assert _architecture(config) == {
        "vocab_size": 32128, "emb_dim": 8, "num_heads": 4, "num_encoder_layers": 2,
        "num_decoder_layers": 2, "head_dim": 3, "mlp_dim": 16,
    }  # fmt: skip
    assert not config.scan_layers and config.dropout_rate == 0.0
    assert macro_value("TRAIN_STEPS") == 3
    assert macro_value("TASK_FEATURE_LENGTHS") == {"inputs": 8, "targets": 8}
    assert gin.query_parameter("utils.CheckpointConfig.restore") is None
    assert gin.query_parameter("utils.CheckpointConfig.save") is None
    assert gin.query_parameter("train/utils.DatasetConfig.batch_size") == 8


# ---- end to end -------------------------------------------------------------------------------


def test_mt5_small_shrunk_trains_through_t5x_launch(tmp_path, spm_path):
    """A user's experiment including mt5/small.gin (shrunk by its overrides) trains 3 steps."""
    model_gin, pretrain_gin = write_experiment(tmp_path, spm_path)
    text = model_gin.read_text()
    assert "include 't5x/examples/t5/t5_1_1/small.gin'" in text
    model_gin.write_text(text.replace("t5_1_1/small.gin", "mt5/small.gin"))
    script = pathlib.Path(sys.executable).with_name("t5x-launch")
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(tmp_path))
    model_dir = tmp_path / "model"
    result = subprocess.run(
        [
            str(script), "train", f"--gin_file={pretrain_gin}", f"--gin.MODEL_DIR={model_dir}",
            f"--gin.MIXTURE_OR_TASK_NAME={TASK}", "--gin.TASK_FEATURE_LENGTHS={'inputs': 8, 'targets': 8}",
            "--gin.TRAIN_STEPS=3", "--gin.train_script.train.eval_period=3",
        ],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    assert "finished at step 3" in result.stdout
    config = (model_dir / "config.gin").read_text()
    assert "network.T5Config.emb_dim = 32" in config and "('gelu', 'linear')" in config
    assert (model_dir / "checkpoint_3").is_dir()
