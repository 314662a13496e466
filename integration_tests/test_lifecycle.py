"""Pretrain -> resume -> eval -> infer through `t5x-launch`, and fine-tuning from a checkpoint.

Each model kind (encoder-decoder, causal decoder, prefix-LM decoder) is trained
for two steps, resumed to four, evaluated and run for inference (JSON Lines).
The encoder-decoder's pretraining runs on 8 virtual CPU devices with a 4 x 2
mesh, so its resume on one device is also the re-sharded restore. The kinds go
through the stages together, their launches side by side (each is mostly
interpreter and library start-up), and eval runs beside infer.
"""

import dataclasses
import json
import os
import pathlib
import subprocess
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


def _train_command(model_args, model_dir, steps):
    return ["train", *model_args, *_tiny.train_args(model_dir, steps, 2)]


def _task_of(args: list[str]) -> str:
    return next(a.split("=", 1)[1] for a in args if a.startswith("--gin.MIXTURE_OR_TASK_NAME="))


@dataclasses.dataclass
class Lifecycle:
    """One kind's model folder and what each stage's launch returned (None: not run)."""

    kind: str
    args: list[str]
    tmp: pathlib.Path
    pretrain: subprocess.CompletedProcess[str] | None = None
    steps_after_pretrain: list[int] = dataclasses.field(default_factory=list)
    files_after_pretrain: set[str] = dataclasses.field(default_factory=set)
    step2: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    resume: subprocess.CompletedProcess[str] | None = None
    eval: subprocess.CompletedProcess[str] | None = None
    infer: subprocess.CompletedProcess[str] | None = None

    @property
    def model_dir(self) -> pathlib.Path:
        return self.tmp / "model"

    def pretrain_job(self) -> tuple[list[str], dict[str, str]]:
        if self.kind == "encoder_decoder":
            command = _train_command([*self.args, "--gin.NUM_PARTITIONS=2"], self.model_dir, 2)
            return command, _tiny.launch_env(**EIGHT_DEVICES)
        return _train_command(self.args, self.model_dir, 2), _tiny.launch_env()

    def resume_job(self) -> list[str]:
        # On one device: the encoder-decoder's resume is also the re-sharded restore.
        return _train_command(self.args, self.model_dir, 4)

    def eval_job(self) -> list[str]:
        return [
            "eval",
            *_predict_args(self.kind, self.args),
            "--gin_file=runs/eval.gin",
            f"--gin.CHECKPOINT_PATH={self.model_dir}",
            f"--gin.EVAL_OUTPUT_DIR={self.tmp / 'eval'}",
            "--gin.launch.evaluate.max_examples=16",
        ]

    def infer_job(self) -> list[str]:
        return [
            "infer",
            *_predict_args(self.kind, self.args),
            "--gin_file=runs/infer.gin",
            f"--gin.CHECKPOINT_PATH={self.model_dir / 'checkpoint_4'}",
            f"--gin.INFER_OUTPUT_DIR={self.tmp / 'infer'}",
            "--gin.SPLIT=validation",
            "--gin.BATCH_SIZE=100",
        ]


@pytest.fixture(scope="module")
def lifecycles(tmp_path_factory) -> dict[str, Lifecycle]:
    """Every kind pretrained (2 steps), resumed (to 4), then evaluated and run for inference.

    The kinds' launches of one stage run side by side; a kind whose stage failed
    runs no later stage, and its test reports the failure.
    """
    runs = {}
    for kind in KINDS:
        tmp = tmp_path_factory.mktemp(kind)
        runs[kind] = Lifecycle(kind, _model_args(kind, tmp), tmp)
    workers = max(2, min(4, os.cpu_count() or 2))
    jobs = {}
    for kind, run in runs.items():
        command, env = run.pretrain_job()
        jobs[kind] = (command, run.tmp, env)
    done = _tiny.run_side_by_side(jobs, workers)
    for kind, result in done.items():
        run = runs[kind]
        run.pretrain = result
        run.steps_after_pretrain = _tiny.steps_of(run.model_dir)
        if run.model_dir.is_dir():
            run.files_after_pretrain = {p.name for p in run.model_dir.iterdir()}
        if result.returncode == 0 and (run.model_dir / "checkpoint_2").is_dir():
            run.step2 = _tiny.flatten(_tiny.load(run.model_dir / "checkpoint_2"))
    ready = [k for k, r in runs.items() if r.pretrain.returncode == 0]
    done = _tiny.run_side_by_side(
        {k: (runs[k].resume_job(), runs[k].tmp, _tiny.launch_env()) for k in ready}, workers
    )
    for kind, result in done.items():
        runs[kind].resume = result
    ready = [k for k in ready if runs[k].resume.returncode == 0]
    jobs = {}
    for kind in ready:
        jobs[kind, "eval"] = (runs[kind].eval_job(), runs[kind].tmp, _tiny.launch_env())
        jobs[kind, "infer"] = (runs[kind].infer_job(), runs[kind].tmp, _tiny.launch_env())
    for (kind, stage), result in _tiny.run_side_by_side(jobs, workers).items():
        setattr(runs[kind], stage, result)
    return runs


def _ok(result: subprocess.CompletedProcess[str] | None, what: str) -> None:
    assert result is not None, f"{what} did not run: an earlier stage failed"
    assert result.returncode == 0, (
        f"{what} exited {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
    )


@pytest.mark.parametrize("kind", KINDS)
def test_pretrain_resume_eval_infer(lifecycles, kind):
    run = lifecycles[kind]
    model_dir, tmp = run.model_dir, run.tmp
    _ok(run.pretrain, "pretrain")
    assert run.steps_after_pretrain == [2]
    assert {"config.gin", "model-info.txt"} <= run.files_after_pretrain, run.files_after_pretrain
    step2 = run.step2
    assert int(step2["state/step"]) == 2

    # Resume: the job continues from step 2 (on one device) instead of starting over.
    _ok(run.resume, "resume")
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
    _ok(run.eval, "eval")
    eval_dir = tmp / "eval"
    task = _task_of(_predict_args(kind, run.args))
    rows = _tiny.read_jsonl(eval_dir / f"{task}-metrics.jsonl")  # seqio's per-task metrics file
    assert rows and rows[-1]["step"] == 4
    metric_names = [k for k in rows[-1] if k != "step"]
    assert metric_names, rows[-1]
    assert all(np.isfinite(rows[-1][k]) for k in metric_names)
    assert len(_tiny.read_jsonl(eval_dir / f"{task}-000004.jsonl")) == 16  # one line per example

    # Inference on a split, written as JSON Lines in input order.
    _ok(run.infer, "infer")
    infer_dir = tmp / "infer"
    outputs = sorted(infer_dir.glob("*.jsonl-00000-of-00001"))
    assert len(outputs) == 1, list(infer_dir.iterdir())
    lines = outputs[0].read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert len(records) > 16
    assert [r["index"] for r in records] == list(range(len(records)))
    assert all(isinstance(r["prediction"], str) for r in records)


def test_finetune_starts_from_pretrained_params_with_fresh_optimizer(tmp_path, encdec_reference):
    pre = encdec_reference  # ENCDEC pretrained by `t5x-launch train` (shared: read only)
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
