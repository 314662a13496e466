"""Upstream t5x's ``t5x.metrics``: CLU metric records for sums, per-step and per-second values.

Models return these from their loss functions; the trainer merges them across
microbatches and steps, then fills in what only the host knows (how many steps
were run, how long they took) before ``compute()``. Needs the ``metrics`` extra
(``clu``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any

import flax
import jax
import jax.numpy as jnp
import numpy as np

try:
    from clu import metrics as clu_metrics
except ImportError as error:  # pragma: no cover - exercised only without the extra
    raise ImportError("t5x.metrics needs clu: install t5x-upstream[metrics] (pip install clu)") from error

MetricsMap = MutableMapping[str, clu_metrics.Metric]
Scalar = int | float | np.number | np.ndarray | jax.Array


def _summed(values: Any) -> jax.Array:
    # A scalar counts as a batch of one, so 0-d and n-d inputs take the same path.
    return jnp.atleast_1d(jnp.asarray(values)).sum()


def _is_traced(value: Any) -> bool:
    return any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree.leaves(value))


@flax.struct.dataclass
class Sum(clu_metrics.Metric):
    """The total of every value seen (a scalar or any array)."""

    total: Scalar

    @classmethod
    def from_model_output(cls, values: Scalar, **_: Any) -> Sum:
        return cls(total=_summed(values))

    def merge(self, other: Sum) -> Sum:
        return type(self)(total=self.total + other.total)

    def compute(self) -> Scalar:
        return self.total


@flax.struct.dataclass
class Step(clu_metrics.Metric):
    """Base of metrics divided by a step count; the host sets the count with ``replace_steps``.

    Inside the step function the count is unknown (microbatches would each add one),
    so the trainer overwrites it once the steps have run.
    """

    steps: int | None = 1

    def replace_steps(self, steps: int | None) -> Step:
        return self.replace(steps=steps)

    def compute(self) -> Scalar:
        if self.steps is None:
            raise ValueError(f"{type(self).__name__}.steps is unset: call replace_steps(n) before compute()")
        return self.steps


@flax.struct.dataclass
class AveragePerStep(Step):
    """A total divided by the number of steps it was gathered over."""

    total: Scalar | None = None

    @classmethod
    def from_model_output(cls, values: Scalar, steps: int | None = 1, **_: Any) -> AveragePerStep:
        return cls(total=_summed(values), steps=steps)

    def merge(self, other: AveragePerStep) -> AveragePerStep:
        _check_same_type(self, other)
        return type(self)(total=self.total + other.total, steps=self.steps + other.steps)  # type: ignore[operator]

    def compute(self) -> Scalar:
        steps = Step.compute(self)
        if self.total is None:
            raise ValueError("AveragePerStep.total is None: build it with from_model_output(values)")
        return self.total / steps


@flax.struct.dataclass
class Time(clu_metrics.Metric):
    """A wall-clock duration, set on the host with ``replace_duration``.

    Clocks read inside a compiled function see compile time, not run time, which is
    why the duration never comes from the step function itself.
    """

    duration: Scalar | None = None

    def merge(self, other: Time) -> Time:
        return self

    def compute(self) -> Scalar:
        if self.duration is None:
            raise ValueError(
                f"{type(self).__name__}.duration is unset: call replace_duration(seconds) before compute()"
            )
        return self.duration

    def replace_duration(self, duration: Scalar) -> Time:
        if _is_traced(duration) or _is_traced(self):
            raise ValueError(
                f"{type(self).__name__}.replace_duration was called inside a traced (jit) function: "
                "the duration is only known on the host, set it after the compiled step returns"
            )
        return self.replace(duration=duration)


@flax.struct.dataclass
class TimeRate(Time):
    """A value per second: ``numerator / duration``."""

    numerator: Scalar | None = None

    @classmethod
    def from_model_output(cls, numerator: Scalar, **_: Any) -> TimeRate:
        return cls(numerator=numerator)

    def merge(self, other: TimeRate) -> TimeRate:
        if self.duration is not None or other.duration is not None:
            raise ValueError("TimeRate: merge the numerators first, then set the duration once on the result")
        return type(self)(numerator=self.numerator + other.numerator)  # type: ignore[operator]

    def compute(self) -> Scalar:
        duration = Time.compute(self)
        return self.numerator / duration  # type: ignore[operator]


@flax.struct.dataclass
class StepsPerTime(Step, Time):
    """Steps per second: the host sets both the step count and the duration."""

    @classmethod
    def from_model_output(cls, steps: int | None = 1, **_: Any) -> StepsPerTime:
        return cls(steps=steps)

    def merge(self, other: StepsPerTime) -> StepsPerTime:
        _check_same_type(self, other)
        return type(self)(steps=self.steps + other.steps)  # type: ignore[operator]

    def compute(self) -> Scalar:
        return Step.compute(self) / Time.compute(self)


def _check_same_type(metric: clu_metrics.Metric, other: clu_metrics.Metric) -> None:
    if type(metric) is not type(other):
        raise TypeError(f"cannot merge {type(metric).__name__} with {type(other).__name__}")


def is_metric_obj(obj: Any) -> bool:
    return isinstance(obj, clu_metrics.Metric)


def is_time_metric(obj: Any) -> bool:
    return isinstance(obj, Time)


def create_metrics_dict(float_metrics_dict: Mapping[str, Scalar]) -> dict[str, Sum]:
    """Wraps each plain number in a ``Sum``, so it merges like any other metric."""
    return {name: Sum(value) for name, value in float_metrics_dict.items()}


def shape_obj_to_defined_obj(obj: clu_metrics.Metric) -> clu_metrics.Metric:
    """The same metric with every shaped field (e.g. a ``jax.ShapeDtypeStruct``) replaced by zeros.

    Useful after ``jax.eval_shape`` of a step: it gives a neutral starting metric to
    accumulate into. Fields without a shape (``None``, Python numbers) are kept.
    """

    def zeros_like(value: Any) -> Any:
        if isinstance(value, clu_metrics.Metric):
            return shape_obj_to_defined_obj(value)
        if hasattr(value, "shape") and hasattr(value, "dtype"):
            return jnp.zeros(value.shape, value.dtype)
        return value

    fields = {field.name: zeros_like(getattr(obj, field.name)) for field in dataclasses.fields(obj)}
    return type(obj)(**fields)


def _replace_in_tree(metrics: Any, kind: type, replace: Callable[[Any], Any]) -> Any:
    return jax.tree.map(
        lambda node: replace(node) if isinstance(node, kind) else node,
        metrics,
        is_leaf=is_metric_obj,
    )


def set_time_metrics_duration(metrics: Any, duration: Scalar) -> Any:
    """Sets ``duration`` on every ``Time`` metric of a pytree (other leaves pass through)."""
    return _replace_in_tree(metrics, Time, lambda metric: metric.replace_duration(duration))


def set_step_metrics_num_steps(metrics: Any, num_steps: int) -> Any:
    """Sets the step count on every ``Step`` metric of a pytree (other leaves pass through)."""
    return _replace_in_tree(metrics, Step, lambda metric: metric.replace_steps(num_steps))


__all__ = [
    "AveragePerStep",
    "MetricsMap",
    "Scalar",
    "Step",
    "StepsPerTime",
    "Sum",
    "Time",
    "TimeRate",
    "create_metrics_dict",
    "is_metric_obj",
    "is_time_metric",
    "set_step_metrics_num_steps",
    "set_time_metrics_duration",
    "shape_obj_to_defined_obj",
]
