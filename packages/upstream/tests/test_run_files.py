"""Upstream's other run files under t5x-launch: precompile, deterministic pretraining, TFExample inference.

Each runs through the installed command with a seqio-style task module and the
tiny upstream-style model file of ``_upstream_fixtures``.
"""

import concurrent.futures
import json

import numpy as np
import pytest
from _upstream_fixtures import TASK, TASK_MODULE, launch, write_experiment

LENGTHS = "--gin.TASK_FEATURE_LENGTHS={'inputs': 16, 'targets': 16}"


@pytest.fixture(scope="module")
def experiment(tmp_path_factory, spm_path):
    folder = tmp_path_factory.mktemp("runs")
    model_gin, _ = write_experiment(folder, spm_path)
    run_gin = folder / "deterministic.gin"
    run_gin.write_text(
        "from __gin__ import dynamic_registration\nimport __main__ as train_script\nfrom t5x import utils\n"
        f"include {str(model_gin)!r}\n"
        "include 't5x/configs/runs/pretrain_deterministic.gin'\n"
        "USE_CACHED_TASKS = False\n"
        f"MIXTURE_OR_TASK_MODULE = {TASK_MODULE!r}\n"
        "train/utils.DatasetConfig.batch_size = 8\n"
        "train_eval/utils.DatasetConfig.batch_size = 8\n"
        "utils.create_learning_rate_scheduler.warmup_steps = 2\n"
    )
    return folder, model_gin, run_gin


def _losses(model_dir):
    rows = [json.loads(line) for line in (model_dir / "metrics.jsonl").read_text().splitlines()]
    return [(row["step"], row["loss"]) for row in rows if "loss" in row]


@pytest.fixture(scope="module")
def deterministic_runs(experiment):
    """The same deterministic pretraining twice, side by side: through t5x-launch, and through
    upstream's command line (``python -m t5x.train``, its flags as upstream users write them)."""
    folder, _, run_gin = experiment
    common = (
        f"--gin_file={run_gin}", f'--gin.MIXTURE_OR_TASK_NAME="{TASK}"', LENGTHS, "--gin.TRAIN_STEPS=3",
        "--gin.train_script.train.eval_period=3", "--gin.train_script.train.stats_period=1",
        "--gin.utils.SaveCheckpointConfig.period=3",
    )  # fmt: skip
    dirs = [folder / "first", folder / "second"]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        runs = [
            pool.submit(launch, folder, "train", *common, f"--gin.MODEL_DIR={dirs[0]}"),
            pool.submit(
                launch,
                folder,
                *common,
                f'--gin.MODEL_DIR="{dirs[1]}"',
                "--alsologtostderr",
                module="t5x.train",
            ),
        ]
        for run in runs:
            run.result()
    return dirs


def test_deterministic_pretraining_repeats_itself(deterministic_runs):
    first, second = deterministic_runs
    assert "get_dataset_fn = @utils.get_deterministic_dataset" in (first / "config.gin").read_text()
    losses = _losses(first)
    assert len(losses) >= 2 and losses == _losses(second)


def test_upstreams_command_line_flags_are_translated_or_named():
    from t5x.upstream._command_line import UpstreamFlagError, translate

    args, env, cache_dirs = translate(
        [
            "--gin_file=a.gin", "--gin_file", "b.gin", "--gin.MODEL_DIR='/m'", "--gin_bindings=X = 1",
            "--run_mode=eval", "--tfds_data_dir=/tfds", "--seqio_additional_cache_dirs=/c1,/c2",
            "--multiprocess_gpu", "--coordinator_address=h:1234", "--process_count=2", "--process_index=1",
            "--alsologtostderr", "--v=1",
        ],
        None,
    )  # fmt: skip
    assert args == [
        "eval",
        "--gin_file=a.gin",
        "--gin_file=b.gin",
        "--gin.MODEL_DIR='/m'",
        "--gin_bindings=X = 1",
    ]
    assert env == {
        "TFDS_DATA_DIR": "/tfds",
        "T5X_COORDINATOR_ADDRESS": "h:1234",
        "T5X_NUM_PROCESSES": "2",
        "T5X_PROCESS_ID": "1",
    }
    assert cache_dirs == ["/c1", "/c2"]
    with pytest.raises(UpstreamFlagError, match="--run_mode is required"):
        translate(["--gin_file=a.gin"], None)
    with pytest.raises(UpstreamFlagError, match="unknown flag --dry_run"):
        translate(["--dry_run"], "train")


def test_inference_from_tfexample_files(experiment, deterministic_runs, tmp_path):
    import tensorflow as tf

    folder, model_gin, _ = experiment
    texts = ["the quick brown fox", "a lazy dog", "seven small birds"]
    records = tmp_path / "requests.tfrecord"
    with tf.io.TFRecordWriter(str(records)) as writer:
        for text in texts:
            feature = tf.train.Feature(bytes_list=tf.train.BytesList(value=[text.encode()]))
            example = tf.train.Example(features=tf.train.Features(feature={"inputs": feature}))
            writer.write(example.SerializeToString())
    out = tmp_path / "infer"
    launch(
        folder, "infer", f"--gin_file={model_gin}", "--gin_file=t5x/configs/runs/infer_from_tfexample_file.gin",
        f"--gin.TF_EXAMPLE_FILE_PATHS=[{str(records)!r}]", "--gin.TF_EXAMPLE_FILE_TYPE='tfrecord'",
        "--gin.FEATURE_LENGTHS={'inputs': 16, 'targets': 16}",
        f"--gin.CHECKPOINT_PATH={deterministic_runs[0] / 'checkpoint_3'}", f"--gin.INFER_OUTPUT_DIR={out}",
    )  # fmt: skip
    (written,) = out.glob("infer_from_tfexample_file_*-predict.jsonl-00000-of-00001")
    rows = [json.loads(line) for line in written.read_text().splitlines()]
    assert [row["inputs"]["inputs_pretokenized"] for row in rows] == texts
    assert all(isinstance(row["prediction"], str) for row in rows)

    # A Google-internal file type is named, with what to use instead.
    refused = launch(
        folder, "infer", f"--gin_file={model_gin}", "--gin_file=t5x/configs/runs/infer_from_tfexample_file.gin",
        f"--gin.TF_EXAMPLE_FILE_PATHS=[{str(records)!r}]", "--gin.TF_EXAMPLE_FILE_TYPE='sstable'",
        "--gin.FEATURE_LENGTHS={'inputs': 16, 'targets': 16}",
        f"--gin.CHECKPOINT_PATH={deterministic_runs[0] / 'checkpoint_3'}", f"--gin.INFER_OUTPUT_DIR={out}2",
        expect=2,
    )  # fmt: skip
    assert "file_type='sstable'" in refused.stderr and "tfrecord" in refused.stderr
    assert "Traceback" not in refused.stderr


def test_precompile_fills_the_cache_and_writes_upstreams_hlo_files(experiment):
    folder, model_gin, _ = experiment
    run_gin = folder / "precompile.gin"
    run_gin.write_text(
        "from __gin__ import dynamic_registration\nfrom t5x import utils\n"
        f"include {str(model_gin)!r}\n"
        "include 't5x/configs/runs/precompile.gin'\n"
        "USE_CACHED_TASKS = False\nBATCH_SIZE = 8\nRANDOM_SEED = 0\n"
        f"train/utils.DatasetConfig.module = {TASK_MODULE!r}\n"
    )
    model_dir = folder / "precompiled"
    result = launch(
        folder, "precompile", f"--gin_file={run_gin}", f"--gin.MODEL_DIR={model_dir}",
        f"--gin.MIXTURE_OR_TASK_NAME={TASK}", LENGTHS,
    )  # fmt: skip
    assert "precompiled train_step" in result.stdout
    assert any(p.name.startswith("jit_train_step-") for p in (model_dir / "compilation_cache").iterdir())
    for name in ("lowered_hlo_pre_optimization", "lowered_hlo_post_optimization"):
        assert (model_dir / name).stat().st_size > 1000  # a serialized HloModuleProto
    assert np.load(model_dir / "assignment").tolist() == [[0]]  # one CPU device: data 1 x model 1

    # Upstream's own file asks for the TPU backend: on a machine without one, one clear message.
    tpu = launch(
        folder, "precompile", f"--gin_file={run_gin}", f"--gin.MODEL_DIR={folder / 'tpu'}",
        f"--gin.MIXTURE_OR_TASK_NAME={TASK}", LENGTHS, "--gin.partitioning.PjitPartitioner.backend='tpu'",
        expect=2,
    )  # fmt: skip
    assert "no 'tpu' devices" in tpu.stderr and "Traceback" not in tpu.stderr
