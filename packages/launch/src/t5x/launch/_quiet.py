"""Keeps TensorFlow's, XLA's and CUDA's start-up noise out of a CPU job's console.

On a machine without a GPU, importing TensorFlow and starting JAX print lines
such as "Could not find cuda drivers on your machine", "failed call to cuInit",
"Unable to register cuDNN factory" or "oneDNN custom operations are on". They
are written by C++ code straight to file descriptor 2 during static
initialisation, before ``TF_CPP_MIN_LOG_LEVEL`` is read (TensorFlow 2.21 prints
them at any level), so no environment setting removes them.

:func:`filter_startup_noise` puts a pipe in front of descriptor 2 and a thread
that copies every line through except those matching :data:`NOISE`: known,
harmless start-up messages, matched whole. Everything else (tracebacks, real
errors and warnings, partial lines) goes through unchanged; at exit the
thread drains the pipe and the original descriptor is put back. Python's
fault handler writes to the original descriptor, so a crash's report is not
caught in the pipe. Set ``T5X_SHOW_STARTUP_LOGS=1`` to see everything.
"""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import os
import re
import sys
import threading
from collections.abc import Mapping, MutableMapping

SHOW_ENV = "T5X_SHOW_STARTUP_LOGS"
# A C++ (absl / TSL) log line: severity letter, date, time, thread, file:line].
_CXX = r"[IWE]\d{4} [\d:. ]+\d+ [\w.]+:\d+\] "
NOISE = tuple(
    re.compile(pattern)
    for pattern in (
        r"WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR$",
        rf"{_CXX}oneDNN custom operations are on\.",
        rf"{_CXX}oneDNN supports DT_\w+ only on platforms with AVX-512\.",
        rf"{_CXX}Could not find cuda drivers on your machine, GPU will not be used\.$",
        rf"{_CXX}failed call to cuInit: ",
        rf"{_CXX}Unable to register cu(DNN|FFT|BLAS) factory: ",
        rf"{_CXX}This TensorFlow binary is optimized to use available CPU instructions",
        r"To enable the following instructions: .* rebuild TensorFlow with the appropriate compiler flags\.$",
        rf"{_CXX}TF-TRT Warning: Could not find TensorRT$",
        r"(WARNING:absl:)?An NVIDIA GPU may be present on this machine, but a CUDA-enabled jaxlib is not installed\.",
        r"WARNING: Logging before flag parsing goes to stderr\.$",
    )
)
# Set before TensorFlow starts: what the variable can still quiet (its Python-side logs).
QUIET_ENV = {"TF_CPP_MIN_LOG_LEVEL": "1"}


def is_noise(line: str) -> bool:
    """Whether ``line`` (without its newline) is one of the known start-up messages."""
    return any(pattern.match(line) for pattern in NOISE)


def add_quiet_defaults(environ: MutableMapping[str, str]) -> None:
    """Sets :data:`QUIET_ENV` where the user has not set those variables."""
    for name, value in QUIET_ENV.items():
        environ.setdefault(name, value)


class _Filter:
    def __init__(self, read_fd: int, write_fd: int):
        self.read_fd, self.write_fd = read_fd, write_fd
        self.thread = threading.Thread(target=self._run, name="t5x-stderr-filter", daemon=True)

    def _emit(self, data: bytes) -> None:
        while data:
            data = data[os.write(self.write_fd, data) :]

    def _run(self) -> None:
        pending = b""
        while True:
            chunk = os.read(self.read_fd, 65536)
            if not chunk:
                break
            pending += chunk
            *lines, pending = pending.split(b"\n")
            kept = [line for line in lines if not is_noise(line.decode("utf-8", "replace"))]
            if kept:
                self._emit(b"".join(line + b"\n" for line in kept))
            if pending and not re.match(rb"[IWE]\d|WARNING|To enable|An NVIDIA", pending):
                self._emit(pending)  # a partial line that cannot be noise goes out now
                pending = b""
        if pending:
            self._emit(pending)


def filter_startup_noise(environ: Mapping[str, str] = os.environ) -> bool:
    """Drops the known start-up noise lines from this process's stderr (see the module docstring).

    Returns:
      Whether the filter was installed (not with ``T5X_SHOW_STARTUP_LOGS=1``,
      nor when descriptor 2 cannot be replaced).
    """
    if environ.get(SHOW_ENV, "").strip().lower() in ("1", "true", "yes", "on"):
        return False
    try:
        original = os.dup(2)
        read_fd, write_fd = os.pipe()
        sys.stderr.flush()
        os.dup2(write_fd, 2)
        os.close(write_fd)
    except OSError:
        return False
    os.set_inheritable(original, False)
    line_filter = _Filter(read_fd, original)
    line_filter.thread.start()
    if faulthandler.is_enabled():
        faulthandler.enable(file=original)  # a crash report must not wait in the pipe

    def restore() -> None:
        with contextlib.suppress(OSError, ValueError):  # a closed or broken sys.stderr
            sys.stderr.flush()
        os.dup2(original, 2)  # closes the pipe's write end: the thread drains it and stops
        line_filter.thread.join(timeout=5)

    atexit.register(restore)
    return True
