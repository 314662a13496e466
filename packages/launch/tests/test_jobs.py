"""Jobs assembled from the shipped gin files: train, resume, eval and infer on a tiny model."""

import json
import pathlib
import shutil

import pytest

from t5x.launch._cli import main

TINY = [
    "--gin_file=models/demo/tiny.gin",
    "--gin.models.T5Config.emb_dim=32",
    "--gin.models.T5Config.mlp_dim=64",
    "--gin.models.T5Config.num_heads=2",
    "--gin.models.T5Config.head_dim=16",
    "--gin.models.T5Config.num_encoder_layers=1",
    "--gin.models.T5Config.num_decoder_layers=1",
]
DATA = [
    "--gin.MIXTURE_OR_TASK_NAME=synthetic_copy",
    "--gin.TASK_FEATURE_LENGTHS={'inputs': 24, 'targets': 24}",
    "--gin.BATCH_SIZE=8",
]


@pytest.fixture(scope="module")
def trained(trained_run):
    """The session's shared run (conftest's `trained_run`): 4 steps, a checkpoint every 2."""
    return trained_run


def test_train_writes_checkpoints_config_and_model_info(trained):
    model_dir, _ = trained
    assert sorted(p.name for p in model_dir.glob("checkpoint_*")) == ["checkpoint_2", "checkpoint_4"]
    config = (model_dir / "config.gin").read_text()
    assert "TRAIN_STEPS = 4" in config
    assert "launch.train.total_steps = %TRAIN_STEPS" in config
    info = (model_dir / "model-info.txt").read_text()
    assert "Variable encoder/layers_0/attention/query/kernel" in info
    assert "Total number of parameters" in info
    lines = [json.loads(line) for line in (model_dir / "metrics.jsonl").read_text().splitlines()]
    assert any("loss" in "".join(line) or "loss" in json.dumps(line) for line in lines)


def test_train_resumes_from_the_latest_checkpoint(trained, tmp_path):
    shared, args = trained
    model_dir = tmp_path / "run"
    shutil.copytree(shared, model_dir)  # the shared folder stays as trained
    more = [a for a in args if not a.startswith("--gin.TRAIN_STEPS")] + ["--gin.TRAIN_STEPS=6"]
    assert main([*more, f"--gin.MODEL_DIR={model_dir}"]) == 0
    assert (model_dir / "checkpoint_6").is_dir()


def test_eval_reports_the_task_metrics(trained, tmp_path, capsys):
    model_dir, _ = trained
    code = main(
        [
            "eval",
            *TINY,
            "--gin_file=runs/eval.gin",
            *DATA,
            "--gin.SPLIT='validation'",
            f"--gin.CHECKPOINT_PATH={model_dir}",
            f"--gin.EVAL_OUTPUT_DIR={tmp_path}",
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "synthetic_copy" in out and "exact_match" in out
    assert (tmp_path / "config.gin").exists()


def test_infer_writes_json_lines_in_order(trained, tmp_path):
    model_dir, _ = trained
    code = main(
        [
            "infer",
            *TINY,
            "--gin_file=runs/infer.gin",
            *DATA,
            "--gin.SPLIT='validation'",
            f"--gin.CHECKPOINT_PATH={model_dir}/checkpoint_4",
            f"--gin.INFER_OUTPUT_DIR={tmp_path}",
        ]
    )
    assert code == 0
    output = tmp_path / "synthetic_copy-predict.jsonl-00000-of-00001"
    rows = [json.loads(line) for line in output.read_text().splitlines()]
    assert [row["index"] for row in rows] == list(range(500))
    assert all(isinstance(row["prediction"], str) for row in rows)
    assert all(set(row["inputs"]) == {"inputs_pretokenized", "targets_pretokenized"} for row in rows)
    assert pathlib.Path(f"{output}.COMPLETED").exists()


def test_assembly_rejects_a_component_that_breaks_its_contract():
    from t5x.launch._assembly import check_components

    class NotAPartitioner:
        mesh = None

    with pytest.raises(
        TypeError,
        match=r"partitioner \(NotAPartitioner\) does not implement the Partitioner contract.*get_data_layout",
    ):
        check_components(partitioner=NotAPartitioner())


def test_assembly_rejects_a_model_whose_vocabulary_differs_from_the_task():
    from t5x.launch import DatasetConfig
    from t5x.launch._assembly import check_vocabularies, get_provider
    from t5x.models import EncoderDecoderModel, preset
    from t5x.vocabularies import ByteVocabulary

    provider = get_provider(DatasetConfig("synthetic_copy", {"inputs": 8, "targets": 8}))
    model = EncoderDecoderModel(
        preset("t5_1_1_tiny"), ByteVocabulary(extra_ids=3), ByteVocabulary(extra_ids=3)
    )
    with pytest.raises(
        ValueError, match=r"model's inputs vocabulary .*extra_ids=3.* differs from .*synthetic_copy"
    ):
        check_vocabularies(model, provider)


def _train_args(model_dir, steps: int, period: int) -> list[str]:
    return [
        "train",
        *TINY,
        "--gin_file=runs/pretrain.gin",
        *DATA,
        f"--gin.MODEL_DIR={model_dir}",
        f"--gin.TRAIN_STEPS={steps}",
        f"--gin.CHECKPOINT_PERIOD={period}",
    ]


def test_train_refuses_a_model_folder_another_trainer_holds(tmp_path, capsys):
    import os
    import socket

    from t5x.launch._model_dir_lock import LOCK_NAME, acquire_model_dir_lock

    with acquire_model_dir_lock(tmp_path, command="the first trainer"):
        assert main(_train_args(tmp_path, 2, 1)) == 2
        before = sorted(p.name for p in tmp_path.iterdir())
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    for part in (socket.gethostname(), f"pid {os.getpid()}", "the first trainer", str(tmp_path / LOCK_NAME)):
        assert part in err[0], (part, err)
    assert before == [LOCK_NAME]  # the second trainer wrote nothing


def test_train_stops_on_sigterm_after_saving_and_exits_143(tmp_path, capsys):
    import os
    import signal
    import threading
    import time

    from t5x.launch._model_dir_lock import LOCK_NAME

    def preempt() -> None:
        deadline = time.monotonic() + 600
        while not any(tmp_path.glob("checkpoint_*[0-9]")) and time.monotonic() < deadline:
            time.sleep(0.005)
        os.kill(os.getpid(), signal.SIGTERM)

    sender = threading.Thread(target=preempt, daemon=True)
    sender.start()
    code = main(_train_args(tmp_path, 100_000, 2))
    sender.join()
    assert code == 143
    steps = sorted(int(p.name.split("_")[1]) for p in tmp_path.glob("checkpoint_*[0-9]"))
    assert steps[0] == 2 and steps[-1] < 100_000
    err = capsys.readouterr().err
    line = f"[t5x-launch] preempted by SIGTERM at step {steps[-1]} (checkpoint saved); run the same command to resume"
    assert line in err.splitlines(), err[-3000:]
    assert "finished at step" not in err
    assert not (tmp_path / LOCK_NAME).exists()
    assert (tmp_path / "config.gin").exists()
