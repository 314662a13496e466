"""Runs one job as several processes on this machine, under jax.distributed."""

from __future__ import annotations

import contextlib
import os
import pathlib
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence

from t5x.launch._preemption import PREEMPTION_EXIT_CODES

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
    program: Sequence[str] | None = None,
) -> int:
    """Starts ``t5x-launch <job_args>`` as ``num_processes`` processes and waits.

    Process 0 writes to this terminal; the others to ``process_<i>.log`` files in
    ``log_dir`` (a new temporary folder when None), whose paths are printed.
    When any process fails, the others are stopped.

    SIGTERM or SIGINT stops the job as a whole: it is passed on to every
    process as SIGTERM (each one finishes its step and saves; SIGTERM rather
    than SIGINT because a terminal's Ctrl-C also reaches them directly, and a
    second SIGINT would make them give up), and once all have ended the exit
    code is 128 + the signal's number. A second SIGINT kills them at once.
    When one process ends by a signal of its own (a preemption code, 130 or
    143), the others get SIGTERM as well, and that code is returned once all
    have ended.

    Args:
      program: the command each process runs ``job_args`` with (default: this
        Python's ``-m t5x.launch``).

    Returns:
      0 when every process succeeded, else the exit code of the first failure
      (128 + signal number for a process killed by a signal), or the
      preemption code when the job was stopped by a signal.

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
    received: list[int] = []
    try:
        with _record_signals(received):
            for index in range(num_processes):
                if received:
                    break  # stopped before every process started: the ones started are stopped below
                env = dict(os.environ)
                env.update(
                    {
                        COORDINATOR_ENV: address,
                        NUM_PROCESSES_ENV: str(num_processes),
                        PROCESS_ID_ENV: str(index),
                    }
                )
                if index == 0:
                    output = None
                else:
                    log_path = logs / f"process_{index}.log"
                    log_files.append(log_path.open("wb"))
                    output = log_files[-1]
                    print(
                        f"[t5x-launch local] process {index} logs to {log_path}", file=sys.stderr, flush=True
                    )
                command = [*(program or (sys.executable, "-m", "t5x.launch")), *job_args]
                processes.append(
                    subprocess.Popen(
                        command, env=env, stdout=output, stderr=subprocess.STDOUT if output else None
                    )
                )
            return _wait_all(processes, poll_seconds, received)
    finally:
        _stop(processes)
        for handle in log_files:
            handle.close()


@contextlib.contextmanager
def _record_signals(received: list[int]) -> Iterator[None]:
    """Appends each SIGTERM / SIGINT to ``received`` instead of ending (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: object) -> None:
        del frame
        received.append(signum)

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _exit_code(code: int) -> int:
    return code if code >= 0 else 128 - code


def _send(processes: list[subprocess.Popen[bytes]], signum: int) -> None:
    for process in processes:
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signum)


def _wait_all(processes: list[subprocess.Popen[bytes]], poll_seconds: float, received: list[int]) -> int:
    stopping: int | None = None  # the exit code the job stops with, once it does
    handled = 0
    while True:
        for signum in received[handled:]:
            handled += 1
            if stopping is None:
                stopping = 128 + signum
                print(
                    f"[t5x-launch local] {signal.Signals(signum).name}: stopping all {len(processes)} "
                    "processes (each finishes its step and saves first)",
                    file=sys.stderr,
                    flush=True,
                )
                _send(processes, signal.SIGTERM)
            elif signum == signal.SIGINT:
                print("[t5x-launch local] second SIGINT: killing every process", file=sys.stderr, flush=True)
                _send(processes, signal.SIGKILL)
                for process in processes:
                    process.wait()
                return 128 + signal.SIGINT
        codes = [p.poll() for p in processes]
        failed = [(i, _exit_code(c)) for i, c in enumerate(codes) if c not in (None, 0)]
        errors = [(i, c) for i, c in failed if c not in PREEMPTION_EXIT_CODES]
        if stopping is None and errors:
            index, code = errors[0]
            print(
                f"[t5x-launch local] process {index} failed with exit code {code}; stopping the others",
                file=sys.stderr,
            )
            return code
        if stopping is None and failed:
            index, stopping = failed[0]
            print(
                f"[t5x-launch local] process {index} stopped with exit code {stopping} (a signal); "
                "stopping the others",
                file=sys.stderr,
                flush=True,
            )
            _send(processes, signal.SIGTERM)
        if all(c is not None for c in codes):
            if errors:
                return errors[0][1]
            return stopping if failed and stopping is not None else 0  # all finished before the signal: 0
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
