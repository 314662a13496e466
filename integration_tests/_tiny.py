"""Tiny model configurations and checkpoint helpers shared by the integration tests."""

import contextlib
import glob
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest

# Every launch pays the interpreter start-up and a compile, so the models are as
# small as the layers allow and runs are a handful of steps.
ENCDEC = [
    "--gin_file=models/demo/tiny.gin",
    "--gin.models.T5Config.emb_dim=32",
    "--gin.models.T5Config.num_heads=2",
    "--gin.models.T5Config.head_dim=16",
    "--gin.models.T5Config.mlp_dim=64",
    "--gin.models.T5Config.num_encoder_layers=1",
    "--gin.models.T5Config.num_decoder_layers=1",
    "--gin.MIXTURE_OR_TASK_NAME=synthetic_copy",
    "--gin.TASK_FEATURE_LENGTHS={'inputs': 24, 'targets': 24}",
    "--gin.BATCH_SIZE=8",
]

_DECODER_GIN = """\
from __gin__ import dynamic_registration
from t5x import decoding
from t5x import models
from t5x import tasks

VOCABULARY = @tasks.builtin_vocabulary()
MODEL = @models.DecoderOnlyModel()
models.DecoderOnlyModel:
  config = @models.DecoderOnlyConfig()
  vocabulary = %VOCABULARY
  inputs_bidirectional_attention = {bidirectional}
models.DecoderOnlyConfig:
  vocab_size = 384
  emb_dim = 32
  num_heads = 2
  head_dim = 16
  num_layers = 2
  mlp_dim = 64
  mlp_activations = ('gelu', 'linear')
  dropout_rate = 0.0
"""


def decoder_args(tmp: pathlib.Path, *, prefix_lm: bool) -> list[str]:
    """Writes a tiny decoder-only gin file into ``tmp`` and returns its flags."""
    name = "prefix_lm.gin" if prefix_lm else "causal.gin"
    path = tmp / name
    path.write_text(_DECODER_GIN.format(bidirectional=prefix_lm))
    task = "synthetic_copy" if prefix_lm else "synthetic_corpus_lm"
    lengths = "{'inputs': 16, 'targets': 16}" if prefix_lm else "{'targets': 32}"
    return [
        f"--gin_file={path}",
        f"--gin.MIXTURE_OR_TASK_NAME={task}",
        f"--gin.TASK_FEATURE_LENGTHS={lengths}",
        "--gin.BATCH_SIZE=8",
    ]


def train_args(model_dir: pathlib.Path, steps: int, period: int) -> list[str]:
    return [
        "--gin_file=runs/pretrain.gin",
        f"--gin.MODEL_DIR={model_dir}",
        f"--gin.TRAIN_STEPS={steps}",
        f"--gin.CHECKPOINT_PERIOD={period}",
        "--gin.WARMUP_STEPS=2",
    ]


# The shared reference run (conftest's `encdec_reference`): ENCDEC trained this many
# steps with a checkpoint after every one.
REFERENCE_STEPS = 6


def reference_job(model_dir: pathlib.Path, steps: int = REFERENCE_STEPS) -> list[str]:
    """The reference run's `t5x-launch` arguments; more ``steps`` resume it."""
    return ["train", *ENCDEC, *train_args(model_dir, steps, 1)]


def copy_model_dir(
    source: pathlib.Path, target: pathlib.Path, steps: list[int] | None = None
) -> pathlib.Path:
    """Copies a model folder (only the checkpoints of ``steps`` when given) and returns ``target``."""

    def skipped(folder: str, names: list[str]) -> set[str]:
        if steps is None or pathlib.Path(folder) != source:
            return set()
        kept = {f"checkpoint_{step}" for step in steps}
        return {name for name in names if name.startswith("checkpoint_") and name not in kept}

    shutil.copytree(source, target, ignore=skipped)
    return target


def base_python() -> str:
    """A Python >= 3.12 outside any virtual environment, found as noxfile.py's find_python does.

    For tests that build a fresh environment with ``uv venv -p``.
    """
    candidates = [os.environ.get("T5X_PYTHON", "")]
    candidates += [shutil.which(f"python3.{minor}") or "" for minor in (14, 13, 12)]
    pyenv_root = os.environ.get("PYENV_ROOT", str(pathlib.Path.home() / ".pyenv"))
    candidates += sorted(glob.glob(f"{pyenv_root}/versions/3.1[2-9]*/bin/python3"), reverse=True)
    candidates += sorted(
        glob.glob(str(pathlib.Path.home() / ".local/share/uv/python/cpython-3.1[2-9]*/bin/python3"))
    )
    candidates.append(sys.executable)
    for candidate in filter(None, candidates):
        probe = subprocess.run(
            [candidate, "-c", "import sys; print(sys.version_info >= (3, 12))"],
            capture_output=True,
            text=True,
        )
        if probe.returncode == 0 and probe.stdout.strip() == "True":
            # A venv's own interpreter carries that venv's packages; use its base.
            base = subprocess.run(
                [candidate, "-c", "import sys; print(sys._base_executable)"], capture_output=True, text=True
            )
            return base.stdout.strip() or candidate
    pytest.fail("no Python >= 3.12 found (set T5X_PYTHON)")


def launch_script() -> str:
    return str(pathlib.Path(sys.executable).with_name("t5x-launch"))


def launch_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.update(extra)
    return env


def run_raw(
    args: list[str], cwd: pathlib.Path, timeout: int = 900, **popen
) -> subprocess.CompletedProcess[str]:
    """Runs ``t5x-launch ARGS`` and returns the result whatever its exit code."""
    return subprocess.run(
        [launch_script(), *args],
        cwd=cwd,
        env=popen.pop("env", launch_env()),
        capture_output=True,
        text=True,
        timeout=timeout,
        **popen,
    )


def run_side_by_side(jobs: dict, workers: int | None = None) -> dict:
    """Runs ``{key: (args, cwd)}`` or ``{key: (args, cwd, env)}`` launches a few at a time.

    Returns ``{key: CompletedProcess}``. Most of a tiny launch is interpreter and
    library start-up, so independent launches overlap well even on two cores.
    """
    import concurrent.futures

    workers = workers or max(2, min(4, os.cpu_count() or 2))
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        futures = {}
        for key, (args, cwd, *env) in jobs.items():
            futures[key] = pool.submit(run_raw, args, cwd, env=env[0] if env else launch_env())
        return {key: future.result() for key, future in futures.items()}


def flatten(tree, prefix: str = "") -> dict[str, np.ndarray]:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}/"))
        else:
            out[f"{prefix}{key}"] = np.asarray(value)
    return out


def load(step_dir: pathlib.Path) -> dict:
    from t5x.checkpointing import load_t5x_checkpoint

    return load_t5x_checkpoint(str(step_dir))


def steps_of(model_dir: pathlib.Path) -> list[int]:
    """Complete steps (a step folder with its index file), read straight from the folder listing."""
    if not model_dir.is_dir():
        return []
    steps = []
    for path in model_dir.iterdir():
        name = path.name
        if (
            name.startswith("checkpoint_")
            and name[len("checkpoint_") :].isdigit()
            and (path / "checkpoint").is_file()
        ):
            steps.append(int(name[len("checkpoint_") :]))
    return sorted(steps)


def read_jsonl(path: pathlib.Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def kill9(proc: subprocess.Popen) -> None:
    """SIGKILLs the launcher and everything it started (it leads its own group)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
