"""Preempted jobs say so and resume; one trainer per model folder.

SIGTERM (SIGINT) makes `t5x-launch train` finish its step, save it and exit
143 (130) with one line naming the step; the same command then resumes to the
parameters of an uninterrupted run, bit for bit. A second trainer on a model
folder in use is refused (exit 2) naming the first, which goes on unharmed; a
lock left by a dead process is taken over. SIGTERM stops a whole
`arch-objective-study`, not only its current training.
"""

import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))  # pytest's importlib mode adds no path
import _tiny

STEPS, PERIOD = 200, 10  # ~20 ms a step: seconds of training left when the first checkpoint appears
LOCK = "train.lock"


def _job(model_dir: pathlib.Path) -> list[str]:
    return ["train", *_tiny.ENCDEC, *_tiny.train_args(model_dir, STEPS, PERIOD)]


def _start(args: list[str], cwd: pathlib.Path, log: pathlib.Path) -> subprocess.Popen:
    with log.open("w") as out:
        return subprocess.Popen(
            [_tiny.launch_script(), *args],
            cwd=cwd,
            env=_tiny.launch_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _wait_for(predicate, proc: subprocess.Popen, log: pathlib.Path, timeout: float = 900.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc.poll() is not None:
            pytest.fail(f"the job ended (exit {proc.returncode}) too early:\n{log.read_text()[-4000:]}")
        if time.monotonic() > deadline:
            _tiny.kill9(proc)
            pytest.fail("the job made no progress")
        time.sleep(0.002)


def _finish(proc: subprocess.Popen, timeout: float = 300.0) -> int:
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        _tiny.kill9(proc)
        raise


def _launcher_lines(text: str, prefix: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(prefix)]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted run, started in the background (it overlaps the first test's job)."""
    tmp = tmp_path_factory.mktemp("reference")
    model_dir = tmp / "model"
    proc = _start(_job(model_dir), tmp, tmp / "log")

    def finished() -> pathlib.Path:
        assert _finish(proc, 900) == 0, (tmp / "log").read_text()[-4000:]
        assert _tiny.steps_of(model_dir)[-1] == STEPS
        return model_dir

    yield finished
    if proc.poll() is None:
        _tiny.kill9(proc)


def _leave_stale_lock(model_dir: pathlib.Path) -> int:
    """A trainer that took the lock and died without releasing it; returns its pid."""
    code = (
        "import os, sys; from t5x.launch._model_dir_lock import acquire_model_dir_lock; "
        "acquire_model_dir_lock(sys.argv[1], command='a killed trainer'); os._exit(0)"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(model_dir)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    holder = json.loads((model_dir / LOCK).read_text())
    assert holder["command"] == "a killed trainer"
    return holder["pid"]


def test_sigterm_saves_exits_143_and_the_same_command_resumes_to_identical_params(reference, tmp_path):
    model_dir = tmp_path / "model"
    log = tmp_path / "first.log"
    proc = _start(_job(model_dir), tmp_path, log)
    _wait_for(lambda: bool(_tiny.steps_of(model_dir)), proc, log)
    proc.send_signal(signal.SIGTERM)
    assert _finish(proc) == 143, log.read_text()[-4000:]
    reached = _tiny.steps_of(model_dir)[-1]
    assert PERIOD <= reached < STEPS
    _tiny.load(model_dir / f"checkpoint_{reached}")  # complete
    output = log.read_text()
    assert _launcher_lines(output, "[t5x-launch]") == [
        f"[t5x-launch] preempted by SIGTERM at step {reached} (checkpoint saved); "
        "run the same command to resume"
    ], output[-4000:]
    assert not (model_dir / LOCK).exists()

    # Resumed with the same command, over the lock of a trainer that died holding it.
    dead = _leave_stale_lock(model_dir)
    result = _tiny.run_raw(_job(model_dir), tmp_path)
    assert result.returncode == 0, result.stderr[-4000:]
    warnings = _launcher_lines(result.stderr, "[t5x-launch] warning")
    assert len(warnings) == 1 and f"pid {dead}" in warnings[0] and "stale" in warnings[0], warnings
    assert f"finished at step {STEPS}" in result.stdout
    assert not (model_dir / LOCK).exists()
    ours = _tiny.flatten(_tiny.load(model_dir / f"checkpoint_{STEPS}"))
    theirs = _tiny.flatten(_tiny.load(reference() / f"checkpoint_{STEPS}"))
    assert ours.keys() == theirs.keys()
    for name in theirs:
        np.testing.assert_array_equal(ours[name], theirs[name], err_msg=name)


def test_a_second_trainer_is_refused_and_sigint_stops_the_first_with_130(tmp_path):
    model_dir = tmp_path / "model"
    log = tmp_path / "first.log"
    first = _start(_job(model_dir), tmp_path, log)
    _wait_for(lambda: bool(_tiny.steps_of(model_dir)), first, log)
    os.kill(first.pid, signal.SIGSTOP)  # the first trainer keeps its place while the second starts
    try:
        before = sorted(p.name for p in model_dir.iterdir())
        second = _tiny.run_raw(_job(model_dir), tmp_path)
        after = sorted(p.name for p in model_dir.iterdir())
    finally:
        os.kill(first.pid, signal.SIGCONT)
    assert second.returncode == 2, second.stderr[-4000:]
    errors = _launcher_lines(second.stderr, "t5x-launch train: the model folder")
    assert len(errors) == 1, second.stderr[-4000:]
    started = json.loads((model_dir / LOCK).read_text())["started"]
    for part in (
        f"host {socket.gethostname()}",
        f"pid {first.pid}",
        f"since {started}",
        str(model_dir / LOCK),
    ):
        assert part in errors[0], (part, errors[0])
    assert after == before  # the second trainer wrote nothing

    # The first trainer is unharmed: it trains on, and stops on SIGINT after saving its step.
    _wait_for(lambda: _tiny.steps_of(model_dir)[-1] > int(before[0].split("_")[1]), first, log)
    first.send_signal(signal.SIGINT)
    assert _finish(first) == 130, log.read_text()[-4000:]
    reached = _tiny.steps_of(model_dir)[-1]
    assert reached < STEPS
    assert _launcher_lines(log.read_text(), "[t5x-launch]") == [
        f"[t5x-launch] interrupted by SIGINT at step {reached} (checkpoint saved); "
        "run the same command to resume"
    ]
    _tiny.load(model_dir / f"checkpoint_{reached}")
    assert not (model_dir / LOCK).exists()


def test_sigterm_stops_the_whole_study_before_its_next_training(tmp_path):
    study = tmp_path / "study"
    log = tmp_path / "study.log"
    args = [
        "arch-objective-study",
        f"--model_dir={study}",
        "--steps=400",  # metrics every 20 steps, a checkpoint only at the end
        "--architectures=causal_decoder",
        "--objectives=full_lm,prefix_lm",
        "--no_zero_shot",
        "--no_plot",
    ]
    proc = _start(args, tmp_path, log)
    first = study / "causal_decoder_full_lm"
    metrics = first / "metrics.jsonl"
    _wait_for(lambda: metrics.exists() and metrics.stat().st_size > 0, proc, log)
    proc.send_signal(signal.SIGTERM)
    assert _finish(proc) == 143, log.read_text()[-4000:]
    reached = _tiny.steps_of(first)
    assert len(reached) == 1 and reached[0] < 400, reached
    output = log.read_text()
    assert _launcher_lines(output, "[t5x-launch]") == [
        f"[t5x-launch] preempted by SIGTERM at step {reached[0]} (checkpoint saved); "
        "run the same command to resume"
    ], output[-4000:]
    assert "prefix_lm" not in "".join(_launcher_lines(output, "[study]"))
    assert not (study / "causal_decoder_prefix_lm").exists()
    assert not (study / "study.json").exists()
