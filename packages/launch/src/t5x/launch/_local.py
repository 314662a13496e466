"""Runs one job as several processes on this machine, under jax.distributed."""

from __future__ import annotations

import os
import pathlib
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

# The job's processes read these to join the run (see _distributed.py).
COORDINATOR_ENV = "T5X_COORDINATOR_ADDRESS"
NUM_PROCESSES_ENV = "T5X_NUM_PROCESSES"
PROCESS_ID_ENV = "T5X_PROCESS_ID"


def free_port() -> int:
    """A TCP port on localhost that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_local(
    job_args: Sequence[str],
    num_processes: int,
    *,
    port: int | None = None,
    log_dir: str | None = None,
    poll_seconds: float = 0.2,
) -> int:
    """Starts ``t5x-launch <job_args>`` as ``num_processes`` processes and waits.

    Process 0 writes to this terminal; the others to ``process_<i>.log`` files in
    ``log_dir`` (a new temporary folder when None), whose paths are printed.
    When any process fails, the others are stopped.

    Returns:
      0 when every process succeeded, else the exit code of the first failure
      (128 + signal number for a process killed by a signal).

    Raises:
      ValueError: ``num_processes`` < 1 or ``job_args`` empty.
    """
    if num_processes < 1:
        raise ValueError(f"--num_processes must be >= 1, got {num_processes}")
    if not job_args:
        raise ValueError("no job given: use `t5x-launch local --num_processes=N -- train ...`")
    address = f"127.0.0.1:{port or free_port()}"
    logs = pathlib.Path(log_dir or tempfile.mkdtemp(prefix="t5x-local-"))
    logs.mkdir(parents=True, exist_ok=True)
    processes: list[subprocess.Popen[bytes]] = []
    log_files = []
    try:
        for index in range(num_processes):
            env = dict(os.environ)
            env.update(
                {COORDINATOR_ENV: address, NUM_PROCESSES_ENV: str(num_processes), PROCESS_ID_ENV: str(index)}
            )
            if index == 0:
                output = None
            else:
                log_path = logs / f"process_{index}.log"
                log_files.append(log_path.open("wb"))
                output = log_files[-1]
                print(f"[t5x-launch local] process {index} logs to {log_path}", file=sys.stderr, flush=True)
            command = [sys.executable, "-m", "t5x.launch", *job_args]
            processes.append(
                subprocess.Popen(
                    command, env=env, stdout=output, stderr=subprocess.STDOUT if output else None
                )
            )
        return _wait_all(processes, poll_seconds)
    finally:
        _stop(processes)
        for handle in log_files:
            handle.close()


def _wait_all(processes: list[subprocess.Popen[bytes]], poll_seconds: float) -> int:
    while True:
        codes = [p.poll() for p in processes]
        failed = [(i, c) for i, c in enumerate(codes) if c not in (None, 0)]
        if failed:
            index, code = failed[0]
            print(
                f"[t5x-launch local] process {index} failed with exit code {code}; stopping the others",
                file=sys.stderr,
            )
            return code if code > 0 else 128 - code
        if all(c == 0 for c in codes):
            return 0
        time.sleep(poll_seconds)


def _stop(processes: list[subprocess.Popen[bytes]], grace_seconds: float = 10.0) -> None:
    running = [p for p in processes if p.poll() is None]
    for process in running:
        process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_seconds
    for process in running:
        try:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
