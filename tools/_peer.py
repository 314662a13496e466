"""Drives a peer benchmark script in another interpreter, one JSON command per line."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import subprocess
import tempfile
import threading
import time

from t5x.launch import user_environment

# How a peer's process allocates memory: "user" as its users run it (the environment the
# benchmark was started from), "ours" with the glibc malloc settings t5x-launch gives our side.
PEER_MALLOC = ("user", "ours")


def peer_environment(malloc: str) -> dict[str, str]:
    """The environment a peer process starts in, for ``malloc`` in ``PEER_MALLOC``."""
    if malloc not in PEER_MALLOC:
        raise ValueError(f"peer malloc must be one of {PEER_MALLOC}, got {malloc!r}")
    return user_environment() if malloc == "user" else dict(os.environ)


def add_peer_malloc_flag(parser: argparse.ArgumentParser) -> None:
    """``--peer-malloc user|ours``, the choice :func:`peer_environment` takes."""
    parser.add_argument(
        "--peer-malloc",
        choices=PEER_MALLOC,
        default="user",
        help="the PyTorch peer's glibc malloc settings: the user's own (default) or the ones our side runs with",
    )


def peak_rss_gib(pid: int | str = "self") -> float | None:
    """A process's peak resident memory so far (``VmHWM``), in GiB; None when it cannot be read."""
    try:
        for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 2**20
    except (OSError, ValueError):
        pass
    return None


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) a process has used so far, all its threads together."""
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_until_idle(
    pids: list[int], window_s: float = 0.1, busy_share: float = 0.3, timeout_s: float = 3.0
) -> float:
    """Waits until the processes ``pids`` together use under ``busy_share`` of one CPU over a window.

    Both sides' thread pools keep spinning for a while after a call returns (OpenMP's
    default wait policy spins ~200 ms): timing one side right after the other gives it the
    other's spinning threads as a neighbour. Measured on a quiet 2-core machine, that made
    our ENCDEC-S greedy call 18% slower and the peer's 20%. Returns the seconds waited.
    """
    start = time.perf_counter()
    while time.perf_counter() - start < timeout_s:
        before = sum(cpu_seconds(p) for p in pids)
        time.sleep(window_s)
        if sum(cpu_seconds(p) for p in pids) - before < busy_share * window_s:
            break
    return time.perf_counter() - start


_SHORT_TUNABLES = {"9223372036854775807": "max"}


def malloc_settings(tunables: str | None) -> str:
    """How a process allocates, from its ``GLIBC_TUNABLES``: "glibc default" or the malloc tunables set."""
    entries = [e for e in (tunables or "").split(":") if e.startswith("glibc.malloc.") and "=" in e]
    if not entries:
        return "glibc default"
    named = []
    for entry in entries:
        name, value = entry[len("glibc.malloc.") :].split("=", 1)
        named.append(f"{name}={_SHORT_TUNABLES.get(value, value)}")
    return "glibc " + ",".join(named)


def _children(pid: int) -> list[int]:
    kids: list[int] = []
    try:
        for task in pathlib.Path(f"/proc/{pid}/task").iterdir():
            kids += [int(k) for k in (task / "children").read_text().split()]
    except (OSError, ValueError):
        pass
    return kids


class ProcessTreePeaks:
    """Samples the peak resident memory of a process and all its descendants, each on its own.

    Each process's ``VmHWM`` is its own high-water mark (a child's pages never count in its
    parent's), so sampling it until shortly before the process ends gives that process's peak
    whatever else runs beside it. ``peaks`` maps pid -> {"cmdline", "peak_gib"}.
    """

    def __init__(self, root: int, interval_s: float = 0.2) -> None:
        self.root, self.interval_s = root, interval_s
        self.peaks: dict[int, dict] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        todo = [self.root]
        while todo:
            pid = todo.pop()
            todo += _children(pid)
            peak = peak_rss_gib(pid)
            if peak is None:
                continue
            entry = self.peaks.setdefault(pid, {"cmdline": "", "peak_gib": 0.0})
            entry["peak_gib"] = max(entry["peak_gib"], peak)
            with contextlib.suppress(OSError):  # re-read: a process that re-executes itself changes it
                entry["cmdline"] = (
                    pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
                )

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.interval_s)

    def stop(self) -> dict[int, dict]:
        self._stop.set()
        self._thread.join()
        return self.peaks


class Peer:
    """A peer script (e.g. PyTorch + transformers) running in its own interpreter.

    The script reads one JSON command per stdin line and answers with one JSON line;
    ``{"op": "quit"}`` ends it.
    """

    def __init__(self, python: str, script: str, name: str, malloc: str = "user") -> None:
        fd, self._script = tempfile.mkstemp(suffix=f"_peer_{name}.py")
        with os.fdopen(fd, "w") as f:
            f.write(script)
        # By default the peer runs as its users run it, without the malloc tunables t5x-launch adds.
        env = peer_environment(malloc)
        self.malloc = malloc
        # On a busy machine PyTorch's OpenMP threads, spinning at every barrier by default, make
        # a small matmul ~100x slower (15 ms instead of 0.1 ms at load 6 on 2 CPUs): waiting
        # passively keeps the comparison about the frameworks. An idle machine keeps the default.
        if "OMP_WAIT_POLICY" not in env and os.getloadavg()[0] > (os.cpu_count() or 1):
            env["OMP_WAIT_POLICY"] = "PASSIVE"
        self.omp_wait_policy = env.get("OMP_WAIT_POLICY", "default")
        self.malloc_settings = malloc_settings(env.get("GLIBC_TUNABLES"))
        self.peak_rss_gib: float | None = None
        self._proc = subprocess.Popen(
            [python, self._script],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
            env=env,
        )

    def ask(self, **cmd: object) -> dict:
        assert self._proc.stdin and self._proc.stdout
        self._proc.stdin.write(json.dumps(cmd) + "\n")
        self._proc.stdin.flush()
        line = self._proc.stdout.readline()
        if not line:
            raise RuntimeError(f"peer process died (exit code {self._proc.poll()})")
        return json.loads(line)

    def settle(self) -> float:
        """Waits until neither the peer nor this process is still busy (see `wait_until_idle`)."""
        return wait_until_idle([self._proc.pid, os.getpid()])

    def close(self) -> None:
        # Read before it quits: the peer's own peak, apart from ours (it is another process).
        self.peak_rss_gib = peak_rss_gib(self._proc.pid)
        if self._proc.poll() is None:
            with contextlib.suppress(RuntimeError, BrokenPipeError, json.JSONDecodeError):
                self.ask(op="quit")
        self._proc.wait(timeout=30)
        os.unlink(self._script)
