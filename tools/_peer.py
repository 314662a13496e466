"""Drives a peer benchmark script in another interpreter, one JSON command per line."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import tempfile

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

    def close(self) -> None:
        if self._proc.poll() is None:
            with contextlib.suppress(RuntimeError, BrokenPipeError, json.JSONDecodeError):
                self.ask(op="quit")
        self._proc.wait(timeout=30)
        os.unlink(self._script)
