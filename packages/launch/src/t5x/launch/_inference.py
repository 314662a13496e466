"""Inference evaluation reports and the decoding progress line."""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Iterable, Mapping
from typing import Any, TextIO

import numpy as np


@dataclasses.dataclass
class InferenceReport:
    """One task's inference metrics and its decoded examples (in split order)."""

    task: str
    metrics: dict[str, float]
    num_examples: int
    examples: list[dict[str, str]]


# Not on a terminal, a decoding progress line at most this often (and after the first and last batch).
DECODE_PROGRESS_SECONDS = 10.0


class DecodeProgress:
    """Iterates over ``batches``, telling how many examples were decoded so far.

    A batch counts as decoded when the next one is asked for (decoding is
    sequential). On a terminal the count is one live line; otherwise (logs of
    nohup, SLURM, CI) it is a plain, flushed ``[decode] LABEL: decoded N/TOTAL
    examples`` line after the first batch, at most every
    ``DECODE_PROGRESS_SECONDS`` after that, and after the last. Only process 0
    prints. ``get_state`` / ``set_state`` reach the wrapped iterator, so
    resumable inference stays resumable.
    """

    def __init__(
        self,
        batches: Iterable[Mapping[str, np.ndarray]],
        label: str,
        *,
        total: int | None = None,
        verb: str = "decoded",
        stream: TextIO | None = None,
    ):
        import jax

        self._iterator = iter(batches)
        self.label, self.total, self.verb = label, total, verb
        self.stream = stream if stream is not None else sys.stdout
        self.active = jax.process_index() == 0
        isatty = getattr(self.stream, "isatty", None)
        self.live = self.active and bool(isatty and isatty())
        self.decoded = 0
        self._last_line: float | None = None
        self._done = False

    def __getattr__(self, name: str) -> Any:
        if name in ("get_state", "set_state"):
            return getattr(self._iterator, name)
        raise AttributeError(name)

    def __iter__(self) -> DecodeProgress:
        return self

    def __next__(self) -> Mapping[str, np.ndarray]:
        try:
            batch = next(self._iterator)
        except StopIteration:
            if self.decoded and not self._done:
                self._show(final=True)
            self._done = True
            raise
        if self.decoded:  # the previous batch is decoded now
            self._show(final=False)
        first = next(iter(batch.values()), None)
        self.decoded += 0 if first is None else int(np.shape(first)[0])
        return batch

    def advance_to(self, decoded: int, *, final: bool = False) -> None:
        """Tells the count when the caller decodes batches itself (not by iterating this object)."""
        self.decoded = decoded
        if final and self._done:
            return
        self._done = self._done or final
        self._show(final=final)

    def line(self, final: bool = False) -> str:
        count = min(self.decoded, self.total) if self.total is not None else self.decoded
        # A split shorter than ``total`` ends with its own count alone.
        total = f"/{self.total}" if self.total is not None and not (final and count < self.total) else ""
        return f"[decode] {self.label}: {self.verb} {count}{total} examples"

    def _show(self, final: bool) -> None:
        if not self.active:
            return
        now = time.monotonic()
        if self.live:
            self.stream.write("\r\x1b[2K" + self.line(final) + ("\n" if final else ""))
        elif final or self._last_line is None or now - self._last_line >= DECODE_PROGRESS_SECONDS:
            self.stream.write(self.line(final) + "\n")
        else:
            return
        self.stream.flush()
        self._last_line = now
