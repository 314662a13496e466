"""SIGTERM / SIGINT stop a whole command with 128 + the signal's number; `local` passes them on."""

from __future__ import annotations

import os
import signal
import sys
import textwrap
import threading
import time

import pytest

from t5x.launch._local import run_local
from t5x.launch._preemption import (
    SIGINT_EXIT_CODE,
    SIGTERM_EXIT_CODE,
    Preempted,
    exit_code,
    run_stoppable,
)


def test_exit_codes_are_128_plus_the_signal_number():
    assert (SIGTERM_EXIT_CODE, SIGINT_EXIT_CODE) == (143, 130)
    assert exit_code(signal.SIGTERM) == 143 and exit_code(signal.SIGINT) == 130
    assert Preempted(signal.SIGTERM, step=16).exit_code == 143


def test_the_one_line_names_the_signal_and_the_saved_step():
    assert (
        Preempted(signal.SIGTERM, step=16).describe()
        == "[t5x-launch] preempted by SIGTERM at step 16 (checkpoint saved); run the same command to resume"
    )
    assert (
        Preempted(signal.SIGINT).describe("run it again")
        == "[t5x-launch] interrupted by SIGINT; run it again"
    )


def test_a_signal_stops_the_whole_command_at_once(capsys):
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    runs: list[int] = []

    def several_runs() -> int:
        for run in range(3):
            runs.append(run)
            if run == 1:
                os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.1)
        return 0

    assert run_stoppable(several_runs) == 143
    assert runs == [0, 1]
    assert capsys.readouterr().err.strip().splitlines() == [
        "[t5x-launch] preempted by SIGTERM; run the same command to resume"
    ]
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before


def test_a_training_stopped_after_its_save_reports_the_step(capsys):
    def training() -> int:
        raise Preempted(signal.SIGINT, step=16)

    assert run_stoppable(training) == 130
    assert "interrupted by SIGINT at step 16 (checkpoint saved)" in capsys.readouterr().err


def test_while_stopping_sigterm_is_ignored_and_a_second_sigint_aborts(capsys):
    cleaned: list[str] = []

    def command() -> int:
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)
        finally:
            os.kill(os.getpid(), signal.SIGTERM)  # ignored: the cleanup goes on
            time.sleep(0.05)
            cleaned.append("done")
        return 0

    assert run_stoppable(command) == 143
    assert cleaned == ["done"]

    def impatient() -> int:
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
        finally:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
        return 0

    capsys.readouterr()
    assert run_stoppable(impatient) == 130
    assert "aborted by a second SIGINT" in capsys.readouterr().err


# ---- t5x-launch local -----------------------------------------------------------

_CHILD = textwrap.dedent(
    """
    import os, signal, sys, time
    workdir, mode = sys.argv[1], sys.argv[2]
    index = os.environ["T5X_PROCESS_ID"]
    got = []
    def handler(signum, frame):
        got.append(signum)
        with open(os.path.join(workdir, f"signals-{index}"), "a") as out:
            out.write(f"{signum}\\n")
    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    open(os.path.join(workdir, f"ready-{index}"), "w").close()
    if mode == "one-preempted" and index == "1":
        sys.exit(143)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if got and mode != "ignore":
            time.sleep(0.2)  # "saving"
            sys.exit(128 + got[0])
        time.sleep(0.01)
    sys.exit(1)
    """
)


def _run_local(tmp_path, mode: str, signals: tuple[int, ...] = ()) -> int:
    child = tmp_path / "child.py"
    child.write_text(_CHILD)

    def send() -> None:
        deadline = time.monotonic() + 60
        while len(list(tmp_path.glob("ready-*"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        for signum in signals:
            os.kill(os.getpid(), signum)
            time.sleep(0.3)

    sender = threading.Thread(target=send)
    sender.start()
    try:
        return run_local(
            [str(tmp_path), mode], 2, log_dir=str(tmp_path / "logs"), program=[sys.executable, str(child)]
        )
    finally:
        sender.join()


def _signals_of(tmp_path, index: int) -> list[int]:
    path = tmp_path / f"signals-{index}"
    return [int(line) for line in path.read_text().split()] if path.exists() else []


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_local_passes_a_signal_on_as_sigterm_and_returns_its_code(tmp_path, signum, code):
    start = time.monotonic()
    assert _run_local(tmp_path, "wait", (signum,)) == code
    assert time.monotonic() - start < 30
    # SIGTERM even for Ctrl-C: the terminal's SIGINT reaches the processes too, and a second
    # SIGINT would make them give up their save.
    assert _signals_of(tmp_path, 0) == _signals_of(tmp_path, 1) == [signal.SIGTERM]


def test_local_kills_every_process_on_a_second_sigint(tmp_path):
    start = time.monotonic()
    assert _run_local(tmp_path, "ignore", (signal.SIGINT, signal.SIGINT)) == 130
    assert time.monotonic() - start < 30  # not the children's 60 s


def test_local_stops_every_process_when_one_is_preempted(tmp_path):
    assert _run_local(tmp_path, "one-preempted") == 143
    assert _signals_of(tmp_path, 0) == [signal.SIGTERM]
