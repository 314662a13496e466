"""`t5x-launch eval` on a trained tiny model folder: config.gin reuse, every metric, seqio's files, resuming."""

import collections
import glob
import json
import re
import shutil

import pytest

from t5x.launch import ConfigurationError
from t5x.launch._cli import main
from t5x.launch._eval_job import check_task_fits


@pytest.fixture(scope="module")
def model_dir(trained_run):
    """A model folder with checkpoints at steps 2 and 4, trained with lengths 24 / 20 (not eval.gin's).

    The session's shared run (conftest's `trained_run`): the tests only read it.
    """
    folder, args = trained_run
    assert "--gin.TASK_FEATURE_LENGTHS={'inputs': 24, 'targets': 20}" in args
    return folder


def _lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def _scalars(folder):
    import tensorflow as tf

    found = {}
    for events in glob.glob(str(folder / "events.out.tfevents.*")):
        for record in tf.data.TFRecordDataset(events):
            event = tf.compat.v1.Event.FromString(record.numpy())
            for value in event.summary.value:
                found[(value.tag, event.step)] = float(tf.make_ndarray(value.tensor))
    return found


def test_eval_of_a_step_folder_reuses_config_gin_and_writes_seqio_files(model_dir, tmp_path, capsys):
    out = tmp_path / "eval"
    code = main(
        [
            "eval",
            f"--gin.CHECKPOINT_PATH={model_dir}/checkpoint_2",
            f"--gin.EVAL_OUTPUT_DIR={out}",
            "--gin.EVAL_MAX_EXAMPLES=6",
            "--gin.BATCH_SIZE=4",
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert f"reusing the training config {model_dir}/config.gin" in printed
    assert "[decode] synthetic_copy: decoded 6/6 examples" in printed
    # The training run's lengths, not eval.gin's default; the user's batch size wins.
    config = (out / "config.gin").read_text()
    assert "TASK_FEATURE_LENGTHS = {'inputs': 24, 'targets': 20}" in config
    assert "BATCH_SIZE = 4" in config
    rows = _lines(out / "synthetic_copy-000002.jsonl")
    assert len(rows) == 6
    for row in rows:
        assert row["inputs"].startswith("copy: ") and row["targets"] == row["inputs"][len("copy: ") :]
        assert isinstance(row["prediction"], str) and isinstance(row["aux_scores"], float)
    (metrics,) = _lines(out / "synthetic_copy-metrics.jsonl")
    assert metrics["step"] == 2 and set(metrics) == {"step", "exact_match", "token_accuracy"}
    # Recomputed from the logged predictions (the untrained model gets none right).
    expected = 100 * sum(r["prediction"] == r["target"] for r in rows) / len(rows)
    assert metrics["exact_match"] == pytest.approx(expected)
    scalars = _scalars(out / "synthetic_copy")
    assert scalars[("eval/exact_match", 2)] == pytest.approx(metrics["exact_match"])


def test_eval_runs_score_metrics_for_every_task_of_a_mixture(model_dir, tmp_path, capsys):
    out = tmp_path / "eval"
    code = main(
        [
            "eval",
            f"--gin.CHECKPOINT_PATH={model_dir}",  # a model folder: its latest step
            f"--gin.EVAL_OUTPUT_DIR={out}",
            "--gin.MIXTURE_OR_TASK_NAME='builtin_mc_copy'",
            "--gin.TASK_FEATURE_LENGTHS={'inputs': 48, 'targets': 24}",
            "--gin.EVAL_MAX_EXAMPLES=8",
            "--gin.BATCH_SIZE=8",
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    tasks = sorted(p.name.removesuffix("-metrics.jsonl") for p in out.glob("*-metrics.jsonl"))
    assert len(tasks) >= 2 and all(t.startswith("builtin_mc_copy_") for t in tasks)
    for task in tasks:
        assert f"[decode] {task}: scored 8/8 examples" in printed
        (metrics,) = _lines(out / f"{task}-metrics.jsonl")
        assert metrics["step"] == 4
        rows = _lines(out / f"{task}-000004.jsonl")
        # Rank classification from the logged scores: the best-scored option of each example.
        options = collections.defaultdict(list)
        for row in rows:
            (example, _), is_correct = row["target"][0], row["target"][1]
            options[example].append((row["score"], is_correct))
        expected = 100 * sum(max(o)[1] for o in options.values()) / len(options)
        assert len(options) == 2
        assert metrics["accuracy"] == pytest.approx(expected)
        assert _scalars(out / task)[("eval/accuracy", 4)] == pytest.approx(expected)


def test_all_mode_picks_up_new_checkpoints_and_resumes_where_it_stopped(
    model_dir, tmp_path, capsys, monkeypatch
):
    out = tmp_path / "eval"
    args = [
        "eval",
        f"--gin.CHECKPOINT_PATH={model_dir}",
        f"--gin.EVAL_OUTPUT_DIR={out}",
        "--gin.EVAL_STEPS='all'",
        "--gin.EVAL_MAX_EXAMPLES=2",
        "--gin.BATCH_SIZE=2",
    ]
    import t5x.launch._eval_job as eval_job

    # Step 4 is saved while step 2 is evaluated: the first listing has step 2 only.
    listings = []
    real = eval_job.complete_steps

    def growing(folder):
        listings.append(folder)
        return real(folder)[: len(listings)]

    monkeypatch.setattr(eval_job, "complete_steps", growing)
    assert main(args) == 0
    monkeypatch.setattr(eval_job, "complete_steps", real)
    metrics = out / "synthetic_copy-metrics.jsonl"
    assert [m["step"] for m in _lines(metrics)] == [2, 4]
    assert (out / "synthetic_copy-000002.jsonl").exists() and (out / "synthetic_copy-000004.jsonl").exists()
    # A run killed after step 2: only step 4 is evaluated again.
    metrics.write_text(metrics.read_text().splitlines()[0] + "\n")
    (out / "synthetic_copy-000004.jsonl").unlink()
    capsys.readouterr()
    assert main(args) == 0
    assert [m["step"] for m in _lines(metrics)] == [2, 4]
    printed = capsys.readouterr().out
    assert "step 4 synthetic_copy" in printed and "step 2 synthetic_copy" not in printed
    assert main(args) == 0
    assert "every checkpoint in" in capsys.readouterr().out
    assert [m["step"] for m in _lines(metrics)] == [2, 4]


def _error(capsys, args):
    assert main(["eval", *args]) == 2
    return capsys.readouterr().err


def test_bad_checkpoint_paths_and_configs_are_named(model_dir, tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "notes.txt").write_text("x")
    err = _error(capsys, [f"--gin.CHECKPOINT_PATH={empty}"])
    assert f"CHECKPOINT_PATH={empty} is not a checkpoint" in err and "notes.txt" in err
    assert "Traceback" not in err
    err = _error(capsys, [f"--gin.CHECKPOINT_PATH={tmp_path}/missing"])
    assert "does not exist" in err
    err = _error(capsys, [])
    assert "eval needs a checkpoint: --gin.CHECKPOINT_PATH=DIR" in err
    bare = tmp_path / "bare"
    shutil.copytree(model_dir / "checkpoint_2", bare / "checkpoint_2")
    err = _error(capsys, [f"--gin.CHECKPOINT_PATH={bare}"])
    assert f"no config.gin in the model folder {bare}" in err
    err = _error(
        capsys,
        [
            f"--gin.CHECKPOINT_PATH={model_dir}",
            f"--gin.EVAL_OUTPUT_DIR={tmp_path}/e",
            "--gin.EVAL_STEPS='specific'",
        ],
    )
    assert "steps='specific' evaluates one checkpoint_<step> folder" in err
    err = _error(
        capsys,
        [f"--gin.CHECKPOINT_PATH={model_dir}", f"--gin.EVAL_OUTPUT_DIR={tmp_path}/e", "--gin.EVAL_STEPS=3"],
    )
    assert "no complete checkpoint for step 3" in err and "[2, 4]" in err


def test_a_model_that_cannot_serve_the_checkpoint_is_named(model_dir, tmp_path, capsys):
    err = _error(
        capsys,
        [
            f"--gin.CHECKPOINT_PATH={model_dir}",
            f"--gin.EVAL_OUTPUT_DIR={tmp_path}/e",
            "--gin.models.T5Config.vocab_size=256",
        ],
    )
    # The first parameter whose shape differs, with both shapes.
    assert re.search(
        r"parameter \S+ has shape \((384, 32|32, 384)\), the configured model expects \((256, 32|32, 256)\)",
        err,
    ), err
    assert "cannot serve this configuration" in err


def test_a_task_the_checkpoint_cannot_serve_is_named():
    import numpy as np

    class Vocabulary:
        vocab_size = 500

    class Feature:
        vocabulary = Vocabulary()

    class Task:
        name = "big_vocab_task"

        def __init__(self):
            self.output_features = {"inputs": Feature(), "targets": Feature()}

    params = {"token_embedder": {"embedding": np.zeros((384, 4))}}
    with pytest.raises(
        ConfigurationError, match=r"vocabulary of 500 tokens, but the model of ckpt embeds only 384"
    ):
        check_task_fits(None, Task(), {"inputs": 8, "targets": 8}, "ckpt", params)
    Vocabulary.vocab_size = 300
    with pytest.raises(
        ConfigurationError, match=r"has no length for the task big_vocab_task's feature 'targets'"
    ):
        check_task_fits(None, Task(), {"inputs": 8}, "ckpt", params)
    with pytest.raises(
        ConfigurationError, match=r"TASK_FEATURE_LENGTHS\['inputs'\] must be a positive int, got 0"
    ):
        check_task_fits(None, Task(), {"inputs": 0, "targets": 8}, "ckpt", params)
    check_task_fits(None, Task(), {"inputs": 8, "targets": 8}, "ckpt", params)


def test_reuse_reads_a_config_gin_without_running_a_model(tmp_path):
    from t5x.launch._gin_config import split_gin_flags
    from t5x.launch._reuse_config import reuse_training_config

    run = tmp_path / "run"
    (run / "checkpoint_8").mkdir(parents=True)
    (run / "checkpoint_8" / "checkpoint").write_bytes(b"index")
    (run / "config.gin").write_text(
        "MODEL = @models.EncoderDecoderModel()\n"
        "MIXTURE_OR_TASK_NAME = 'my_task'\n"
        "TASK_FEATURE_LENGTHS = {'inputs': 64,\n 'targets': 16}\n"  # wrapped by gin's printer
        "NUM_PARTITIONS = 2\n"
        "MODEL/models.T5Config.emb_dim = 32\n"
    )
    _, flags = split_gin_flags(
        [f"--gin.CHECKPOINT_PATH={run}/checkpoint_8", "--gin.models.T5Config.emb_dim=8"]
    )
    reused = reuse_training_config(
        "infer", "runs/infer.gin", [], flags, output_macro="INFER_OUTPUT_DIR", output_subdir="infer"
    )
    assert reused.model_dir == run and reused.files == (str(run / "config.gin"), "runs/infer.gin")
    assert reused.carried == {
        "MIXTURE_OR_TASK_NAME": "'my_task'",
        "TASK_FEATURE_LENGTHS": "{'inputs': 64, 'targets': 16}",
        "NUM_PARTITIONS": "2",
    }
    # Carried values, the default output folder, the user's flags, and the user's flag again in
    # config.gin's scope (which would otherwise win over it).
    assert list(reused.bindings) == [
        "MIXTURE_OR_TASK_NAME = 'my_task'",
        "TASK_FEATURE_LENGTHS = {'inputs': 64, 'targets': 16}",
        "NUM_PARTITIONS = 2",
        f"INFER_OUTPUT_DIR = {str(run / 'infer')!r}",
        *flags,
        "MODEL/models.T5Config.emb_dim = 8",
    ]
    assert "reusing the training config" in reused.summary("infer") and "my_task" in reused.summary("infer")
    # A run that bound its training data without macros; a model gin file given: nothing reused.
    (run / "config.gin").write_text(
        "train/launch.DatasetConfig.mixture_or_task_name = 'other'\n"
        "train/launch.DatasetConfig.task_feature_lengths = {'inputs': 8, 'targets': 8}\n"
    )
    reused = reuse_training_config(
        "eval",
        "runs/eval.gin",
        ["runs/eval.gin"],
        flags,
        output_macro="EVAL_OUTPUT_DIR",
        output_subdir="eval",
    )
    assert reused.carried == {
        "MIXTURE_OR_TASK_NAME": "'other'",
        "TASK_FEATURE_LENGTHS": "{'inputs': 8, 'targets': 8}",
    }
    assert (
        reuse_training_config(
            "eval",
            "runs/eval.gin",
            ["models/t5_1_1/small.gin", "runs/eval.gin"],
            flags,
            output_macro="EVAL_OUTPUT_DIR",
            output_subdir="eval",
        )
        is None
    )
