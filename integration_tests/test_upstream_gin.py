"""Upstream t5x gin files run unchanged under ``t5x-launch`` with a seqio task module (t5x-upstream).

A user's task module written for seqio (``import seqio``, ``seqio.TaskRegistry.add``
with seqio preprocessors) and an upstream-style experiment file (including
``t5x/examples/t5/t5_1_1/small.gin`` and ``t5x/configs/runs/pretrain.gin``,
shrunk by overrides) pretrain, then evaluate and infer through upstream's
``runs/eval.gin`` and ``runs/infer.gin``, all through the installed command.
"""

import concurrent.futures
import json
import os
import pathlib
import subprocess
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parents[1] / "packages" / "upstream" / "tests"))
from _upstream_fixtures import TASK, TASK_MODULE, write_experiment


def _spm(folder: pathlib.Path) -> str:
    import sentencepiece as spm

    corpus = folder / "corpus.txt"
    words = (
        "the quick brown fox jumps over a lazy dog while seven small birds sing near the river bank".split()
    )
    corpus.write_text(
        "\n".join(" ".join(words[(i * 7 + j) % len(words)] for j in range(9)) for i in range(300))
    )
    spm.SentencePieceTrainer.train(
        input=str(corpus), model_prefix=str(folder / "tiny"), vocab_size=40, model_type="unigram",
        pad_id=0, eos_id=1, unk_id=2, bos_id=-1, minloglevel=2,
    )  # fmt: skip
    return str(folder / "tiny.model")


def _launch(folder: pathlib.Path, *args: str) -> subprocess.CompletedProcess[str]:
    script = pathlib.Path(sys.executable).with_name("t5x-launch")
    # As upstream users do, the task module is found on PYTHONPATH.
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(folder))
    result = subprocess.run(
        [str(script), *args], cwd=folder, env=env, capture_output=True, text=True, timeout=1200
    )
    if result.returncode != 0:
        raise AssertionError(
            f"t5x-launch {' '.join(args)} exited {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
        )
    return result


@pytest.mark.slow
def test_upstream_gin_files_train_evaluate_and_infer(tmp_path):
    model_gin, pretrain_gin = write_experiment(tmp_path, _spm(tmp_path))
    model_dir = tmp_path / "model"
    lengths = "--gin.TASK_FEATURE_LENGTHS={'inputs': 16, 'targets': 16}"
    trained = _launch(
        tmp_path, "train", f"--gin_file={pretrain_gin}", f"--gin.MODEL_DIR={model_dir}",
        f"--gin.MIXTURE_OR_TASK_NAME={TASK}", lengths, "--gin.TRAIN_STEPS=3",
    )  # fmt: skip
    assert "finished at step 3" in trained.stdout
    assert sorted(p.name for p in model_dir.glob("checkpoint_*")) == ["checkpoint_2", "checkpoint_3"]
    config = (model_dir / "config.gin").read_text()
    assert "import __main__ as train_script" in config and "emb_dim = 32" in config
    losses = [json.loads(line) for line in (model_dir / "metrics.jsonl").read_text().splitlines()]
    assert any("loss" in str(row) for row in losses)

    common = [
        f"--gin_file={model_gin}",
        f"--gin.MIXTURE_OR_TASK_NAME={TASK}",
        f"--gin.MIXTURE_OR_TASK_MODULE={TASK_MODULE}",
    ]
    # eval and infer read the checkpoint only: they run side by side.
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        evaluating = pool.submit(
            _launch, tmp_path, "eval", *common, "--gin_file=t5x/configs/runs/eval.gin",
            f"--gin.CHECKPOINT_PATH={model_dir / 'checkpoint_3'}", f"--gin.EVAL_OUTPUT_DIR={tmp_path / 'eval'}",
        )  # fmt: skip
        inferring = pool.submit(
            _launch, tmp_path, "infer", *common, "--gin_file=t5x/configs/runs/infer.gin", lengths,
            f"--gin.CHECKPOINT_PATH={model_dir / 'checkpoint_3'}", f"--gin.INFER_OUTPUT_DIR={tmp_path / 'infer'}",
        )  # fmt: skip
        evaluated = evaluating.result()
        inferring.result()
    assert f"step 3 {TASK}: {{'exact_match':" in evaluated.stdout
    predictions = (tmp_path / "eval" / "inference_eval" / f"{TASK}-000003.jsonl").read_text().splitlines()
    assert len(predictions) == 8  # the whole test split (upstream's default split for eval)

    rows = [
        json.loads(line)
        for line in (tmp_path / "infer" / f"{TASK}-predict.jsonl-00000-of-00001").read_text().splitlines()
    ]
    assert [row["index"] for row in rows] == list(range(8))
    assert all(isinstance(row["prediction"], str) for row in rows)
