"""train -> eval -> infer -> export on one model folder, each through the `t5x-launch` command line.

eval, infer and export read the model folder only, so they run side by side.

The SavedModel that `export` writes is then served by TensorFlow in this process and must
decode the validation inputs exactly as `infer` did.
"""

import json
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))  # pytest's importlib mode adds no path
import _tiny

TASK = "synthetic_copy"
COMPARED = 16  # validation examples served through the SavedModel
STEP = 4  # the training steps, and the one checkpoint


def _ok(result):
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    return result


def _validation_inputs(count: int) -> list[str]:
    from t5x.tasks import get_mixture_or_task
    from t5x.tasks.builtin import register_builtin_tasks

    register_builtin_tasks()
    dataset = get_mixture_or_task(TASK).get_dataset(
        {"inputs": 24, "targets": 24}, split="validation", shuffle=False
    )
    return [ex["inputs_pretokenized"].decode() for ex in dataset.take(count).as_numpy_iterator()]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    # Its own 4-step run, not the session's 6-step reference: that model decodes the validation
    # inputs to whitespace only, which `infer` writes as '' and the SavedModel serves as is.
    tmp = tmp_path_factory.mktemp("run_modes")
    model_dir = tmp / "model"
    _ok(_tiny.run_raw(["train", *_tiny.ENCDEC, *_tiny.train_args(model_dir, STEP, STEP)], tmp))
    assert _tiny.steps_of(model_dir) == [STEP]
    return tmp, model_dir


@pytest.mark.slow
def test_train_eval_infer_export_on_one_model_folder(trained):
    tmp, model_dir = trained
    eval_dir, infer_dir, export_dir = tmp / "eval", tmp / "infer", tmp / "export"
    # export with the model's gin flags (the task and batch size are not its business). Reusing the
    # folder's config.gin is checked below.
    model_args = [
        a for a in _tiny.ENCDEC if not a.startswith(("--gin.MIXTURE_OR_TASK_NAME=", "--gin.BATCH_SIZE="))
    ]
    # The three read the model folder only: they run side by side.
    results = _tiny.run_side_by_side(
        {
            "eval": (
                [
                    "eval",
                    *_tiny.ENCDEC,
                    "--gin_file=runs/eval.gin",
                    f"--gin.CHECKPOINT_PATH={model_dir}",
                    f"--gin.EVAL_OUTPUT_DIR={eval_dir}",
                    "--gin.launch.evaluate.max_examples=16",
                ],
                tmp,
            ),
            "infer": (
                [
                    "infer",
                    *_tiny.ENCDEC,
                    "--gin_file=runs/infer.gin",
                    f"--gin.CHECKPOINT_PATH={model_dir / f'checkpoint_{STEP}'}",
                    f"--gin.INFER_OUTPUT_DIR={infer_dir}",
                    "--gin.SPLIT=validation",
                    "--gin.BATCH_SIZE=100",
                ],
                tmp,
            ),
            "export": (
                [
                    "export",
                    *model_args,
                    f"--gin.CHECKPOINT_PATH={model_dir}",
                    f"--gin.EXPORT_OUTPUT_DIR={export_dir}",
                ],
                tmp,
            ),
        }
    )
    _ok(results["eval"])
    metrics = sorted(eval_dir.glob("*metrics.jsonl"))  # one file, or one per task
    assert metrics and all(_tiny.read_jsonl(path) for path in metrics), list(eval_dir.iterdir())

    _ok(results["infer"])
    outputs = sorted(
        p for p in infer_dir.glob("*.jsonl*") if p.is_file() and not p.name.endswith(".COMPLETED")
    )
    assert outputs, list(infer_dir.iterdir())
    records = sorted(_tiny.read_jsonl(outputs[0]), key=lambda r: r["index"])[:COMPARED]

    result = _ok(results["export"])
    assert "exported a predict SavedModel" in result.stdout
    assert (export_dir / "saved_model.pb").is_file() and (export_dir / "variables").is_dir()
    metadata = json.loads((export_dir / "t5x_export.json").read_text())
    assert metadata["task_feature_lengths"] == {"inputs": 24, "targets": 24}

    import tensorflow as tf

    serve = tf.saved_model.load(str(export_dir)).signatures["serving_default"]
    served = serve(text_batch=tf.constant(_validation_inputs(COMPARED)))["output_0"].numpy()
    assert [t.decode() for t in served] == [r["prediction"] for r in records]


def test_export_names_bad_input(trained, tmp_path):
    _, model_dir = trained
    not_a_checkpoint = tmp_path / "empty"
    not_a_checkpoint.mkdir()
    results = _tiny.run_side_by_side(
        {
            "not a checkpoint": (
                [
                    "export", "--gin_file=models/demo/tiny.gin", f"--gin.CHECKPOINT_PATH={not_a_checkpoint}",
                    f"--gin.EXPORT_OUTPUT_DIR={tmp_path / 'out'}", "--gin.TASK_FEATURE_LENGTHS={'inputs': 8, 'targets': 8}",
                ],
                tmp_path,
            ),
            # Through the model folder's config.gin: an export mode that does not exist, refused by name.
            "bad mode": (
                [
                    "export", f"--gin.CHECKPOINT_PATH={model_dir}", f"--gin.EXPORT_OUTPUT_DIR={tmp_path / 'rank'}",
                    "--gin.export.export_saved_model.mode='rank'",
                ],
                tmp_path,
            ),
        }
    )  # fmt: skip
    result = results["not a checkpoint"]
    assert result.returncode == 2, result.stderr[-3000:]
    assert str(not_a_checkpoint) in result.stderr and "Traceback" not in result.stderr
    result = results["bad mode"]
    assert result.returncode == 2, result.stderr[-3000:]
    assert "mode must be one of" in result.stderr and "Traceback" not in result.stderr
