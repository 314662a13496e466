"""Bad input to t5x-launch: refused early, named precisely, one message and exit code 2.

Gin macros set on the command line that no config reads, values of the wrong
type, syntax errors, the CLI's error reporting (``--verbose``), truncated
safetensors through ``convert``, and the model folder a failed run leaves.
"""

import pathlib

import gin
import numpy as np
import pytest

from t5x.launch import ConfigurationError, GinArgs, GinConfigError, UserError, parse_gin, split_gin_flags
from t5x.launch._cli import main
from t5x.launch._errors import is_user_error, user_error_message
from t5x.launch._gin_config import GinBinding, simple_types
from t5x.launch._run_folder import FAILED_NAME, new_model_dir, undo_early_failure

PRETRAIN = ("models/t5_1_1/tiny.gin", "runs/pretrain.gin")
TINY_TRAIN = [
    "train",
    "--gin_file=models/demo/tiny.gin",
    "--gin.models.T5Config.emb_dim=32",
    "--gin.models.T5Config.mlp_dim=64",
    "--gin.models.T5Config.num_heads=2",
    "--gin.models.T5Config.head_dim=16",
    "--gin.models.T5Config.num_encoder_layers=1",
    "--gin.models.T5Config.num_decoder_layers=1",
    "--gin_file=runs/pretrain.gin",
    "--gin.TASK_FEATURE_LENGTHS={'inputs': 24, 'targets': 24}",
    "--gin.BATCH_SIZE=8",
]


def _parse_flags(*flags: str, files=PRETRAIN, **kwargs) -> None:
    _, bindings = split_gin_flags(list(flags))
    parse_gin(GinArgs(files=files, bindings=tuple(bindings), **kwargs))


# ---- macros set on the command line -------------------------------------------------------------


def test_a_misspelt_macro_is_refused_with_the_closest_names():
    with pytest.raises(GinConfigError) as error:
        _parse_flags("--gin.TRAIN_STEPZ=2", "--gin.MODEL_DIR=/tmp/m")
    message = str(error.value)
    assert "unknown gin macro TRAIN_STEPZ (set by --gin.TRAIN_STEPZ=2)" in message
    assert "no config refers to it" in message
    assert "Closest: TRAIN_STEPS" in message


def test_a_misspelt_macro_in_gin_bindings_is_refused_too():
    bindings = (GinBinding("BATCH_SIZ = 4", "--gin_bindings='BATCH_SIZ = 4'"),)
    with pytest.raises(
        GinConfigError, match=r"BATCH_SIZ .*--gin_bindings='BATCH_SIZ = 4'.*Closest: BATCH_SIZE"
    ):
        parse_gin(GinArgs(files=PRETRAIN, bindings=bindings))


def test_macros_referenced_from_included_files_and_bindings_are_accepted(tmp_path):
    inner = tmp_path / "inner.gin"
    inner.write_text(
        "from __gin__ import dynamic_registration\nfrom t5x import launch\nlaunch.train.log_period = %MY_LOG\n"
    )
    outer = tmp_path / "outer.gin"
    outer.write_text(f"include '{inner}'\n")
    # MY_LOG: only an included file refers to it; MY_SEED: only another command-line binding does.
    _parse_flags(
        "--gin.MY_LOG=5",
        "--gin.MY_SEED=3",
        "--gin.launch.train.random_seed=%MY_SEED",
        files=(*PRETRAIN, str(outer)),
    )
    assert gin.query_parameter("MY_LOG/macro.value") == 5


def test_bindings_a_program_passes_itself_are_not_checked():
    parse_gin(GinArgs(files=PRETRAIN, bindings=("EVAL_OUTPUT_DIR = '/tmp/e'",)))


def test_macros_the_command_reads_itself_are_accepted(tmp_path):
    custom = tmp_path / "custom.gin"  # binds model_dir directly; the CLI still reads MODEL_DIR
    custom.write_text(
        "from __gin__ import dynamic_registration\nfrom t5x import launch\nlaunch.train.model_dir = '/x'\n"
    )
    _, bindings = split_gin_flags(["--gin.MODEL_DIR=/tmp/m"])
    parse_gin(GinArgs(files=(str(custom),), bindings=tuple(bindings), read_macros=("MODEL_DIR",)))
    with pytest.raises(GinConfigError, match="unknown gin macro MODEL_DIR"):
        parse_gin(GinArgs(files=(str(custom),), bindings=tuple(bindings)))


# ---- value types --------------------------------------------------------------------------------


def test_a_macro_of_the_wrong_type_names_parameter_type_value_and_flag():
    with pytest.raises(GinConfigError) as error:
        _parse_flags("--gin.TRAIN_STEPS=ten", "--gin.MODEL_DIR=/tmp/m")
    message = str(error.value)
    assert "launch.train.total_steps expects int, got 'ten' (str)" in message
    assert "from the macro TRAIN_STEPS, set by --gin.TRAIN_STEPS=ten" in message


def test_a_parameter_of_the_wrong_type_is_refused_wherever_it_is_bound(tmp_path):
    with pytest.raises(GinConfigError, match=r"models\.T5Config\.num_heads expects int, got 2\.5 \(float\)"):
        _parse_flags(
            "--gin.models.T5Config.num_heads=2.5",
            "--gin.MODEL_DIR=/tmp/m",
            files=("models/demo/tiny.gin", "runs/pretrain.gin"),
        )
    bad = tmp_path / "bad.gin"
    bad.write_text("include 'runs/pretrain.gin'\nBATCH_SIZE = '8'\n")
    with pytest.raises(GinConfigError, match=r"train/launch\.DatasetConfig\.batch_size expects int, got '8'"):
        parse_gin(GinArgs(files=("models/t5_1_1/tiny.gin", str(bad))))


def test_values_that_fit_their_annotations_pass():
    # int for a float, None for an optional, a bool for a bool.
    _parse_flags(
        "--gin.LEARNING_RATE=1",
        "--gin.EVAL_PERIOD=None",
        "--gin.PACK=False",
        "--gin.MODEL_DIR=/tmp/m",
    )
    with pytest.raises(GinConfigError, match=r"expects bool, got 1 \(int\)"):
        _parse_flags("--gin.PACK=1", "--gin.MODEL_DIR=/tmp/m")
    with pytest.raises(GinConfigError, match=r"total_steps expects int, got True \(bool\)"):
        _parse_flags("--gin.TRAIN_STEPS=True", "--gin.MODEL_DIR=/tmp/m")


@pytest.mark.parametrize(
    ("annotation", "expected"),
    [
        ("int", (int,)),
        ("int | None", (int, type(None))),
        ("Optional[str]", (str, type(None))),
        ("typing.Union[float, None]", (float, type(None))),
        (float | None, (float, type(None))),
        (bool, (bool,)),
        ("Mapping[str, int]", None),
        ("Callable[[int], float] | None", None),
        ("Any", None),
    ],
)
def test_simple_types_reads_string_and_real_annotations(annotation, expected):
    assert simple_types(annotation) == expected


# ---- syntax errors ------------------------------------------------------------------------------


def test_a_syntax_error_in_a_binding_quotes_it_with_its_flag():
    with pytest.raises(GinConfigError) as error:
        _parse_flags("--gin.TASK_FEATURE_LENGTHS={'inputs': 3", "--gin.MODEL_DIR=/tmp/m")
    message = str(error.value)
    assert "gin syntax error in --gin.TASK_FEATURE_LENGTHS={'inputs': 3" in message
    bindings = (GinBinding("launch.train.total_steps 3", "--gin_bindings='launch.train.total_steps 3'"),)
    with pytest.raises(
        GinConfigError, match=r"gin syntax error in --gin_bindings='launch.train.total_steps 3'"
    ):
        parse_gin(GinArgs(files=PRETRAIN, bindings=bindings))


def test_a_syntax_error_in_a_file_names_the_file_and_line_and_quotes_it(tmp_path):
    bad = tmp_path / "bad.gin"
    bad.write_text("include 'runs/pretrain.gin'\n\nlaunch.train.total_steps 3\n")
    with pytest.raises(GinConfigError) as error:
        parse_gin(GinArgs(files=("models/t5_1_1/tiny.gin", str(bad))))
    message = str(error.value)
    assert f"{bad}:3: gin syntax error" in message
    assert "\n    launch.train.total_steps 3" in message


def test_an_unclosed_bracket_in_an_included_file_names_that_file(tmp_path):
    inner = tmp_path / "inner.gin"
    inner.write_text("A = 1\nB = 'open\nC = 2\n")
    outer = tmp_path / "outer.gin"
    outer.write_text(f"X = 1\ninclude '{inner}'\n")
    with pytest.raises(GinConfigError) as error:
        parse_gin(GinArgs(files=(str(outer),)))
    message = str(error.value)
    assert f"{inner}:2: gin syntax error" in message and "B = 'open" in message


# ---- the CLI's report ---------------------------------------------------------------------------


def test_expected_errors_print_one_message_and_exit_2(capsys, tmp_path):
    code = main([*TINY_TRAIN, f"--gin.MODEL_DIR={tmp_path / 'm'}", "--gin.TRAIN_STEPZ=2"])
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("t5x-launch train: gin configuration error:\nunknown gin macro TRAIN_STEPZ")
    assert "Traceback" not in err
    assert not (tmp_path / "m").exists()


def test_verbose_adds_the_traceback_before_or_after_the_command(capsys, tmp_path):
    for argv in (
        ["--verbose", *TINY_TRAIN, "--gin.TRAIN_STEPS=ten"],
        [*TINY_TRAIN, "--gin.TRAIN_STEPS=ten", "--verbose"],
    ):
        assert main([*argv, f"--gin.MODEL_DIR={tmp_path / 'm'}"]) == 2
        err = capsys.readouterr().err
        assert "Traceback (most recent call last)" in err
        assert err.rstrip().endswith("set by --gin.TRAIN_STEPS=ten)")


def test_an_unknown_task_is_named_and_the_new_model_folder_removed(capsys, tmp_path):
    model_dir = tmp_path / "runs" / "new"
    code = main([*TINY_TRAIN, f"--gin.MODEL_DIR={model_dir}", "--gin.MIXTURE_OR_TASK_NAME=synthetic_cpy"])
    assert code == 2
    err = capsys.readouterr().err
    assert "t5x-launch train: No task or mixture named 'synthetic_cpy'" in err
    assert "In call to configurable" not in err and "Traceback" not in err
    assert not (tmp_path / "runs").exists()


def test_a_users_own_model_folder_is_kept_after_an_early_failure(capsys, tmp_path):
    model_dir = tmp_path / "mine"
    model_dir.mkdir()
    (model_dir / "notes.txt").write_text("keep me")
    code = main([*TINY_TRAIN, f"--gin.MODEL_DIR={model_dir}", "--gin.MIXTURE_OR_TASK_NAME=nope"])
    assert code == 2
    assert sorted(p.name for p in model_dir.iterdir()) == ["notes.txt"]


def test_unexpected_errors_keep_their_traceback(monkeypatch):
    import t5x.launch._cli as cli

    def broken(args, bindings):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(cli, "_cmd_model_info", broken)
    with pytest.raises(ZeroDivisionError):
        main(["model-info"])


def test_which_errors_are_the_users():
    assert is_user_error(UserError("x")) and is_user_error(ConfigurationError("x"))
    assert is_user_error(FileNotFoundError(2, "No such file", "/x"))
    assert is_user_error(OSError(28, "No space left on device"))
    assert not is_user_error(ValueError("x")) and not is_user_error(KeyError("x"))
    import t5x.checkpointing
    import t5x.tasks

    assert is_user_error(t5x.tasks.DataSourceError("f.jsonl:3: invalid JSON"))
    assert is_user_error(t5x.tasks.UnknownNameError("No task named 'x'"))
    assert is_user_error(t5x.checkpointing.CorruptIndexError("bad index"))
    assert user_error_message(t5x.tasks.UnknownNameError("No task named 'x'")) == "No task named 'x'"
    assert user_error_message(GinConfigError("bad")) == "gin configuration error:\nbad"


# ---- convert: safetensors -----------------------------------------------------------------------


def _truncated_hf_folder(tmp_path: pathlib.Path) -> pathlib.Path:
    from t5x.checkpointing import write_hf_folder

    folder = tmp_path / "hf"
    write_hf_folder(folder, {"shared.weight": np.ones((8, 4), np.float32)}, {"model_type": "t5"})
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-40])
    return folder


def test_convert_names_a_truncated_safetensors_file_and_exits_2(tmp_path, capsys):
    folder = _truncated_hf_folder(tmp_path)
    code = main(["convert", f"--from=hf:{folder}", f"--to=t5x:{tmp_path / 'out'}"])
    assert code == 2
    err = capsys.readouterr().err
    assert f"{folder / 'model.safetensors'}: cannot read the safetensors file: truncated" in err
    assert "Traceback" not in err
    assert not (tmp_path / "out").exists()
    assert main(["--verbose", "convert", f"--from=hf:{folder}", f"--to=t5x:{tmp_path / 'out'}"]) == 2
    assert "Traceback" in capsys.readouterr().err


# ---- the model folder of a failed run -----------------------------------------------------------


def _fail_inside(context, body, error: BaseException):
    """Runs ``body()`` inside ``context`` and then raises ``error`` there."""
    with context as value:
        body(value)
        raise error


def test_new_model_dir_removes_the_folders_it_made_when_left_empty(tmp_path):
    target = tmp_path / "a" / "b" / "c"
    seen = []
    with pytest.raises(RuntimeError):
        _fail_inside(new_model_dir(target), seen.append, RuntimeError("early"))
    assert seen == [[tmp_path / "a", tmp_path / "a" / "b", target]]
    assert not (tmp_path / "a").exists()

    def write(_):
        (target / "keep").write_text("x")  # not empty: nothing is removed

    with pytest.raises(RuntimeError):
        _fail_inside(new_model_dir(target), write, RuntimeError("early"))
    assert (target / "keep").exists()


def test_undo_early_failure_removes_only_what_the_run_wrote(tmp_path):
    (tmp_path / "user.txt").write_text("mine")
    (tmp_path / "train.lock").write_text("{}")

    def write(_):
        (tmp_path / "model-info.txt").write_text("x")
        (tmp_path / "train").mkdir()
        (tmp_path / "train" / "events").write_text("x")

    guard = undo_early_failure(tmp_path, held=True, keep=("train.lock",))
    with pytest.raises(RuntimeError):
        _fail_inside(guard, write, RuntimeError("bad data"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.lock", "user.txt"]


def test_undo_early_failure_marks_a_partial_first_save_and_keeps_it(tmp_path):
    def save(_):
        (tmp_path / "checkpoint_1.tmp-123").mkdir()

    with pytest.raises(OSError):
        _fail_inside(undo_early_failure(tmp_path, held=True), save, OSError(28, "No space left on device"))
    assert (tmp_path / "checkpoint_1.tmp-123").is_dir()
    marker = (tmp_path / FAILED_NAME).read_text()
    assert "before writing its first checkpoint" in marker and "No space left" in marker
    # The next attempt clears its own marker.
    with undo_early_failure(tmp_path, held=True):
        pass
    assert not (tmp_path / FAILED_NAME).exists()


def test_undo_early_failure_leaves_a_resumed_run_and_other_processes_alone(tmp_path):
    (tmp_path / "checkpoint_2").mkdir()

    def write(_):
        (tmp_path / "metrics.jsonl").write_text("{}")

    with pytest.raises(RuntimeError):
        _fail_inside(undo_early_failure(tmp_path, held=True), write, RuntimeError("later"))
    assert (tmp_path / "metrics.jsonl").exists()
    other = tmp_path / "other"
    other.mkdir()

    def write_other(_):
        (other / "model-info.txt").write_text("x")

    with pytest.raises(RuntimeError):
        _fail_inside(undo_early_failure(other, held=False), write_other, RuntimeError("not the holder"))
    assert (other / "model-info.txt").exists()


def test_config_json_that_is_not_json_is_named(tmp_path, capsys):
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "t5",')
    (folder / "model.safetensors").write_bytes(b"")
    assert main(["convert", f"--from=hf:{folder}", f"--to=t5x:{tmp_path / 'out'}"]) == 2
    assert f"{folder / 'config.json'}: not valid JSON" in capsys.readouterr().err


def test_a_decoder_only_model_without_prompts_is_refused_before_decoding():
    from t5x import models
    from t5x.launch._assembly import check_prompts
    from t5x.tasks import Feature, FunctionDataSource, Task
    from t5x.vocabularies import ByteVocabulary

    def task(features):
        return Task(
            "prompts_" + "_".join(features),
            FunctionDataSource(lambda split, shuffle_files: None, splits=("train",)),
            output_features={name: Feature(ByteVocabulary()) for name in features},
        )

    config = models.DecoderOnlyConfig(
        vocab_size=300, emb_dim=8, num_heads=1, head_dim=8, num_layers=1, mlp_dim=8
    )
    decoder = models.DecoderOnlyModel(config, ByteVocabulary())
    with pytest.raises(ConfigurationError, match=r"prompts_targets has only the features \['targets'\]"):
        check_prompts(decoder, task(["targets"]), "infer mode 'predict'")
    check_prompts(decoder, task(["inputs", "targets"]), "infer mode 'predict'")  # a prompt to continue
    encoder_decoder = models.EncoderDecoderModel(
        models.T5Config(vocab_size=300, emb_dim=8, num_heads=1, head_dim=8, mlp_dim=8, num_encoder_layers=1,
                        num_decoder_layers=1),
        ByteVocabulary(), ByteVocabulary(),
    )  # fmt: skip
    check_prompts(encoder_decoder, task(["targets"]), "infer mode 'predict'")
