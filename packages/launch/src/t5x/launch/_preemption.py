"""Stopping a ``t5x-launch`` command on SIGTERM / SIGINT, with one exit code for each.

A command that trains stops after the current step and its checkpoint (the
train loop of ``t5x.training`` does that); anything else a command is doing
when a signal comes (compiling, evaluating, between two trainings of a study)
stops at once. Either way the whole command stops: :class:`Preempted` goes up
through every loop of the command, and the command exits with 128 + the
signal's number (143 for SIGTERM, 130 for SIGINT), the code shells, ``timeout``,
SLURM and Kubernetes read as "ended by that signal".
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

# The signals a command stops for, and the exit codes it stops with.
SIGNALS = (signal.SIGTERM, signal.SIGINT)
SIGTERM_EXIT_CODE = 128 + signal.SIGTERM  # 143
SIGINT_EXIT_CODE = 128 + signal.SIGINT  # 130
PREEMPTION_EXIT_CODES = (SIGTERM_EXIT_CODE, SIGINT_EXIT_CODE)


def exit_code(signum: int) -> int:
    """The exit code of a command stopped by ``signum``: 128 + its number."""
    return 128 + int(signum)


class Preempted(BaseException):
    """A SIGTERM or SIGINT stopped the command.

    A ``BaseException`` (as ``KeyboardInterrupt``), so that no ``except
    Exception`` on the way up keeps the command going.

    Attributes:
      signum: the signal's number.
      step: the step training stopped at, when a checkpoint of it was saved.
    """

    def __init__(self, signum: int, step: int | None = None) -> None:
        self.signum, self.step = int(signum), step
        _state.stopping = True
        super().__init__(signum, step)

    @property
    def exit_code(self) -> int:
        """128 + the signal's number."""
        return exit_code(self.signum)

    def describe(self, hint: str = "run the same command to resume") -> str:
        """The one line a command prints, e.g. ``preempted by SIGTERM at step 16 (checkpoint saved); ...``."""
        name = signal.Signals(self.signum).name
        verb = "interrupted" if self.signum == signal.SIGINT else "preempted"
        where = "" if self.step is None else f" at step {self.step} (checkpoint saved)"
        return f"[t5x-launch] {verb} by {name}{where}; {hint}"

    def __str__(self) -> str:
        return self.describe()


class _State:
    stopping = False


_state = _State()


def _handler(signum: int, frame: Any) -> None:
    del frame
    if not _state.stopping:
        raise Preempted(signum)
    if signum == signal.SIGINT:
        raise KeyboardInterrupt  # a second interrupt while stopping: give up at once


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """While inside, SIGTERM and SIGINT raise :class:`Preempted` (main thread only).

    The train loop installs its own handlers while it runs (finish the step,
    save, then return) and puts these back afterwards. Once a command is
    stopping, a further SIGTERM is ignored and a further SIGINT raises
    KeyboardInterrupt.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _state.stopping = False
    previous = {sig: signal.signal(sig, _handler) for sig in SIGNALS}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
        _state.stopping = False


def run_stoppable(command: Callable[[], int], hint: str = "run the same command to resume") -> int:
    """Runs ``command`` inside :func:`stop_on_signals`; returns its exit code.

    A :class:`Preempted` prints its one line on stderr and gives 128 + the
    signal's number; a second SIGINT (KeyboardInterrupt) gives 130.
    """
    try:
        with stop_on_signals():
            return command()
    except Preempted as stopped:
        print(stopped.describe(hint), file=sys.stderr, flush=True)
        return stopped.exit_code
    except KeyboardInterrupt:
        print(
            "[t5x-launch] aborted by a second SIGINT; the newest complete checkpoint is kept",
            file=sys.stderr,
            flush=True,
        )
        return SIGINT_EXIT_CODE
