"""The shipped upstream-path gin files parse under t5x-launch and build the published sizes."""

import sys

import gin
import pytest

from t5x import adafactor, launch, models, optimizers, partitioning, training
from t5x.launch._gin_config import GinArgs, configured_job, macro_value, parse_gin
from t5x.upstream import _scripts

T5_1_1 = ["tiny", "small", "base", "large", "xl", "xxl"]


def _model(files, spm_path, *bindings):
    spm = f"seqio.SentencePieceVocabulary.sentencepiece_model_file = {spm_path!r}"
    parse_gin(GinArgs(tuple(files), (spm, "DROPOUT_RATE = 0.0", *bindings)))
    return macro_value("MODEL")


@pytest.mark.parametrize("size", T5_1_1)
def test_t5_1_1_sizes_match_the_published_configs(size, spm_path):
    model = _model([f"t5x/examples/t5/t5_1_1/{size}.gin"], spm_path)
    assert isinstance(model, models.EncoderDecoderModel)
    preset = models.PRESETS[f"t5_1_1_{size}"]
    for field in (
        "vocab_size",
        "emb_dim",
        "num_heads",
        "num_encoder_layers",
        "num_decoder_layers",
        "head_dim",
        "mlp_dim",
    ):
        assert getattr(model.config, field) == getattr(preset, field), field
    assert model.config.mlp_activations == ("gelu", "linear") and not model.config.logits_via_embedding
    assert model.config.dtype == "bfloat16" and model.z_loss == pytest.approx(1e-4)
    assert isinstance(model.optimizer_def, adafactor.Adafactor)
    assert isinstance(optimizers.to_optax(model.optimizer_def), training.Adafactor)


@pytest.mark.parametrize(
    ("size", "preset"), [("small", "t5_1_0_small"), ("base", "t5_1_0_base"), ("3B", "t5_1_0_3B")]
)
def test_t5_1_0_sizes_match_the_published_configs(size, preset, spm_path):
    config = _model([f"t5x/examples/t5/t5_1_0/{size}.gin"], spm_path).config
    want = models.PRESETS[preset]
    assert (config.emb_dim, config.num_heads, config.num_encoder_layers, config.head_dim, config.mlp_dim) == (
        want.emb_dim, want.num_heads, want.num_encoder_layers, want.head_dim, want.mlp_dim,
    )  # fmt: skip
    assert config.mlp_activations == ("relu",) and config.logits_via_embedding


def test_scalable_t5_scans_and_decoder_only_samples(spm_path):
    scalable = _model(["t5x/examples/scalable_t5/t5_1_1/small.gin"], spm_path).config
    assert scalable.scan_layers and scalable.remat_policy == "minimal" and scalable.emb_dim == 512
    decoder = _model(["t5x/examples/decoder_only/models/xl.gin"], spm_path)
    assert isinstance(decoder, models.DecoderOnlyModel)
    assert (decoder.config.emb_dim, decoder.config.num_layers, decoder.config.mlp_dim) == (2048, 24, 5120)
    assert decoder.config.logits_via_embedding


def test_local_tiny_shrinks_a_scalable_run(spm_path):
    _model(
        [
            "t5x/examples/scalable_t5/t5_1_1/small.gin",
            "t5x/configs/runs/pretrain.gin",
            "t5x/examples/scalable_t5/local_tiny.gin",
        ],
        spm_path,
        "MODEL_DIR = '/tmp/unused'",
        "MIXTURE_OR_TASK_NAME = 'task'",
    )
    config = macro_value("MODEL").config
    assert (config.emb_dim, config.num_heads, config.head_dim, config.mlp_dim) == (8, 4, 3, 16)
    assert config.scan_layers and config.dropout_rate == 0.0
    assert macro_value("TRAIN_STEPS") == 3 and macro_value("TASK_FEATURE_LENGTHS") == {
        "inputs": 8,
        "targets": 7,
    }


def test_run_file_binds_upstreams_train_through_main(spm_path):
    _model(
        ["t5x/examples/t5/t5_1_1/small.gin", "t5x/configs/runs/pretrain.gin"],
        spm_path,
        "MODEL_DIR = '/tmp/unused'",
        "MIXTURE_OR_TASK_NAME = 'task'",
        "TASK_FEATURE_LENGTHS = {'inputs': 8, 'targets': 8}",
        "TRAIN_STEPS = 3",
    )
    assert sys.modules["__main__"].train is _scripts.train
    assert configured_job("train", launch.train) is _scripts.train
    # A config that binds launch's own job keeps it.
    parse_gin(GinArgs(("runs/demo.gin",)))
    assert configured_job("train", launch.train) is launch.train


def _parse_text(tmp_path, text):
    path = tmp_path / "user.gin"
    path.write_text(text)
    parse_gin(GinArgs((str(path),)))


def test_upstreams_earlier_partitioner_name_and_keywords_build_a_pjit_partitioner(tmp_path):
    # Upstream's 2022 run files: ModelBasedPjitPartitioner with `model_parallel_submesh = ()`.
    text = (
        "from __gin__ import dynamic_registration\nfrom t5x import partitioning\n"
        "P = @partitioning.ModelBasedPjitPartitioner()\n"
        "partitioning.ModelBasedPjitPartitioner:\n  num_partitions = 1\n  model_parallel_submesh = ()\n"
        "  params_on_devices = False\n  backend = 'cpu'\n"
    )
    _parse_text(tmp_path, text)
    partitioner = macro_value("P")
    assert isinstance(partitioner, partitioning.PjitPartitioner)
    assert dict(partitioner.mesh.shape) == {"data": 1, "model": 1}
    assert partitioner.params_on_devices is False


def test_a_partitioner_backend_the_machine_lacks_is_named(tmp_path):
    text = (
        "from __gin__ import dynamic_registration\nfrom t5x import partitioning\n"
        "P = @partitioning.PjitPartitioner()\npartitioning.PjitPartitioner.backend = 'tpu'\n"
    )
    _parse_text(tmp_path, text)
    with pytest.raises(partitioning.MeshError, match=r"backend='tpu'.*no 'tpu' devices.*available: cpu"):
        macro_value("P")


def test_an_unsupported_upstream_name_says_what_to_use(tmp_path):
    text = "from __gin__ import dynamic_registration\nfrom t5x import interactive_model\n"
    with pytest.raises(launch.GinConfigError, match=r"t5x-launch infer") as error:
        _parse_text(tmp_path, text)
    assert "user.gin" in str(error.value)


def test_a_models_feature_converter_class_is_upstreams_keyword(tmp_path, spm_path):
    text = (
        "from __gin__ import dynamic_registration\nimport seqio\nfrom t5x import models\n"
        "include 't5x/examples/decoder_only/models/base.gin'\n"
        "models.DecoderOnlyModel.feature_converter_cls = @seqio.PassThroughFeatureConverter\n"
        f"seqio.SentencePieceVocabulary.sentencepiece_model_file = {spm_path!r}\nDROPOUT_RATE = 0.0\n"
    )
    _parse_text(tmp_path, text)
    model = macro_value("MODEL")
    from t5x import seqio

    # gin hands over a subclass of the class it registered
    assert issubclass(model.feature_converter_cls, seqio.PassThroughFeatureConverter)
    assert model.FEATURE_CONVERTER_CLS is model.feature_converter_cls
    assert models.get_input_vocabulary(model) is models.get_output_vocabulary(model) is model.vocabulary


@pytest.mark.parametrize(
    ("module", "hint"),
    [("t5x.contrib.moe", "contrib packages.*t5x-moe")],
)
def test_an_unsupported_upstream_module_says_so(tmp_path, module, hint):
    package, name = module.rsplit(".", 1)
    text = f"from __gin__ import dynamic_registration\nfrom {package} import {name}\n"
    with pytest.raises(launch.GinConfigError, match=hint) as error:
        _parse_text(tmp_path, text)
    assert "No configurable matching" not in str(error.value)


@pytest.fixture(autouse=True)
def _clean_gin():
    yield
    gin.clear_config()
