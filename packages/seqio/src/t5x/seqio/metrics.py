"""``seqio.metrics``: metric values, seqio's metric objects and their helpers, without JAX.

seqio builds its metric objects on clu's ``Metric`` (which pulls in JAX).
Here they are plain frozen dataclasses with the same public methods
(``empty``, ``from_model_output``, ``merge``, ``compute``, ``reduce``) and the
same semantics; subclasses may still be decorated with
``flax.struct.dataclass`` as seqio users write them. Arrays are NumPy arrays.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar

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
        return cls(value).name.lower()


MetricFnCallable = Callable[..., Mapping[str, MetricValue | float]]

# Positional parameters (no default) of a metric function -> what it consumes.
_FN_SIGNATURES = {
    ("targets", "scores"): ModelOutputType.SCORE,
    ("targets", "predictions"): ModelOutputType.PREDICTION,
    ("targets", "predictions", "aux_values"): ModelOutputType.PREDICTION_WITH_AUX,
}


def metric_fn_output_type(metric_fn: Callable[..., Any]) -> ModelOutputType:
    """The model output a metric function consumes, read from its required positional parameters.

    Raises:
      ValueError: the parameters are none of seqio's three shapes (seqio's text).
    """
    required = tuple(
        name
        for name, p in inspect.signature(metric_fn).parameters.items()
        if p.default is inspect.Parameter.empty and p.kind == inspect.Parameter.POSITIONAL_OR_KEYWORD
    )
    if required not in _FN_SIGNATURES:
        raise ValueError(
            "Metric functions must have positional arguments matching either "
            "('targets', 'scores'), ('targets', 'predictions') or "
            f"('targets', 'predictions', 'aux_values'). Got: {required}"
        )
    return _FN_SIGNATURES[required]


# ---- tree helpers: tuples and dicts are structure, anything else one per-example column ----


def _tree_map(fn: Callable[[Any], Any], tree: Any) -> Any:
    if isinstance(tree, tuple):
        return tuple(_tree_map(fn, v) for v in tree)
    if isinstance(tree, Mapping):
        return {k: _tree_map(fn, v) for k, v in tree.items()}
    return fn(tree)


def _take(column: Any, positions: np.ndarray) -> Any:
    """The rows ``positions`` of one column (an array, or a list kept a list)."""
    if isinstance(column, np.ndarray):
        return column[positions]
    items = list(column)
    return [items[i] for i in positions]


def _concat(a: Any, b: Any) -> Any:
    if isinstance(a, tuple):
        return tuple(_concat(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, Mapping):
        return {k: _concat(a[k], b[k]) for k in a}
    if isinstance(a, list) and not isinstance(b, np.ndarray):
        return a + list(b)
    return np.concatenate([np.asarray(a), np.asarray(b)], axis=0)


def remove_padding_examples(
    model_output: Any, indices_2d: np.ndarray, mask: np.ndarray
) -> tuple[np.ndarray, Any]:
    """Drops the examples whose ``mask`` is not 1 (batch padding) from indices and outputs."""
    keep = np.flatnonzero(np.asarray(mask) == 1)
    return np.asarray(indices_2d)[keep], _tree_map(lambda col: _take(col, keep), model_output)


def globally_sort_model_output(model_output: Any, indices_2d: np.ndarray) -> Any:
    """Orders outputs by (shard id, example id), the two columns of ``indices_2d``."""
    indices_2d = np.asarray(indices_2d)
    order = np.lexsort((indices_2d[:, 1], indices_2d[:, 0]))
    return _tree_map(lambda col: _take(col, order), model_output)


# ---- metric objects ----------------------------------------------------------------------------


class _MetricApi:
    """clu's metric protocol: an immutable accumulator built per batch, merged, then computed."""

    @classmethod
    def empty(cls) -> Any:
        """The neutral element of ``merge``."""
        raise NotImplementedError(f"{cls.__name__} must define empty()")

    @classmethod
    def from_model_output(cls, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("Must override from_model_output()")

    def merge(self, other: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must define merge()")

    def reduce(self) -> Any:
        # clu reduces a metric stacked over devices; one host's NumPy metric is already reduced.
        return self

    def compute(self) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must define compute()")


@dataclasses.dataclass(frozen=True)
class Metric(_MetricApi):
    """Base of seqio's batch-updatable metrics; ``model_output_type`` says what it consumes.

    ``from_model_output(inputs, model_output, features, target_field_name,
    mask, indices_2d)`` builds one batch's metric, ``merge`` accumulates and
    ``compute`` returns ``{name: value}``.
    """

    model_output_type: ModelOutputType


def _decode_targets(
    examples: Iterable[Mapping[str, Any]],
    features: Mapping[str, Any],
    target_field_name: str,
    postprocess: Callable[..., Any],
) -> list[Any]:
    """Each example's target text (pretokenized when present, else decoded), postprocessed."""
    out = []
    for ex in examples:
        raw_key = f"{target_field_name}_pretokenized"
        if raw_key in ex:
            target = ex[raw_key]
        else:
            target = features[target_field_name].vocabulary.decode(list(ex[target_field_name]))
        if isinstance(target, bytes):
            target = target.decode("utf-8")
        out.append(postprocess(target, example=ex, is_target=True))
    return out


def _decode_predictions(model_output: Any, vocab: Any) -> Any:
    """Token ids -> text: one sequence per example (2-D) or several (3-D, top-k); else as given."""
    if isinstance(model_output, np.ndarray) and model_output.ndim == 2:
        return [vocab.decode(tokens) for tokens in model_output]
    if isinstance(model_output, np.ndarray) and model_output.ndim == 3:
        return [[vocab.decode(seq) for seq in seqs] for seqs in model_output]
    return model_output


@dataclasses.dataclass(frozen=True)
class LegacyMetric(Metric):
    """A metric function with its postprocessor, as a metric object (seqio's LegacyMetric).

    ``from_model_output`` decodes and postprocesses targets (once: they are
    kept in ``metric_fn_kwargs``) and the model's output, records them in
    ``targets_and_inferences`` and returns the object; ``compute`` calls the
    function.
    """

    _metric_fn: MetricFnCallable
    _postprocess_fn: Callable[..., Any] | None
    metric_fn_kwargs: dict[str, Any]
    targets_and_inferences: dict[str, Any]

    @classmethod
    def empty(cls, metric_fn: MetricFnCallable, postprocess_fn: Callable[..., Any] | None) -> LegacyMetric:  # type: ignore[override]
        return cls(
            model_output_type=metric_fn_output_type(metric_fn),
            _metric_fn=metric_fn,
            _postprocess_fn=postprocess_fn,
            metric_fn_kwargs={},
            targets_and_inferences={},
        )

    def postprocess_fn(self, targets_or_predictions: Any, **kwargs: Any) -> Any:
        if self._postprocess_fn:
            return self._postprocess_fn(targets_or_predictions, **kwargs)
        return targets_or_predictions

    def from_model_output(  # type: ignore[override]
        self,
        inputs: Iterable[Mapping[str, Any]],
        model_output: Any,
        features: Mapping[str, Any],
        target_field_name: str = "targets",
        mask: np.ndarray | None = None,
    ) -> LegacyMetric:
        inputs = list(inputs)
        if not self.metric_fn_kwargs.get("targets"):
            targets = _decode_targets(inputs, features, target_field_name, self.postprocess_fn)
            self.metric_fn_kwargs["targets"] = targets
            self.targets_and_inferences["targets"] = targets
        if self.model_output_type == ModelOutputType.SCORE:
            self.metric_fn_kwargs["scores"] = model_output
            self.targets_and_inferences["score"] = model_output
            return self
        vocab = features[target_field_name].vocabulary
        if self.model_output_type == ModelOutputType.PREDICTION_WITH_AUX:
            self.metric_fn_kwargs["aux_values"] = model_output[1]
            self.targets_and_inferences["aux_value"] = model_output[1]
            decoded = [vocab.decode(tokens) for tokens in model_output[0]]
        elif isinstance(model_output, np.ndarray) and model_output.ndim == 2:
            decoded = [vocab.decode(tokens) for tokens in model_output]
        else:  # top-k: several sequences per example
            decoded = [[vocab.decode(seq) for seq in seqs] for seqs in model_output]
        self.targets_and_inferences["output"] = decoded
        predictions = [
            self.postprocess_fn(p, example=ex, is_target=False)
            for ex, p in zip(inputs, decoded, strict=False)
        ]
        self.metric_fn_kwargs["predictions"] = predictions
        self.targets_and_inferences["prediction"] = predictions
        return self

    def compute(self) -> Any:
        return self._metric_fn(**self.metric_fn_kwargs)


@dataclasses.dataclass(frozen=True)
class CollectingMetric(_MetricApi):
    """A metric that keeps every batch's model output, mask and 2-D indices, computed at the end.

    ``merge`` concatenates; ``actual_compute(examples, output_features, ...)``
    (defined by subclasses) turns everything collected into metric values.
    """

    values: dict[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def empty(cls) -> CollectingMetric:
        return cls(values={})

    @classmethod
    def from_model_output(  # type: ignore[override]
        cls,
        inputs: Any,
        model_output: Any,
        features: Mapping[str, Any],
        target_field_name: str = "targets",
        mask: np.ndarray | None = None,
        indices_2d: np.ndarray | None = None,
    ) -> CollectingMetric:
        del inputs, features, target_field_name
        n = len(model_output[0]) if isinstance(model_output, tuple) else len(model_output)
        if mask is None:
            mask = np.ones((n,), np.int32)
        if indices_2d is None:
            # One shard (0), examples in order.
            indices_2d = np.stack([np.zeros((n,), np.int32), np.arange(n, dtype=np.int32)], axis=1)
        return cls(values={"model_output": model_output, "indices_2d": indices_2d, "mask": mask})

    def merge(self, other: CollectingMetric) -> CollectingMetric:
        if not self.values:
            return other
        if not other.values:
            return self
        if set(self.values) != set(other.values):
            raise ValueError(
                f"{type(self).__name__}.merge: collected keys differ: {sorted(self.values)} vs {sorted(other.values)}"
            )
        return type(self)(values={k: _concat(v, other.values[k]) for k, v in self.values.items()})

    def compute(self) -> dict[str, Any]:
        return dict(self.values)

    def actual_compute(
        self,
        task_dataset_as_numpy: Iterable[Mapping[str, Any]],
        task_output_features: Mapping[str, Any],
        target_field_name: str = "targets",
        cached_targets: list[Any] | None = None,
    ) -> tuple[Any, dict[str, Any]]:
        raise NotImplementedError("Must override actual_compute()")


@dataclasses.dataclass(frozen=True)
class PassthroughLegacyMetric(CollectingMetric):
    """Collects model outputs and runs a metric function on them once all are in.

    Build the class for one function with ``from_metric_fn(metric_fn,
    postprocess_fn)``; its ``actual_compute`` drops padding (mask), restores
    example order (2-D indices), decodes and postprocesses, then calls the
    function. Returns ``(metric values, targets_and_inferences)``.
    """

    model_output_type: ClassVar[ModelOutputType]
    _postprocess: ClassVar[Callable[..., Any] | None] = None
    _metric_fn: ClassVar[MetricFnCallable]

    @classmethod
    def from_metric_fn(
        cls, metric_fn: MetricFnCallable, postprocess_fn: Callable[..., Any] | None = None
    ) -> type[PassthroughLegacyMetric]:
        output_type = metric_fn_output_type(metric_fn)  # validates before the class exists

        @dataclasses.dataclass(frozen=True)
        class FromMetricFun(cls):  # type: ignore[valid-type,misc]
            """PassthroughLegacyMetric of one metric function."""

        # Class attributes, not fields: seqio reads them from the class (type(self).model_output_type).
        FromMetricFun.model_output_type = output_type
        FromMetricFun._metric_fn = staticmethod(metric_fn)  # type: ignore[assignment]
        FromMetricFun._postprocess = staticmethod(postprocess_fn) if postprocess_fn else None  # type: ignore[assignment]
        return FromMetricFun

    @classmethod
    def postprocess(cls, value: Any, **kwargs: Any) -> Any:
        return cls._postprocess(value, **kwargs) if cls._postprocess else value

    def postprocess_targets(
        self,
        task_dataset_as_numpy: Iterable[Mapping[str, Any]],
        task_output_features: Mapping[str, Any],
        target_field_name: str = "targets",
    ) -> list[Any]:
        return _decode_targets(
            task_dataset_as_numpy, task_output_features, target_field_name, type(self).postprocess
        )

    def actual_compute(
        self,
        task_dataset_as_numpy: Iterable[Mapping[str, Any]],
        task_output_features: Mapping[str, Any],
        target_field_name: str = "targets",
        cached_targets: list[Any] | None = None,
    ) -> tuple[Any, dict[str, Any]]:
        examples = list(task_dataset_as_numpy)
        targets = cached_targets or self.postprocess_targets(
            examples, task_output_features, target_field_name
        )
        kwargs: dict[str, Any] = {"targets": targets}
        record: dict[str, Any] = {"targets": targets}
        indices_2d, model_output = remove_padding_examples(
            self.values["model_output"], self.values["indices_2d"], self.values["mask"]
        )
        if len(targets) != len(indices_2d):
            raise ValueError(
                f"{type(self).__name__}: {len(indices_2d)} model outputs (padding removed) "
                f"for {len(targets)} targets"
            )
        model_output = globally_sort_model_output(model_output, indices_2d)
        kind = type(self).model_output_type
        if kind == ModelOutputType.SCORE:
            kwargs["scores"] = record["score"] = model_output
            return type(self)._metric_fn(**kwargs), record
        vocab = task_output_features[target_field_name].vocabulary
        if kind == ModelOutputType.PREDICTION_WITH_AUX:
            kwargs["aux_values"] = record["aux_value"] = model_output[1]
            decoded = [vocab.decode(tokens) for tokens in model_output[0]]
        else:
            decoded = _decode_predictions(model_output, vocab)
        record["output"] = decoded
        predictions = [
            type(self).postprocess(p, example=ex, is_target=False)
            for ex, p in zip(examples, decoded, strict=False)
        ]
        kwargs["predictions"] = record["prediction"] = predictions
        return type(self)._metric_fn(**kwargs), record


__all__ = [
    "Audio",
    "CollectingMetric",
    "Generic",
    "Histogram",
    "Image",
    "LegacyMetric",
    "Metric",
    "MetricFnCallable",
    "MetricValue",
    "ModelOutputType",
    "PassthroughLegacyMetric",
    "Scalar",
    "Text",
    "globally_sort_model_output",
    "metric_fn_output_type",
    "remove_padding_examples",
]
