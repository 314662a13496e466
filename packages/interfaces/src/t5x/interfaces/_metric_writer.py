"""The MetricWriter contract: where training and evaluation metrics go."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class MetricWriter(Protocol):
    """Records metrics by step (TensorBoard, JSON Lines, console, ...).

    Writers may buffer; ``flush`` makes everything written so far durable.
    Writing after ``close`` raises ``RuntimeError``.
    """

    def write_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
        """Records one value per name at ``step``."""
        ...

    def write_texts(self, step: int, texts: Mapping[str, str]) -> None:
        """Records one text per name at ``step`` (e.g. sample predictions)."""
        ...

    def write_hparams(self, hparams: Mapping[str, Any]) -> None:
        """Records the run's configuration once."""
        ...

    def flush(self) -> None: ...

    def close(self) -> None: ...
