"""``seqio.loggers``: where evaluation results go (the core's loggers)."""

from __future__ import annotations

from t5x.tasks import JSONLogger, Logger, PyLoggingLogger, TensorBoardLogger

__all__ = ["JSONLogger", "Logger", "PyLoggingLogger", "TensorBoardLogger"]
