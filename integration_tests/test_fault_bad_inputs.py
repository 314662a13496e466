"""Bad input to the installed `t5x-launch`: one clear message, exit code 2, no model folder left.

Each case runs twice, plain and with `--verbose`: the plain run's stderr names
the culprit (the macro and its closest name, the parameter and its type, the
binding, the data file and line, the checkpoint file) without a traceback; the
verbose run adds the traceback. Every case fails before the first training
step, and none leaves the model (or target) folder it was given. The runs go in
parallel: each pays the interpreter and library start-up, the data cases a
model initialisation too.
"""

import concurrent.futures
import json
import os
import pathlib
import sys

import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))  # pytest's importlib mode adds no path
import _tiny

TASKS_MODULE = """\
import os

import tensorflow as tf

import t5x.tasks as tt
from t5x.vocabularies import ByteVocabulary

_HERE = os.path.dirname(os.path.abspath(__file__))
_VOCAB = ByteVocabulary(extra_ids=100)
_FEATURES = {"inputs": tt.Feature(_VOCAB), "targets": tt.Feature(_VOCAB)}
_STEPS = [tt.tokenize, tt.append_eos]
tt.TaskRegistry.add(
    "bad_jsonl",
    source=tt.JsonLinesDataSource({"train": os.path.join(_HERE, "data.jsonl")}),
    output_features=_FEATURES,
    preprocessors=_STEPS,
)
tt.TaskRegistry.add(
    "bad_tfrecord",
    source=tt.TFExampleDataSource(
        {"train": os.path.join(_HERE, "data.tfrecord")},
        {k: tf.io.FixedLenFeature([], tf.string) for k in ("inputs", "targets")},
    ),
    output_features=_FEATURES,
    preprocessors=_STEPS,
)
"""


def _write_inputs(data: pathlib.Path) -> None:
    import tensorflow as tf

    from t5x.checkpointing import write_hf_folder

    (data / "bad_tasks.py").write_text(TASKS_MODULE)
    good = json.dumps({"inputs": "abc", "targets": "cba"})
    (data / "data.jsonl").write_text(f"{good}\n{good}\n" + '{"inputs": "xyz", }\n' + f"{good}\n")
    record = data / "data.tfrecord"
    with tf.io.TFRecordWriter(str(record)) as writer:
        for i in range(32):
            feature = {
                k: tf.train.Feature(bytes_list=tf.train.BytesList(value=[f"text {i}".encode()]))
                for k in ("inputs", "targets")
            }
            writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    damaged = bytearray(record.read_bytes())
    damaged[60] ^= 0xFF  # inside the first record's payload: its checksum no longer matches
    record.write_bytes(bytes(damaged))
    hf = data / "hf"
    write_hf_folder(hf, {"shared.weight": np.ones((64, 8), np.float32)}, {"model_type": "t5"})
    weights = hf / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])


def _train(out: pathlib.Path, *extra: str) -> list[str]:
    return ["train", *_tiny.ENCDEC, *_tiny.train_args(out / "model", 2, 1), *extra]


# name -> (arguments given the case's folder and the data folder, what stderr must name)
CASES = {
    "macro_typo": (
        lambda out, data: _train(out, "--gin.TRAIN_STEPZ=2"),
        lambda data: ["unknown gin macro TRAIN_STEPZ", "--gin.TRAIN_STEPZ=2", "Closest: TRAIN_STEPS"],
    ),
    "wrong_type": (
        lambda out, data: _train(out, "--gin.TRAIN_STEPS=ten"),
        lambda data: ["launch.train.total_steps expects int, got 'ten'", "TRAIN_STEPS"],
    ),
    "syntax_error": (
        lambda out, data: _train(out, "--gin_bindings=TRAIN_STEPS = (2"),
        lambda data: ["gin syntax error in --gin_bindings='TRAIN_STEPS = (2'"],
    ),
    "bad_jsonl": (
        lambda out, data: _train(
            out, "--gin.MIXTURE_OR_TASK_NAME=bad_jsonl", "--gin.MIXTURE_OR_TASK_MODULE=bad_tasks"
        ),
        lambda data: [f"{data / 'data.jsonl'}:3: invalid JSON"],
    ),
    "corrupt_tfrecord": (
        lambda out, data: _train(
            out, "--gin.MIXTURE_OR_TASK_NAME=bad_tfrecord", "--gin.MIXTURE_OR_TASK_MODULE=bad_tasks"
        ),
        lambda data: [f"{data / 'data.tfrecord'}: corrupt or truncated data"],
    ),
    "truncated_safetensors": (
        lambda out, data: ["convert", f"--from=hf:{data / 'hf'}", f"--to=t5x:{out / 'model'}"],
        lambda data: [f"{data / 'hf' / 'model.safetensors'}: cannot read the safetensors file: truncated"],
    ),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    data = tmp_path_factory.mktemp("data")
    _write_inputs(data)
    env = _tiny.launch_env(
        PYTHONPATH=os.pathsep.join(filter(None, [str(data), os.environ.get("PYTHONPATH")]))
    )
    jobs = {}
    workers = max(2, min(6, os.cpu_count() or 2))
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        for name, (make_args, _) in CASES.items():
            for verbose in (False, True):
                out = tmp_path_factory.mktemp(f"{name}-{'verbose' if verbose else 'plain'}")
                args = make_args(out, data) + (["--verbose"] if verbose else [])
                jobs[name, verbose] = (out, pool.submit(_tiny.run_raw, args, out, 600, env=env))
        return data, {key: (out, future.result()) for key, (out, future) in jobs.items()}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_refused_with_one_message_and_exit_2(runs, case):
    data, results = runs
    expected = CASES[case][1](data)
    for verbose in (False, True):
        out, result = results[case, verbose]
        report = (
            f"exit {result.returncode}\nstdout:\n{result.stdout[-2000:]}\nstderr:\n{result.stderr[-4000:]}"
        )
        assert result.returncode == 2, report
        command = "convert" if case == "truncated_safetensors" else "train"
        last = result.stderr[result.stderr.rindex(f"t5x-launch {command}: ") :]
        for piece in expected:
            assert piece in last, report
        if verbose:
            assert "Traceback (most recent call last)" in result.stderr, report
        else:
            assert "Traceback" not in result.stderr, report
        assert not (out / "model").exists(), (
            f"{case} left {sorted(p.name for p in (out / 'model').iterdir())}"
        )
        assert "[t5x-launch] finished" not in result.stdout, report
