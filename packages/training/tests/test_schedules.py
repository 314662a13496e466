"""Learning-rate factor strings against their formulas."""

import math

import numpy as np
import optax
import pytest

from t5x.training import as_schedule, create_learning_rate_scheduler

STEPS = [0, 1, 50, 100, 101, 1000, 25_000]


def _check(schedule, formula):
    for step in STEPS:
        assert float(schedule(step)) == pytest.approx(max(formula(step), 1e-8), rel=2e-5), step


def test_t5_default_warmup_and_rsqrt_decay():
    schedule = create_learning_rate_scheduler("constant * linear_warmup * rsqrt_decay", 0.5, warmup_steps=100)
    _check(schedule, lambda s: 0.5 * min(1.0, s / 100) / math.sqrt(max(s, 100)))


def test_rsqrt_normalized_decay_and_decay_every():
    _check(
        create_learning_rate_scheduler("constant * rsqrt_normalized_decay", 2.0, warmup_steps=100),
        lambda s: 2.0 * math.sqrt(100) / math.sqrt(max(s, 100)),
    )
    _check(
        create_learning_rate_scheduler("constant * decay_every", 1.0, decay_factor=0.5, steps_per_decay=50),
        lambda s: 0.5 ** (s // 50),
    )


def test_cosine_and_linear_decay():
    _check(
        create_learning_rate_scheduler(
            "constant * cosine_decay", 1.0, warmup_steps=100, steps_per_cycle=1000
        ),
        lambda s: max(0.0, 0.5 * (1 + math.cos(math.pi * (max(0.0, (s - 100) / 1000) % 1.0)))),
    )
    _check(
        create_learning_rate_scheduler("linear_decay", 0.1, warmup_steps=100, decay_factor=0.001),
        lambda s: 0.1 * min(s / 100, 1.0 + 0.001 * (100 - s)),
    )


def test_step_offset_minimum_and_errors():
    schedule = create_learning_rate_scheduler(
        "constant * linear_warmup", 1.0, warmup_steps=10, step_offset=100
    )
    assert float(schedule(50)) == pytest.approx(1e-8)  # before the offset: clamped to the minimum
    assert float(schedule(105)) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="'cosine'"):
        create_learning_rate_scheduler("constant * cosine")


def test_optax_schedules_and_floats():
    cosine = optax.cosine_decay_schedule(1.0, decay_steps=100)
    assert as_schedule(cosine) is cosine
    np.testing.assert_allclose(float(as_schedule(0.25)(123)), 0.25)
