"""Learning-rate schedules: upstream's factor strings, and any Optax schedule."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax.numpy as jnp

Schedule = Callable[[Any], Any]

_FACTORS = (
    "constant",
    "linear_warmup",
    "linear_decay",
    "rsqrt_decay",
    "rsqrt_normalized_decay",
    "decay_every",
    "cosine_decay",
)


def create_learning_rate_scheduler(
    factors: str = "constant * linear_warmup * rsqrt_decay",
    base_learning_rate: float = 0.5,
    warmup_steps: int = 1000,
    decay_factor: float = 0.5,
    steps_per_decay: int = 20000,
    steps_per_cycle: int = 100000,
    step_offset: int = 0,
    min_learning_rate: float = 1e-8,
) -> Schedule:
    """Builds a schedule from '*'-separated factors, as upstream t5x does.

    Factors: ``constant`` (``base_learning_rate``); ``linear_warmup``
    (``min(1, step / warmup_steps)``); ``linear_decay`` (``base_learning_rate *
    min(step / warmup_steps, 1 + decay_factor * (warmup_steps - step))``, which
    implies constant and warm-up); ``rsqrt_decay`` (``1 / sqrt(max(step,
    warmup_steps))``); ``rsqrt_normalized_decay`` (``sqrt(warmup_steps) /
    sqrt(max(step, warmup_steps))``); ``decay_every`` (``decay_factor **
    (step // steps_per_decay)``); ``cosine_decay`` (cyclic cosine over
    ``steps_per_cycle`` after warm-up).

    Args:
      factors: e.g. ``"constant * linear_warmup * rsqrt_decay"``.
      base_learning_rate: the value of ``constant``.
      warmup_steps: warm-up length.
      decay_factor: multiplier of ``decay_every``, slope of ``linear_decay``.
      steps_per_decay: period of ``decay_every``.
      steps_per_cycle: period of ``cosine_decay``.
      step_offset: steps before this count as step 0.
      min_learning_rate: lower bound of the result.

    Returns:
      ``schedule(step) -> float32 scalar``, usable under ``jit``.

    Raises:
      ValueError: an unknown factor name.
    """
    names = [name.strip() for name in factors.split("*")]
    unknown = [name for name in names if name not in _FACTORS]
    if unknown:
        raise ValueError(f"unknown learning-rate factor(s) {unknown} in {factors!r}; known: {list(_FACTORS)}")

    def schedule(step: Any) -> Any:
        step = jnp.maximum(0, jnp.asarray(step) - step_offset)
        value: Any = 1.0
        for name in names:
            if name == "constant":
                value = value * base_learning_rate
            elif name == "linear_warmup":
                value = value * jnp.minimum(1.0, step / warmup_steps)
            elif name == "linear_decay":
                value = (
                    value
                    * base_learning_rate
                    * jnp.minimum(step / warmup_steps, 1.0 + decay_factor * (warmup_steps - step))
                )
            elif name == "rsqrt_decay":
                value = value / jnp.sqrt(jnp.maximum(step, warmup_steps))
            elif name == "rsqrt_normalized_decay":
                value = value * jnp.sqrt(warmup_steps) / jnp.sqrt(jnp.maximum(step, warmup_steps))
            elif name == "decay_every":
                value = value * decay_factor ** (step // steps_per_decay)
            elif name == "cosine_decay":
                progress = jnp.maximum(0.0, (step - warmup_steps) / float(steps_per_cycle))
                value = value * jnp.maximum(0.0, 0.5 * (1.0 + jnp.cos(jnp.pi * (progress % 1.0))))
        return jnp.asarray(jnp.maximum(value, min_learning_rate), jnp.float32)

    return schedule


def as_schedule(learning_rate: float | Schedule) -> Schedule:
    """Turns a float or any step -> value callable (Optax schedules) into a schedule."""
    if callable(learning_rate):
        return learning_rate
    value = float(learning_rate)
    return lambda step: jnp.asarray(value, jnp.float32)
