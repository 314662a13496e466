"""MetricWriters: TensorBoard event files, JSON Lines and a console progress line."""

from __future__ import annotations

import datetime
import json
import logging
import math
import os
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

import jax

from t5x.interfaces import MetricWriter
from t5x.training import _tfevents


def _is_primary(is_primary: bool | None) -> bool:
    return jax.process_index() == 0 if is_primary is None else is_primary


class _Writer:
    def __init__(self) -> None:
        self._closed = False

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"{type(self).__name__} is closed")


class _FileWriter(_Writer):
    """A writer with one open file (None on processes that do not write)."""

    def __init__(self) -> None:
        super().__init__()
        self._file: Any = None

    def flush(self) -> None:
        self._check_open()
        if self._file is not None:
            self._file.flush()
            os.fsync(self._file.fileno())

    def close(self) -> None:
        if not self._closed and self._file is not None:
            self.flush()
            self._file.close()
        self._closed = True


class TensorBoardWriter(_FileWriter):
    """Writes TensorBoard event files (scalars, text, hparams as text) without TensorFlow.

    Args:
      logdir: the folder for the ``events.out.tfevents.*`` file (created).
      is_primary: write only when True (default: on process 0).
    """

    def __init__(self, logdir: str, is_primary: bool | None = None):
        super().__init__()
        self.logdir = logdir
        if _is_primary(is_primary):
            os.makedirs(logdir, exist_ok=True)
            name = f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}.v2"
            self.path = os.path.join(logdir, name)
            self._file = open(self.path, "ab")  # noqa: SIM115 - kept open for the writer's life
            self._file.write(_tfevents.tfrecord(_tfevents.file_version_event(time.time())))

    def _write(self, event: bytes) -> None:
        self._check_open()
        if self._file is not None:
            self._file.write(_tfevents.tfrecord(event))

    def write_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
        self._write(
            _tfevents.scalars_event(time.time(), int(step), {k: float(v) for k, v in scalars.items()})
        )

    def write_texts(self, step: int, texts: Mapping[str, str]) -> None:
        self._write(_tfevents.texts_event(time.time(), int(step), {k: str(v) for k, v in texts.items()}))

    def write_hparams(self, hparams: Mapping[str, Any]) -> None:
        self.write_texts(0, {"hparams": json.dumps(dict(hparams), sort_keys=True, default=str)})


class JsonlWriter(_FileWriter):
    """Appends one JSON object per call to a ``.jsonl`` file.

    Lines: ``{"step": 10, "loss": 2.5, ...}`` for scalars, ``{"step": 10,
    "texts": {...}}`` for texts and ``{"hparams": {...}}``.

    Args:
      path: the file (its folder is created).
      is_primary: write only when True (default: on process 0).
    """

    def __init__(self, path: str, is_primary: bool | None = None):
        super().__init__()
        self.path = path
        if _is_primary(is_primary):
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115

    def _line(self, record: Mapping[str, Any]) -> None:
        self._check_open()
        if self._file is not None:
            self._file.write(json.dumps(record, default=str) + "\n")

    def write_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
        self._line({"step": int(step), **{k: float(v) for k, v in scalars.items()}})

    def write_texts(self, step: int, texts: Mapping[str, str]) -> None:
        self._line({"step": int(step), "texts": {k: str(v) for k, v in texts.items()}})

    def write_hparams(self, hparams: Mapping[str, Any]) -> None:
        self._line({"hparams": dict(hparams)})


def _compact(value: float) -> str:
    for limit, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= limit:
            return f"{value / limit:.1f}{suffix}"
    return f"{value:.1f}"


def _absl_flags_parsed() -> bool:
    """Whether the program runs under absl's ``app.run`` (its logging flags then decide)."""
    try:
        from absl import flags
    except ImportError:
        return False
    return flags.FLAGS.is_parsed()


def _log_record(message: str) -> logging.LogRecord:
    # Named after this module and ConsoleWriter's write, as a logging call here would be.
    return logging.LogRecord("t5x.training", logging.INFO, __file__, _LOG_LINE, message, None, None)


class ConsoleWriter(_Writer):
    """Training progress: step, loss, learning rate, tokens/s (or steps/s) and ETA.

    Prints only on process 0. On a terminal it is one live line, rewritten in
    place. When ``stream`` is not a terminal (nohup, SLURM, CI logs) each write
    of training scalars (those with a ``loss``, once per log period) is one
    log line in absl-py's format, flushed, so a log shows progress as it goes::

        I1202 18:40:00.123456 140231 _writers.py:212] step 200/1000 | loss 2.3 | ...

    Under absl's ``app.run`` (its flags parsed) and with no ``stream`` given,
    the line goes through ``absl.logging`` itself, so ``--log_dir``,
    ``--logtostderr`` and the verbosity flags apply.

    Args:
      total_steps: for the ETA and ``step/total``.
      stream: where to print (default ``sys.stderr``).
      is_primary: print only when True (default: on process 0).
    """

    def __init__(
        self, total_steps: int | None = None, stream: TextIO | None = None, is_primary: bool | None = None
    ):
        super().__init__()
        self.total_steps = total_steps
        self._to_absl = stream is None and _absl_flags_parsed()
        self.stream = stream if stream is not None else sys.stderr
        isatty = getattr(self.stream, "isatty", None)
        self.active = _is_primary(is_primary)
        self.live = self.active and bool(isatty and isatty())
        self._start: tuple[float, int] | None = None

    def format_line(self, step: int, scalars: Mapping[str, float], now: float | None = None) -> str:
        """The progress line for these scalars (also used when inactive, for tests)."""
        now = time.monotonic() if now is None else now
        if self._start is None:
            self._start = (now, step)
        parts = [f"step {step}" + (f"/{self.total_steps}" if self.total_steps else "")]
        if "loss" in scalars:
            parts.append(f"loss {float(scalars['loss']):.4f}")
        if "learning_rate" in scalars:
            parts.append(f"lr {float(scalars['learning_rate']):.3g}")
        if "timing/tokens_per_second" in scalars:
            parts.append(f"{_compact(float(scalars['timing/tokens_per_second']))} tok/s")
        elif "timing/steps_per_second" in scalars:
            parts.append(f"{float(scalars['timing/steps_per_second']):.3g} steps/s")
        start_time, start_step = self._start
        if self.total_steps and step > start_step and now > start_time:
            rate = (step - start_step) / (now - start_time)
            remaining = max(0.0, (self.total_steps - step) / rate)
            if math.isfinite(remaining):
                parts.append(f"ETA {datetime.timedelta(seconds=round(remaining))}")
        return " | ".join(parts)

    def write_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
        self._check_open()
        line = self.format_line(step, scalars)
        if self.live:
            self.stream.write("\r\x1b[2K" + line)
            self.stream.flush()
        elif self.active and "loss" in scalars:  # evaluation scalars alone make no progress line
            self._log(line)

    def _log(self, line: str) -> None:
        from absl import logging as absl_logging

        if self._to_absl:
            absl_logging.info("%s", line)
            return
        self.stream.write(absl_logging.PythonFormatter().format(_log_record(line)) + "\n")
        self.stream.flush()

    def write_texts(self, step: int, texts: Mapping[str, str]) -> None:
        self._check_open()

    def write_hparams(self, hparams: Mapping[str, Any]) -> None:
        self._check_open()

    def flush(self) -> None:
        self._check_open()
        if self.active:
            self.stream.flush()

    def close(self) -> None:
        if not self._closed and self.live:
            self.stream.write("\n")
            self.stream.flush()
        self._closed = True


_LOG_LINE = ConsoleWriter._log.__code__.co_firstlineno


class MultiWriter(_Writer):
    """Sends every call to several writers."""

    def __init__(self, writers: Sequence[MetricWriter]):
        super().__init__()
        self.writers = list(writers)

    def write_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
        self._check_open()
        for writer in self.writers:
            writer.write_scalars(step, scalars)

    def write_texts(self, step: int, texts: Mapping[str, str]) -> None:
        self._check_open()
        for writer in self.writers:
            writer.write_texts(step, texts)

    def write_hparams(self, hparams: Mapping[str, Any]) -> None:
        self._check_open()
        for writer in self.writers:
            writer.write_hparams(hparams)

    def flush(self) -> None:
        self._check_open()
        for writer in self.writers:
            writer.flush()

    def close(self) -> None:
        if not self._closed:
            for writer in self.writers:
                writer.close()
        self._closed = True
