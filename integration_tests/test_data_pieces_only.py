"""The data pieces alone: t5x-tasks + t5x-feature-converters in a fresh environment, no JAX.

Builds a fresh virtual environment (uv, no Python downloads) holding only the
interfaces, vocabularies, tasks and feature-converters packages and their
declared dependencies, then builds and iterates a packed text-to-text
pipeline there and checks that JAX is not importable.
"""

import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))  # pytest's importlib mode adds no path
import _tiny

ROOT = pathlib.Path(__file__).resolve().parents[1]
DATA_PACKAGES = ["interfaces", "vocabularies", "tasks", "feature_converters"]

SCRIPT = r"""
import json
import t5x.feature_converters as fc
import t5x.tasks as tasks
from t5x.tasks.builtin import register_builtin_tasks

register_builtin_tasks()
lengths = {"inputs": 128, "targets": 128}
# Short text-to-text examples: several fit in one packed row.
task = tasks.get_mixture_or_task("synthetic_copy")
ds = task.get_dataset(lengths, split="train", shuffle=False)
packed = fc.EncDecFeatureConverter(pack=True)(ds, lengths).batch(4, drop_remainder=True)
batches = list(packed.take(3).as_numpy_iterator())
shapes = {k: list(v.shape) for k, v in batches[0].items()}
segments = int(max(b["encoder_segment_ids"].max() for b in batches))
try:
    import jax  # noqa: F401
    jax_missing = False
except ModuleNotFoundError:
    jax_missing = True
print(json.dumps({"batches": len(batches), "shapes": shapes, "max_segments": segments, "jax_missing": jax_missing}))
"""


@pytest.mark.slow
def test_tasks_and_feature_converters_alone_build_a_packed_pipeline_without_jax(tmp_path):
    uv = shutil.which("uv")
    if uv is None:
        pytest.skip("uv is not installed: it builds the fresh environment")
    env = dict(os.environ, UV_PYTHON_DOWNLOADS="never")
    env.pop("VIRTUAL_ENV", None)
    venv = tmp_path / "venv"
    subprocess.run([uv, "venv", "-q", "-p", _tiny.base_python(), str(venv)], check=True, env=env, timeout=300)
    python = venv / "bin" / "python"
    install = subprocess.run(
        [
            uv,
            "pip",
            "install",
            "-q",
            "-p",
            str(python),
            *(str(ROOT / "packages" / name) for name in DATA_PACKAGES),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert install.returncode == 0, install.stderr[-5000:]
    listed = subprocess.run(
        [uv, "pip", "list", "-p", str(python)], env=env, capture_output=True, text=True, check=True
    ).stdout
    names = {line.split()[0].lower() for line in listed.splitlines()[2:] if line.strip()}
    assert {"t5x-tasks", "t5x-feature-converters"} <= names
    assert not names & {"jax", "jaxlib", "flax", "optax", "t5x-models", "t5x-training"}, sorted(names)

    run = subprocess.run(
        [str(python), "-c", SCRIPT], cwd=tmp_path, capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stderr[-5000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert report["jax_missing"], "jax is importable in the data-only environment"
    assert report["batches"] == 3
    assert report["shapes"]["encoder_input_tokens"] == [4, 128]
    assert report["shapes"]["decoder_target_tokens"] == [4, 128]
    assert "encoder_segment_ids" in report["shapes"] and "decoder_positions" in report["shapes"]
    assert report["max_segments"] > 1, "nothing was packed"
