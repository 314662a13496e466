"""Conformance checks, one per contract of ``t5x.interfaces``.

An implementation calls the check for its contract from its own tests, which
makes "implements Checkpointer v1" a tested claim. Each check raises
``ConformanceError`` (an ``AssertionError``) naming the broken rule.
"""

from t5x.interfaces.testing._common import ConformanceError
from t5x.interfaces.testing._compute import (
    check_checkpointer,
    check_metric_writer,
    check_model,
    check_partitioner,
)
from t5x.interfaces.testing._feature_converter import check_feature_converter
from t5x.interfaces.testing._input_iterator import check_input_iterator
from t5x.interfaces.testing._vocabulary import DEFAULT_TEXTS, check_vocabulary

__all__ = [
    "DEFAULT_TEXTS",
    "ConformanceError",
    "check_checkpointer",
    "check_feature_converter",
    "check_input_iterator",
    "check_metric_writer",
    "check_model",
    "check_partitioner",
    "check_vocabulary",
]
