"""The shipped gin files build their objects, and gin mistakes give clear errors."""

import pathlib

import gin
import pytest

import t5x.launch
from t5x.launch import GinArgs, GinConfigError, parse_gin
from t5x.launch._gin_config import CONFIGS_DIR

MODEL_FILES = sorted(
    str(p.relative_to(CONFIGS_DIR)) for p in CONFIGS_DIR.glob("models/*/*.gin") if p.parent.name != "demo"
)


def _macro(name):
    from t5x.launch._gin_config import macro_value

    return macro_value(name)


def _built(value):
    return value.scoped_configurable_fn() if hasattr(value, "scoped_configurable_fn") else value


def test_every_preset_family_ships_model_files():
    families = {pathlib.Path(f).parent.name for f in MODEL_FILES}
    assert families == {"t5_1_1", "t5_1_0", "mt5", "byt5", "umt5", "decoder_only", "prefix_lm"}


@pytest.mark.parametrize("model_file", MODEL_FILES)
def test_each_model_file_builds_its_preset(model_file, spm_path):
    from t5x.models import DecoderOnlyModel, EncoderDecoderModel, preset

    parse_gin(GinArgs(files=(model_file,), bindings=(f"SENTENCEPIECE_MODEL = '{spm_path}'",)))
    model = _macro("MODEL")
    name = gin.query_parameter("t5x.models.preset.name")
    assert model.config == preset(name, dropout_rate=0.0)
    if pathlib.Path(model_file).parent.name in ("decoder_only", "prefix_lm"):
        assert isinstance(model, DecoderOnlyModel)
        assert model.inputs_bidirectional_attention == (pathlib.Path(model_file).parent.name == "prefix_lm")
    else:
        assert isinstance(model, EncoderDecoderModel)
        assert model.input_vocabulary == model.output_vocabulary


@pytest.mark.parametrize(
    "run_file", ["runs/pretrain.gin", "runs/finetune.gin", "runs/eval.gin", "runs/infer.gin"]
)
def test_each_run_file_builds_its_job_arguments(run_file, spm_path):
    bindings = (
        f"SENTENCEPIECE_MODEL = '{spm_path}'",
        "MODEL_DIR = '/tmp/m'",
        "MIXTURE_OR_TASK_NAME = 'synthetic_copy'",
        "CHECKPOINT_PATH = '/tmp/m'",
        "EVAL_OUTPUT_DIR = '/tmp/e'",
        "INFER_OUTPUT_DIR = '/tmp/i'",
    )
    if run_file == "runs/finetune.gin":
        bindings += ("INITIAL_CHECKPOINT_PATH = '/tmp/init'",)
    parse_gin(GinArgs(files=("models/t5_1_1/tiny.gin", run_file), bindings=bindings))
    job = {"runs/eval.gin": t5x.launch.evaluate, "runs/infer.gin": t5x.launch.infer}.get(
        run_file, t5x.launch.train
    )
    bound = gin.get_bindings(job)
    assert "model" in bound
    if job is t5x.launch.train:
        dataset = _built(bound["train_dataset_cfg"])
        assert dataset == t5x.launch.DatasetConfig(
            "synthetic_copy", {"inputs": 512, "targets": 114}, batch_size=128
        )
        checkpoint = _built(bound["checkpoint_cfg"])
        expected_init = "/tmp/init" if run_file == "runs/finetune.gin" else None
        assert checkpoint.initial_checkpoint_path == expected_init
        assert _built(bound["partitioner"]).mesh is not None
        optimizer = _built(bound["optimizer"])
        assert hasattr(optimizer, "update")
    else:
        dataset = _built(bound["dataset_cfg"])
        assert dataset.shuffle is False and dataset.pack is False


def test_demo_file_parses_and_has_no_required_macro_but_model_dir():
    parse_gin(GinArgs(), default_files=["runs/demo.gin"])
    assert _macro("MIXTURE_OR_TASK_NAME") == "synthetic_sort_digits"
    from t5x.launch._gin_config import required_macros_left

    assert _macro("MODEL_DIR") is gin.REQUIRED  # the CLI picks a new folder
    assert required_macros_left() == ["MODEL_DIR"]


def test_unknown_configurable_names_the_closest_known_ones(tmp_path):
    bad = tmp_path / "bad.gin"
    bad.write_text(
        "from __gin__ import dynamic_registration\nfrom t5x import launch\n\nlaunch.DatasetConfg.split = 'x'\n"
    )
    with pytest.raises(GinConfigError) as error:
        parse_gin(GinArgs(files=(str(bad),)))
    assert "DatasetConfg" in str(error.value)
    assert "Closest names in t5x.launch: DatasetConfig" in str(error.value)


def test_unknown_binding_names_the_file_line_and_closest_names(tmp_path):
    bad = tmp_path / "typo.gin"
    bad.write_text("include 'runs/pretrain.gin'\n\nlaunch.trian.total_steps = 3\n")
    with pytest.raises(GinConfigError) as error:
        parse_gin(GinArgs(files=("models/t5_1_1/tiny.gin", str(bad))))
    message = str(error.value)
    assert "typo.gin" in message and "line 3" in message
    assert "launch.train" in message or "train" in message.split("Closest")[-1]


def test_unknown_parameter_names_the_closest_parameters():
    with pytest.raises(GinConfigError) as error:
        parse_gin(
            GinArgs(
                files=("models/t5_1_1/tiny.gin", "runs/pretrain.gin"),
                bindings=("launch.train.total_step = 3",),
            )
        )
    message = str(error.value)
    assert "total_step" in message
    assert "total_steps" in message


def test_missing_required_macro_is_named(capsys, tmp_path):
    from t5x.launch._cli import main

    code = main(
        [
            "train",
            "--gin_file=models/t5_1_1/tiny.gin",
            "--gin_file=runs/pretrain.gin",
            "--gin.MIXTURE_OR_TASK_NAME=synthetic_copy",
        ]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert "MODEL_DIR" in err
    assert "--gin.MODEL_DIR=" in err


def test_missing_gin_file_is_named():
    with pytest.raises(GinConfigError, match="no_such_file.gin"):
        parse_gin(GinArgs(files=("no_such_file.gin",)))


def test_config_gin_keeps_bindings_the_run_never_called(tmp_path):
    # A training run that never decodes must still record the demo's greedy decoding,
    # or eval / infer / export reusing config.gin would sample at temperature 1.
    from t5x.launch._gin_config import macro_value, write_config_gin

    parse_gin(GinArgs(("runs/demo.gin",), (f"MODEL_DIR='{tmp_path}'",)))
    with gin.config_scope("MODEL"):
        macro_value("MODEL")  # what training calls; it never calls the decoder
    assert "temperature_sample.temperature" not in gin.operative_config_str()
    text = write_config_gin(tmp_path).read_text()
    assert "decoding.temperature_sample.temperature = 0.0" in text
    assert "MODEL/models.T5Config" in text  # the operative part is kept as it was

    gin.clear_config()
    gin.parse_config(text)  # the file parses back on its own
    assert gin.query_parameter("decoding.temperature_sample.temperature") == 0.0
