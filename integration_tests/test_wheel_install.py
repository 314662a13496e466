"""A user's install: t5x-launch from built wheels, in a fresh environment, runs the demo.

Builds every package's sdist and wheel (the command of noxfile.py's ``wheels``
session), makes a fresh virtual environment (uv, no Python downloads), installs
``t5x-launch``, ``t5x-upstream`` (which brings ``t5x-seqio``) and ``t5x-moe`` (together,
every distribution) with ``uv pip install --find-links WHEELS`` (the t5x distributions
from those wheels only, third-party ones from the package index), checks that
every t5x module there is a file of those wheels, then runs a 3-step demo and
``t5x-tasks list`` from the environment's own scripts.
"""

import base64
import concurrent.futures
import csv
import hashlib
import io
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))  # pytest's importlib mode adds no path
import _tiny

ROOT = pathlib.Path(__file__).resolve().parents[1]
FOLDERS = sorted(path.parent for path in (ROOT / "packages").glob("*/pyproject.toml"))

# The demo, shortened: 3 steps, one checkpoint, and a final inference over one small batch.
DEMO_ARGS = [
    "--gin.TRAIN_STEPS=3",
    "--gin.CHECKPOINT_PERIOD=3",
    "--gin.BATCH_SIZE=8",
    "--gin.infer_eval/launch.DatasetConfig.batch_size=8",
    "--gin.launch.train.max_inference_examples=8",
    "--gin.launch.train.show_predictions=1",
]

# Finds the modules without running them (importing TensorFlow and JAX takes a while).
PROBE = r"""
import importlib.metadata, importlib.util, json, sysconfig
import t5x
dists = {}
for dist in importlib.metadata.distributions():
    name = dist.metadata["Name"]
    if name.lower().startswith("t5x-"):
        dists[name] = {"version": dist.version, "direct_url": dist.read_text("direct_url.json")}
print(json.dumps({
    "purelib": sysconfig.get_paths()["purelib"],
    "namespace": list(t5x.__path__),
    "modules": [importlib.util.find_spec(f"t5x.{name}").origin for name in ("launch", "tasks")],
    "dists": dists,
}))
"""


def _dist_name(folder: pathlib.Path) -> str:
    return tomllib.loads((folder / "pyproject.toml").read_text())["project"]["name"]


def _build(folder: pathlib.Path, out_dir: pathlib.Path, python: str, env: dict) -> None:
    # noxfile.py's wheel_build_command: keep the two the same.
    command = ["uv", "build", "-q", "-p", python, "--out-dir", str(out_dir), str(folder)]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"{' '.join(command)}\n{result.stderr[-5000:]}"


def _record_hashes(wheel: pathlib.Path) -> dict[str, str]:
    """``path -> sha256=...`` of the package files a wheel's RECORD lists."""
    with zipfile.ZipFile(wheel) as archive:
        record = next(n for n in archive.namelist() if n.endswith(".dist-info/RECORD"))
        rows = csv.reader(io.StringIO(archive.read(record).decode()))
        return {path: digest for path, digest, *_ in rows if path.startswith("t5x/")}


def _file_hash(path: pathlib.Path) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(path.read_bytes()).digest()).rstrip(b"=")
    return f"sha256={digest.decode()}"


@pytest.mark.slow
def test_launch_installed_from_wheels_runs_the_demo_and_the_tasks_cli(tmp_path):
    if shutil.which("uv") is None:
        pytest.skip("uv is not installed: it builds the wheels and the fresh environment")
    env = dict(os.environ, UV_PYTHON_DOWNLOADS="never")
    for leak in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME"):
        env.pop(leak, None)
    python = _tiny.base_python()

    wheels = tmp_path / "wheels"
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(lambda folder: _build(folder, wheels, python, env), FOLDERS))
    built = {path.name.split("-")[0] for path in wheels.glob("*.whl")}
    assert built == {_dist_name(f).replace("-", "_") for f in FOLDERS}, sorted(built)
    assert len(list(wheels.glob("*.tar.gz"))) == len(FOLDERS)

    venv = tmp_path / "venv"
    subprocess.run(["uv", "venv", "-q", "-p", python, str(venv)], check=True, env=env, timeout=300)
    venv_python = venv / "bin" / "python"
    install = subprocess.run(
        [
            "uv",
            "pip",
            "install",
            "-q",
            "-p",
            str(venv_python),
            "--find-links",
            str(wheels),
            "t5x-launch",
            "t5x-upstream",
            "t5x-moe",  # the one distribution neither of the two depends on
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert install.returncode == 0, install.stderr[-5000:]

    # Every t5x distribution is there, as a regular install of our wheel: no editable
    # or source-folder install, no checkout on the path, each file the wheel's own.
    probe = subprocess.run(
        [str(venv_python), "-c", PROBE], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert probe.returncode == 0, probe.stderr[-5000:]
    report = json.loads(probe.stdout.strip().splitlines()[-1])
    purelib = pathlib.Path(report["purelib"]).resolve()
    assert set(report["dists"]) == {_dist_name(f) for f in FOLDERS}, report["dists"]
    for name, info in report["dists"].items():
        assert info["direct_url"] is None, f"{name} was installed from a URL or folder: {info['direct_url']}"
    assert [pathlib.Path(p).resolve() for p in report["namespace"]] == [purelib / "t5x"]
    for module in report["modules"]:
        assert pathlib.Path(module).resolve().is_relative_to(purelib), module
    for wheel in wheels.glob("*.whl"):
        for relative, digest in _record_hashes(wheel).items():
            assert _file_hash(purelib / relative) == digest, f"{relative} differs from {wheel.name}'s"

    # `t5x-tasks list` runs beside the demo: each spends most of its time importing.
    with subprocess.Popen(
        [str(venv / "bin" / "t5x-tasks"), "list"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as tasks_list:
        demo = subprocess.run(
            [str(venv / "bin" / "t5x-launch"), "train", *DEMO_ARGS],
            cwd=tmp_path,
            env=dict(env, PYTHONUNBUFFERED="1"),
            capture_output=True,
            text=True,
            timeout=900,
        )
        listed_out, listed_err = tasks_list.communicate(timeout=300)
    assert demo.returncode == 0, f"{demo.stdout[-4000:]}\n{demo.stderr[-6000:]}"
    match = re.search(r"demo: training a tiny model on a built-in task into (\S+)", demo.stdout)
    assert match, demo.stdout
    model_dir = pathlib.Path(match.group(1))
    assert model_dir.parent.resolve() == tmp_path.resolve()
    assert (model_dir / "checkpoint_3" / "checkpoint").is_file(), sorted(p.name for p in model_dir.iterdir())
    assert "finished at step 3" in demo.stdout
    assert re.search(r"synthetic_sort_digits \(8 examples\)", demo.stdout), demo.stdout

    assert tasks_list.returncode == 0, listed_err[-5000:]
    assert "synthetic_sort_digits" in listed_out, listed_out
