"""``seqio.evaluation``: the Evaluator and its loggers (the core's)."""

from __future__ import annotations

from t5x.tasks import Evaluator, JSONLogger, Logger, PyLoggingLogger, TensorBoardLogger

__all__ = ["Evaluator", "JSONLogger", "Logger", "PyLoggingLogger", "TensorBoardLogger"]
