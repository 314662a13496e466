"""``seqio.metrics``: the value types metric functions return, and helpers, without JAX.

seqio's clu/flax-based ``Metric`` objects (``LegacyMetric``,
``PassthroughLegacyMetric``, ``CollectingMetric``) are not provided: the
facade stays free of JAX. Metric functions returning plain floats or these
value types work with ``Evaluator``.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np


@dataclasses.dataclass
class MetricValue:
    """Base of the values a metric function may return (written by a Logger)."""


@dataclasses.dataclass
class Scalar(MetricValue):
    """A number, plotted over steps."""

    value: int | float


@dataclasses.dataclass
class Text(MetricValue):
    """Text (TensorBoard renders markdown)."""

    textdata: str | bytes


@dataclasses.dataclass
class Image(MetricValue):
    """Images, in tf.summary.image's layout."""

    image: np.ndarray
    max_outputs: int = 3


@dataclasses.dataclass
class Audio(MetricValue):
    """Audio clips, in tf.summary.audio's layout."""

    audiodata: np.ndarray
    sample_rate: int = 44100
    max_outputs: int = 3


@dataclasses.dataclass
class Histogram(MetricValue):
    """Values to histogram."""

    values: np.ndarray
    bins: int | None = None


@dataclasses.dataclass
class Generic(MetricValue):
    """A raw tensor with its summary metadata."""

    tensor: np.ndarray
    metadata: Any


class ModelOutputType(enum.IntEnum):
    """What a metric consumes."""

    PREDICTION = 1
    SCORE = 2
    PREDICTION_WITH_AUX = 3
    SCORE_WITH_INTERMEDIATES = 4

    @classmethod
    def to_str(cls, value: ModelOutputType) -> str:
        return value.name.lower()


MetricFnCallable = Callable[..., Mapping[str, MetricValue | float]]


def remove_padding_examples(
    model_output: Any, indices_2d: np.ndarray, mask: np.ndarray
) -> tuple[np.ndarray, Any]:
    """Drops the examples whose ``mask`` is 0 (batch padding) from indices and outputs."""
    keep = np.asarray(mask) == 1

    def cut(x: Any) -> Any:
        if isinstance(x, (tuple, list)):
            return type(x)(cut(v) for v in x)
        if isinstance(x, dict):
            return {k: cut(v) for k, v in x.items()}
        return np.asarray(x)[keep]

    return np.asarray(indices_2d)[keep], cut(model_output)


def globally_sort_model_output(model_output: Any, indices_2d: np.ndarray) -> Any:
    """Orders outputs by (shard id, example id), the two columns of ``indices_2d``."""
    indices_2d = np.asarray(indices_2d)
    order = np.lexsort((indices_2d[:, 1], indices_2d[:, 0]))

    def sort(x: Any) -> Any:
        if isinstance(x, (tuple, list)):
            return type(x)(sort(v) for v in x)
        if isinstance(x, dict):
            return {k: sort(v) for k, v in x.items()}
        return np.array([x[i] for i in order])

    return sort(model_output)


__all__ = [
    "Audio",
    "Generic",
    "Histogram",
    "Image",
    "MetricFnCallable",
    "MetricValue",
    "ModelOutputType",
    "Scalar",
    "Text",
    "globally_sort_model_output",
    "remove_padding_examples",
]
