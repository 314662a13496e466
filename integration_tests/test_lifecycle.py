"""Pretrain -> resume -> eval -> infer through `t5x-launch`, and fine-tuning from a checkpoint.

Each model kind (encoder-decoder, causal decoder, prefix-LM decoder) is trained
for two steps, resumed to four, evaluated and run for inference (JSON Lines).
The encoder-decoder's pretraining runs on 8 virtual CPU devices with a 4 x 2
mesh, so its resume on one device is also the re-sharded restore.
"""

import json
import pathlib
import sys

import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))  # pytest's importlib mode adds no path
import _tiny

KINDS = ["encoder_decoder", "causal_decoder", "prefix_lm_decoder"]
EIGHT_DEVICES = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8"}


def _model_args(kind: str, tmp: pathlib.Path) -> list[str]:
    if kind == "encoder_decoder":
        return list(_tiny.ENCDEC)
    return _tiny.decoder_args(tmp, prefix_lm=kind == "prefix_lm_decoder")


def _predict_args(kind: str, args: list[str]) -> list[str]:
    """Flags for eval / infer: the causal decoder, pretrained on a plain LM task,
    is asked to continue prompts of a text-to-text task (prediction needs a prompt)."""
    if kind != "causal_decoder":
        return args
    kept = [
        a for a in args if not a.startswith(("--gin.MIXTURE_OR_TASK_NAME=", "--gin.TASK_FEATURE_LENGTHS="))
    ]
    return [
        *kept,
        "--gin.MIXTURE_OR_TASK_NAME=synthetic_copy",
        "--gin.TASK_FEATURE_LENGTHS={'inputs': 16, 'targets': 16}",
    ]


def _train(model_args, model_dir, steps, cwd, env=None):
    result = _tiny.run_raw(
        ["train", *model_args, *_tiny.train_args(model_dir, steps, 2)],
        cwd,
        env=_tiny.launch_env(**(env or {})),
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    return result


@pytest.fixture(scope="module", params=KINDS)
def pretrained(request, tmp_path_factory):
    """(kind, model args, model folder, tmp) after 2 pretraining steps."""
    kind = request.param
    tmp = tmp_path_factory.mktemp(kind)
    args = _model_args(kind, tmp)
    model_dir = tmp / "model"
    if kind == "encoder_decoder":
        _train([*args, "--gin.NUM_PARTITIONS=2"], model_dir, 2, tmp, env=EIGHT_DEVICES)
    else:
        _train(args, model_dir, 2, tmp)
    return kind, args, model_dir, tmp


def test_pretrain_resume_eval_infer(pretrained):
    kind, args, model_dir, tmp = pretrained
    assert _tiny.steps_of(model_dir) == [2]
    assert (model_dir / "config.gin").exists() and (model_dir / "model-info.txt").exists()
    step2 = _tiny.flatten(_tiny.load(model_dir / "checkpoint_2"))
    assert int(step2["state/step"]) == 2

    # Resume: the job continues from step 2 (on one device) instead of starting over.
    _train(args, model_dir, 4, tmp)
    assert _tiny.steps_of(model_dir) == [2, 4]
    step4 = _tiny.flatten(_tiny.load(model_dir / "checkpoint_4"))
    assert int(step4["state/step"]) == 4
    again = _tiny.flatten(_tiny.load(model_dir / "checkpoint_2"))
    for name, value in step2.items():
        np.testing.assert_array_equal(again[name], value, err_msg=f"resume rewrote checkpoint_2: {name}")
    assert any(not np.array_equal(step4[k], step2[k]) for k in step2 if k.startswith("target/"))
    logged = [row["step"] for row in _tiny.read_jsonl(model_dir / "metrics.jsonl") if "step" in row]
    assert len(logged) == len(set(logged)), f"steps trained twice after resume: {logged}"
    assert max(logged) == 4

    # Eval of the latest checkpoint.
    args = _predict_args(kind, args)
    eval_dir = tmp / "eval"
    result = _tiny.run_raw(
        [
            "eval",
            *args,
            "--gin_file=runs/eval.gin",
            f"--gin.CHECKPOINT_PATH={model_dir}",
            f"--gin.EVAL_OUTPUT_DIR={eval_dir}",
            "--gin.launch.evaluate.max_examples=16",
        ],
        tmp,
    )
    assert result.returncode == 0, result.stderr[-5000:]
    task = args[[a.startswith("--gin.MIXTURE_OR_TASK_NAME=") for a in args].index(True)].split("=", 1)[1]
    rows = _tiny.read_jsonl(eval_dir / f"{task}-metrics.jsonl")  # seqio's per-task metrics file
    assert rows and rows[-1]["step"] == 4
    metric_names = [k for k in rows[-1] if k != "step"]
    assert metric_names, rows[-1]
    assert all(np.isfinite(rows[-1][k]) for k in metric_names)
    assert len(_tiny.read_jsonl(eval_dir / f"{task}-000004.jsonl")) == 16  # one line per example

    # Inference on a split, written as JSON Lines in input order.
    infer_dir = tmp / "infer"
    result = _tiny.run_raw(
        [
            "infer",
            *args,
            "--gin_file=runs/infer.gin",
            f"--gin.CHECKPOINT_PATH={model_dir / 'checkpoint_4'}",
            f"--gin.INFER_OUTPUT_DIR={infer_dir}",
            "--gin.SPLIT=validation",
            "--gin.BATCH_SIZE=100",
        ],
        tmp,
    )
    assert result.returncode == 0, result.stderr[-5000:]
    outputs = sorted(infer_dir.glob("*.jsonl-00000-of-00001"))
    assert len(outputs) == 1, list(infer_dir.iterdir())
    lines = outputs[0].read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert len(records) > 16
    assert [r["index"] for r in records] == list(range(len(records)))
    assert all(isinstance(r["prediction"], str) for r in records)


def test_finetune_starts_from_pretrained_params_with_fresh_optimizer(tmp_path):
    pre = tmp_path / "pre"
    _train(_tiny.ENCDEC, pre, 2, tmp_path)
    ft = tmp_path / "ft"
    result = _tiny.run_raw(
        [
            "train",
            *_tiny.ENCDEC,
            "--gin_file=runs/finetune.gin",
            f"--gin.MODEL_DIR={ft}",
            f"--gin.INITIAL_CHECKPOINT_PATH={pre / 'checkpoint_2'}",
            "--gin.TRAIN_STEPS=1",
            "--gin.CHECKPOINT_PERIOD=1",
            "--gin.EVAL_PERIOD=None",
            "--gin.BATCH_SIZE=8",
            "--gin.LEARNING_RATE=0.0",
            "--gin.launch.train.infer_eval_dataset_cfg=None",
            "--gin.launch.train.train_eval_dataset_cfg=None",
        ],
        tmp_path,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    # A zero learning rate keeps the parameters where the run started, so the
    # one checkpoint shows the starting point: the pretrained parameters, and a
    # step counter (part of the optimizer state) that restarted from 0.
    assert _tiny.steps_of(ft) == [1]
    source = _tiny.flatten(_tiny.load(pre / "checkpoint_2"))
    start = _tiny.flatten(_tiny.load(ft / "checkpoint_1"))
    assert int(source["state/step"]) == 2 and int(start["state/step"]) == 1
    params = [k for k in source if k.startswith("target/")]
    assert params and set(params) == {k for k in start if k.startswith("target/")}
    for name in params:
        np.testing.assert_array_equal(start[name], source[name], err_msg=name)
