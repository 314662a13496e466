"""During training: periodic train-eval and inference-eval, actions from gin, save rules, best-checkpoint retention."""

import json

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
    "--gin.TASK_FEATURE_LENGTHS={'inputs': 16, 'targets': 16}",
    "--gin.BATCH_SIZE=8",
]
# Train-eval and inference-eval on the validation split, as runs/finetune.gin does.
EVAL_GIN = """
from __gin__ import dynamic_registration
from t5x import launch
from t5x import training

include 'runs/pretrain.gin'

launch.train:
  train_eval_dataset_cfg = @train_eval/launch.DatasetConfig()
  infer_eval_dataset_cfg = @infer_eval/launch.DatasetConfig()
  eval_batches = 1
  max_inference_examples = 8

train_eval/launch.DatasetConfig:
  mixture_or_task_name = %MIXTURE_OR_TASK_NAME
  task_feature_lengths = %TASK_FEATURE_LENGTHS
  split = 'validation'
  batch_size = %BATCH_SIZE
  shuffle = False
  pack = False

infer_eval/launch.DatasetConfig:
  mixture_or_task_name = %MIXTURE_OR_TASK_NAME
  task_feature_lengths = %TASK_FEATURE_LENGTHS
  split = 'validation'
  batch_size = %BATCH_SIZE
  shuffle = False
  pack = False
"""


def _metrics(model_dir):
    return [json.loads(line) for line in (model_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory):
    """6 steps, eval_period 2: saves at 2, 4, 6 and at checkpoint_steps [1]; keeps the newest and the best."""
    folder = tmp_path_factory.mktemp("during")
    gin_file = folder / "eval_run.gin"
    gin_file.write_text(EVAL_GIN)
    model_dir = folder / "run"
    args = [
        "train",
        *TINY,
        f"--gin_file={gin_file}",
        *DATA,
        f"--gin.MODEL_DIR={model_dir}",
        "--gin.TRAIN_STEPS=6",
        "--gin.EVAL_PERIOD=2",
        "--gin.CHECKPOINT_PERIOD=2",
        "--gin.CHECKPOINT_STEPS=[1]",
        "--gin.CHECKPOINTS_TO_KEEP=1",
        "--gin.launch.SaveCheckpointConfig.metric_name_to_monitor='synthetic_copy/loss'",
        "--gin.launch.SaveCheckpointConfig.metric_mode='max'",
    ]
    assert main(args) == 0
    return model_dir


def test_inference_eval_runs_every_eval_period(evaluated, capsys):
    lines = _metrics(evaluated)
    infer_steps = sorted(
        {line["step"] for line in lines if any(k.startswith("inference_eval/") for k in line)}
    )
    assert infer_steps == [2, 4, 6]
    eval_steps = sorted({line["step"] for line in lines if "synthetic_copy/loss" in line})
    assert eval_steps == [2, 4, 6]
    for step in (2, 4, 6):
        assert (evaluated / "inference_eval" / f"synthetic_copy-{step:06d}.jsonl").exists()


def test_best_checkpoint_and_checkpoint_steps_are_kept(evaluated):
    losses = {
        line["step"]: line["synthetic_copy/loss"]
        for line in _metrics(evaluated)
        if "synthetic_copy/loss" in line
    }
    best = max(losses, key=losses.get)
    kept = sorted(int(p.name.split("_")[1]) for p in evaluated.glob("checkpoint_*[0-9]"))
    # 1: saved by checkpoint_steps, never evaluated (kept: keep_checkpoints_without_metrics);
    # 6: the newest (keep=1); the best loss ('max') among the evaluated steps.
    assert kept == sorted({1, 6, best})
    assert len({losses[2], losses[4], losses[6]}) == 3  # the retention rule had a choice to make


def test_early_stopping_action_from_gin_ends_training_normally(tmp_path, capsys):
    gin_file = tmp_path / "eval_run.gin"
    actions = """
launch.train.infer_eval_dataset_cfg = None
launch.train.actions = {'TRAIN_EVAL': [@training.EarlyStoppingAction()]}
training.EarlyStoppingAction:
  metric = ('synthetic_copy', 'loss')
  patience = 1
  atol = 1e9  # nothing counts as an improvement
"""
    gin_file.write_text(EVAL_GIN + actions)
    model_dir = tmp_path / "run"
    args = [
        "train",
        *TINY,
        f"--gin_file={gin_file}",
        *DATA,
        f"--gin.MODEL_DIR={model_dir}",
        "--gin.TRAIN_STEPS=1000",
        "--gin.EVAL_PERIOD=2",
        "--gin.CHECKPOINT_PERIOD=500",
    ]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert (
        "[t5x-launch] training stopped at step 4 by TRAIN_EVAL: EarlyStoppingAction(synthetic_copy/loss"
        in out
    )
    assert sorted(p.name for p in model_dir.glob("checkpoint_*[0-9]")) == ["checkpoint_4"]
