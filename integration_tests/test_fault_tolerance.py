"""Killed, starved and corrupted training jobs come back with nothing lost.

The session's reference job (conftest's `encdec_reference`) trains 6 steps with a
checkpoint every step. A second job is
killed with SIGKILL while a checkpoint is being written and again at a random
point of training, then resumed to the end: its final parameters must equal the
reference's bit for bit (CPU, fixed seed, data order restored with the
checkpoint). The reference folder is then copied to show that a read-only or
full model folder and a corrupted newest checkpoint give clear errors and lose
no earlier checkpoint (those three jobs run side by side).
"""

import os
import pathlib
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))  # pytest's importlib mode adds no path
import _tiny

STEPS = _tiny.REFERENCE_STEPS
_job = _tiny.reference_job


@pytest.fixture(scope="module")
def reference(encdec_reference):
    """The uninterrupted run, shared with other modules: read here, copied before any change."""
    return encdec_reference


def _start(model_dir: pathlib.Path, cwd: pathlib.Path, log: pathlib.Path) -> subprocess.Popen:
    with log.open("w") as out:
        return subprocess.Popen(
            [_tiny.launch_script(), *_job(model_dir)],
            cwd=cwd,
            env=_tiny.launch_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _wait_for(predicate, proc: subprocess.Popen, timeout: float = 600.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.002)
    raise TimeoutError("the training job made no progress")


def _saving(model_dir: pathlib.Path) -> bool:
    return model_dir.is_dir() and any(".tmp" in p.name for p in model_dir.iterdir())


def test_kill9_during_save_and_training_then_resume_equals_uninterrupted(reference, tmp_path):
    rng = random.Random(int(os.environ.get("T5X_KILL_SEED", time.time_ns() % 10_000)))
    model_dir = tmp_path / "model"

    # 1. Killed while a checkpoint is being written (a temporary step folder exists).
    first_log, second_log = tmp_path / "first.log", tmp_path / "second.log"
    proc = _start(model_dir, tmp_path, first_log)
    if _wait_for(lambda: _saving(model_dir), proc):
        time.sleep(rng.uniform(0.0, 0.01))
        _tiny.kill9(proc)
    else:
        pytest.fail(
            "the job ended before a checkpoint save could be interrupted:\n" + first_log.read_text()[-4000:]
        )
    survived = _tiny.steps_of(model_dir)
    assert survived == list(range(1, len(survived) + 1)), survived
    for step in survived:
        _tiny.load(model_dir / f"checkpoint_{step}")  # every listed step is complete

    # 2. Resumed, then killed at a random point of training.
    proc = _start(model_dir, tmp_path, second_log)
    target = rng.randint(len(survived) + 1, STEPS - 1)
    if _wait_for(lambda: (_tiny.steps_of(model_dir) or [0])[-1] >= target, proc):
        time.sleep(rng.uniform(0.0, 0.3))
        _tiny.kill9(proc)
    else:
        assert proc.returncode == 0, f"the resumed job failed:\n{second_log.read_text()[-5000:]}"
    assert _tiny.steps_of(model_dir)[:1] == [1], second_log.read_text()[-5000:]

    # 3. Resumed to the end.
    result = _tiny.run_raw(_job(model_dir), tmp_path)
    assert result.returncode == 0, result.stderr[-5000:]
    assert _tiny.steps_of(model_dir) == list(range(1, STEPS + 1))
    assert not _saving(model_dir), "a stale temporary folder survived the resumed job"
    ours = _tiny.flatten(_tiny.load(model_dir / f"checkpoint_{STEPS}"))
    theirs = _tiny.flatten(_tiny.load(reference / f"checkpoint_{STEPS}"))
    assert ours.keys() == theirs.keys()
    for name in theirs:
        np.testing.assert_array_equal(ours[name], theirs[name], err_msg=name)


def _snapshot(model_dir: pathlib.Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(model_dir)): p.read_bytes()
        for p in model_dir.rglob("checkpoint_*/**/*")
        if p.is_file()
    }


def _copy(reference: pathlib.Path) -> pathlib.Path:
    # World-readable, so that an unprivileged user can read it when the tests run as root.
    root = pathlib.Path(tempfile.mkdtemp(prefix="t5x-it-"))
    root.chmod(0o755)
    model_dir = root / "model"
    shutil.copytree(reference, model_dir)
    return model_dir


def _no_room() -> None:
    # A file-size limit makes every larger write fail (EFBIG), as a
    # full disk would (ENOSPC); Python ignores SIGXFSZ, so it is an OSError.
    # 35 kB: above model-info.txt (~26 kB), below the largest arrays (~45 kB),
    # so the job gets as far as writing a checkpoint.
    resource.setrlimit(resource.RLIMIT_FSIZE, (35_000, 35_000))


@pytest.fixture(scope="module")
def refused(reference):
    """Resumes of three damaged copies of the reference, started together (each is mostly start-up).

    ``{case: (model folder, its checkpoint files before, CompletedProcess or a reason it could not run)}``
    for a read-only folder, a full one and a corrupted newest checkpoint.
    """
    jobs, runs = {}, {}
    read_only = _copy(reference)
    jobs["read_only"] = (read_only, _snapshot(read_only))
    for path in [read_only, *read_only.rglob("*")]:
        path.chmod(0o555 if path.is_dir() else 0o444)
    command = [_tiny.launch_script(), *_job(read_only, STEPS + 2)]
    if os.geteuid() == 0:
        # Root ignores permission bits; without these capabilities it obeys them.
        setpriv = shutil.which("setpriv")
        command = (
            [setpriv, "--bounding-set=-dac_override,-dac_read_search,-fowner", "--", *command]
            if setpriv
            else None
        )
    if command is None:
        runs["read_only"] = (
            "running as root without util-linux setpriv: a read-only folder cannot be simulated"
        )
    else:
        runs["read_only"] = (command, _tiny.launch_env(HOME=str(read_only.parent)), None)

    full = _copy(reference)
    jobs["full"] = (full, _snapshot(full))
    runs["full"] = ([_tiny.launch_script(), *_job(full, STEPS + 2)], _tiny.launch_env(), _no_room)

    corrupted = _copy(reference)
    jobs["corrupted"] = (corrupted, _snapshot(corrupted))
    index = corrupted / f"checkpoint_{STEPS}" / "checkpoint"
    data = bytearray(index.read_bytes())
    data[len(data) // 2 :] = b"\xc1" * (len(data) - len(data) // 2)
    index.write_bytes(bytes(data))
    runs["corrupted"] = ([_tiny.launch_script(), *_job(corrupted, STEPS + 2)], _tiny.launch_env(), None)

    # Started from this thread, one after the other (preexec_fn and threads do not mix), then
    # read in turn (pipes: the file-size limit must not reach the job's output).
    started = {}
    for case, run in runs.items():
        if isinstance(run, str):
            continue
        command, env, preexec = run
        started[case] = subprocess.Popen(
            command,
            cwd=jobs[case][0].parent,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=preexec,
        )
    results = {}
    for case, proc in started.items():
        try:
            stdout, stderr = proc.communicate(timeout=900)
        finally:
            if proc.poll() is None:
                proc.kill()
        results[case] = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    try:
        yield {case: (*jobs[case], results.get(case, runs[case])) for case in jobs}
    finally:
        for model_dir, _ in jobs.values():
            for path in [model_dir, *model_dir.rglob("*")]:
                path.chmod(0o755)
            shutil.rmtree(model_dir.parent, ignore_errors=True)


def test_read_only_model_folder_gives_clear_error_and_keeps_checkpoints(refused):
    model_dir, before, result = refused["read_only"]
    if isinstance(result, str):
        pytest.skip(result)
    assert result.returncode != 0
    message = result.stderr[-3000:]
    assert str(model_dir) in message and "ermission" in message, message
    assert "Traceback" not in message[-800:] or "PermissionError" in message, message
    for path in [model_dir, *model_dir.rglob("*")]:
        path.chmod(0o755)
    assert _snapshot(model_dir) == before
    assert _tiny.steps_of(model_dir) == list(range(1, STEPS + 1))


def test_full_model_folder_gives_clear_error_and_keeps_checkpoints(refused):
    model_dir, before, result = refused["full"]
    assert result.returncode != 0
    message = result.stderr[-3000:]
    assert "File too large" in message or "No space" in message, message
    assert "checkpoint_" in message, message
    assert _snapshot(model_dir) == before
    assert _tiny.steps_of(model_dir) == list(range(1, STEPS + 1))


def test_corrupted_checkpoint_is_refused_naming_newest_valid_step(refused):
    model_dir, _, result = refused["corrupted"]
    assert result.returncode != 0
    message = result.stderr[-3000:]
    assert f"checkpoint_{STEPS}" in message, message
    assert f"checkpoint_{STEPS - 1}" in message or f"step {STEPS - 1}" in message, message
    assert (model_dir / f"checkpoint_{STEPS - 1}").is_dir()
