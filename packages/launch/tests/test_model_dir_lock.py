"""One trainer per model folder: the lock file, its refusal, stale takeover and atomic creation."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from t5x.launch._model_dir_lock import (
    LOCK_NAME,
    ModelDirInUseError,
    ModelDirLock,
    acquire_model_dir_lock,
)


def _dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def _plant(model_dir, **fields) -> None:
    """Writes a lock file as another trainer would have."""
    holder = ModelDirLock(model_dir, command="t5x-launch train --gin.MODEL_DIR=elsewhere").content
    holder.update({"process_start": None, "token": "someone-else", **fields})
    (model_dir / LOCK_NAME).write_text(json.dumps(holder))


def test_the_lock_names_its_holder_and_release_removes_it(tmp_path):
    lock = acquire_model_dir_lock(tmp_path, command="t5x-launch train --gin.MODEL_DIR=x")
    holder = json.loads((tmp_path / LOCK_NAME).read_text())
    assert holder["host"] == socket.gethostname() and holder["pid"] == os.getpid()
    assert holder["command"] == "t5x-launch train --gin.MODEL_DIR=x" and holder["started"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [LOCK_NAME]  # no temporary file left
    lock.release()
    assert list(tmp_path.iterdir()) == []
    lock.release()  # twice is harmless


def test_a_second_trainer_is_refused_naming_the_holder_and_the_lock_file(tmp_path):
    with ModelDirLock(tmp_path, command="first job"):
        before = (tmp_path / LOCK_NAME).read_text()
        with pytest.raises(ModelDirInUseError) as refused:
            acquire_model_dir_lock(tmp_path, command="second job")
        message = str(refused.value)
        started = json.loads(before)["started"]
        for part in (
            socket.gethostname(),
            f"pid {os.getpid()}",
            started,
            "first job",
            str(tmp_path / LOCK_NAME),
        ):
            assert part in message, (part, message)
        assert "\n" not in message
        assert refused.value.holder["command"] == "first job"
        assert (tmp_path / LOCK_NAME).read_text() == before  # the holder's lock is untouched
    assert not (tmp_path / LOCK_NAME).exists()


def test_a_lock_of_a_dead_process_on_this_machine_is_taken_over_with_a_warning(tmp_path):
    pid = _dead_pid()
    _plant(tmp_path, pid=pid)
    warnings: list[str] = []
    lock = acquire_model_dir_lock(tmp_path, warn=warnings.append)
    assert json.loads((tmp_path / LOCK_NAME).read_text())["pid"] == os.getpid()
    assert len(warnings) == 1 and f"pid {pid}" in warnings[0] and "stale" in warnings[0], warnings
    assert f"process {pid} is gone" in warnings[0]
    lock.release()
    assert list(tmp_path.iterdir()) == []


def test_a_reused_pid_does_not_keep_a_stale_lock(tmp_path):
    # The parent process is alive, but started at another time than the lock records.
    _plant(tmp_path, pid=os.getppid(), process_start="1")
    warnings: list[str] = []
    acquire_model_dir_lock(tmp_path, warn=warnings.append).release()
    assert len(warnings) == 1


def test_a_live_process_keeps_its_lock_even_without_heartbeats(tmp_path):
    _plant(tmp_path, pid=os.getppid())
    old = time.time() - 3600
    os.utime(tmp_path / LOCK_NAME, (old, old))
    with pytest.raises(ModelDirInUseError, match=f"pid {os.getppid()}"):
        acquire_model_dir_lock(tmp_path)


def test_another_hosts_lock_is_taken_over_only_without_a_recent_heartbeat(tmp_path):
    _plant(tmp_path, host="other-host", machine="x", pid=1)
    with pytest.raises(ModelDirInUseError, match="host other-host.*last heartbeat"):
        acquire_model_dir_lock(tmp_path, stale_after_seconds=60)
    old = time.time() - 120
    os.utime(tmp_path / LOCK_NAME, (old, old))
    warnings: list[str] = []
    acquire_model_dir_lock(tmp_path, stale_after_seconds=60, warn=warnings.append).release()
    assert len(warnings) == 1 and "no heartbeat for" in warnings[0], warnings


def test_the_new_holder_removes_transient_files_that_dead_starters_left(tmp_path):
    old = time.time() - 3600
    for name in (f"{LOCK_NAME}.new-dead", f"{LOCK_NAME}.new-starting"):
        (tmp_path / name).write_text("{}")
        if name.endswith("dead"):
            os.utime(tmp_path / name, (old, old))
    with ModelDirLock(tmp_path):
        # A starter's file of a moment ago may be in use; only old leftovers go.
        assert sorted(p.name for p in tmp_path.iterdir()) == [LOCK_NAME, f"{LOCK_NAME}.new-starting"]
        assert not any(".tmp" in p.name for p in tmp_path.iterdir())


def test_a_takeover_mutex_of_a_starter_that_died_does_not_block(tmp_path):
    _plant(tmp_path, pid=_dead_pid())
    mutex = tmp_path / f"{LOCK_NAME}.takeover"
    mutex.touch()
    old = time.time() - 3600
    os.utime(mutex, (old, old))
    acquire_model_dir_lock(tmp_path, warn=lambda line: None).release()
    assert list(tmp_path.iterdir()) == []


def test_an_unreadable_fresh_lock_is_refused(tmp_path):
    (tmp_path / LOCK_NAME).write_text("{not json")
    with pytest.raises(ModelDirInUseError, match="unknown holder"):
        acquire_model_dir_lock(tmp_path)


def test_the_heartbeat_keeps_the_lock_fresh(tmp_path):
    with ModelDirLock(tmp_path, heartbeat_seconds=0.05):
        old = time.time() - 3600
        os.utime(tmp_path / LOCK_NAME, (old, old))
        deadline = time.monotonic() + 10
        while (tmp_path / LOCK_NAME).stat().st_mtime < old + 1800:
            assert time.monotonic() < deadline, "no heartbeat"
            time.sleep(0.02)


def test_release_leaves_a_lock_that_another_trainer_took_over(tmp_path):
    lock = acquire_model_dir_lock(tmp_path)
    _plant(tmp_path, pid=os.getppid())  # another trainer's lock now
    lock.release()
    assert json.loads((tmp_path / LOCK_NAME).read_text())["token"] == "someone-else"


_RACER = textwrap.dedent(
    """
    import os, sys, time
    from t5x.launch._model_dir_lock import ModelDirInUseError, acquire_model_dir_lock
    model_dir, go = sys.argv[1], sys.argv[2]
    open(f"{go}.ready-{os.getpid()}", "w").close()
    while not os.path.exists(go):
        time.sleep(0.001)
    try:
        lock = acquire_model_dir_lock(model_dir, warn=lambda line: None)
    except ModelDirInUseError:
        print("refused", flush=True)
    else:
        print("won", flush=True)
        time.sleep(3)  # hold it while the others try
        lock.release()
    """
)


@pytest.mark.parametrize("stale", [False, True], ids=["free", "stale"])
def test_simultaneous_starts_let_exactly_one_trainer_win(tmp_path, stale):
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    if stale:
        _plant(model_dir, pid=_dead_pid())  # every racer judges it stale and tries to take it over
    go = tmp_path / "go"
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", _RACER, str(model_dir), str(go)], stdout=subprocess.PIPE, text=True
        )
        for _ in range(6)
    ]
    deadline = time.monotonic() + 120
    while len(list(tmp_path.glob("go.ready-*"))) < len(racers):  # all at the start line
        assert time.monotonic() < deadline
        time.sleep(0.01)
    go.touch()
    outcomes = sorted(racer.communicate(timeout=60)[0].strip() for racer in racers)
    assert outcomes == ["refused"] * 5 + ["won"], outcomes
    assert sorted(p.name for p in model_dir.iterdir()) == []
