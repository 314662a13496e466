"""t5x.metrics: upstream's CLU metric records, their merges and the host-side setters."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t5x import metrics


@pytest.mark.parametrize(
    ("values", "total"),
    [(4.0, 4.0), ([1, 2, 3], 6.0), ([[1, 2], [3, 4]], 10.0)],
)
def test_sum_adds_every_element(values, total):
    assert float(metrics.Sum.from_model_output(values).compute()) == total


def test_sum_merges_by_adding():
    merged = metrics.Sum.from_model_output([1, 2]).merge(metrics.Sum.from_model_output(5))
    assert float(merged.compute()) == 8.0


def test_average_per_step_divides_by_the_steps_the_host_sets():
    metric = metrics.AveragePerStep.from_model_output([2.0, 4.0])
    merged = metric.merge(metrics.AveragePerStep.from_model_output([6.0]))
    assert merged.steps == 2
    assert float(merged.compute()) == 6.0
    fixed = metrics.set_step_metrics_num_steps({"loss": merged}, 4)
    assert float(fixed["loss"].compute()) == 3.0


def test_step_without_a_count_says_how_to_set_it():
    with pytest.raises(ValueError, match="replace_steps"):
        metrics.AveragePerStep.from_model_output(1.0, steps=None).compute()


def test_merging_different_metric_kinds_is_refused():
    with pytest.raises(TypeError, match="AveragePerStep with StepsPerTime"):
        metrics.AveragePerStep.from_model_output(1.0).merge(metrics.StepsPerTime.from_model_output())


def test_time_needs_a_duration_before_compute():
    with pytest.raises(ValueError, match="replace_duration"):
        metrics.Time().compute()
    assert metrics.Time().replace_duration(1.5).compute() == 1.5


def test_time_rate_is_numerator_per_second_and_merges_numerators():
    rate = metrics.TimeRate.from_model_output(np.array(6.0)).merge(
        metrics.TimeRate.from_model_output(np.array(2.0))
    )
    assert float(rate.replace_duration(4.0).compute()) == 2.0
    with pytest.raises(ValueError, match="merge the numerators first"):
        rate.replace_duration(1.0).merge(rate)


def test_duration_cannot_be_set_inside_jit():
    @jax.jit
    def step():
        return metrics.TimeRate.from_model_output(jnp.ones(())).replace_duration(2.0)

    with pytest.raises(ValueError, match="inside a traced"):
        step()


def test_steps_per_time_uses_both_host_values():
    metric = metrics.StepsPerTime.from_model_output(steps=3).merge(
        metrics.StepsPerTime.from_model_output(steps=1)
    )
    tree = metrics.set_time_metrics_duration({"rate": metric, "loss": metrics.Sum(1.0)}, 2.0)
    tree = metrics.set_step_metrics_num_steps(tree, 10)
    assert tree["rate"].compute() == 5.0
    # Metrics of other kinds pass through both setters unchanged.
    assert tree["loss"].compute() == 1.0


def test_create_metrics_dict_wraps_numbers_in_sums():
    created = metrics.create_metrics_dict({"a": 1.0, "b": 2.5})
    assert all(isinstance(metric, metrics.Sum) for metric in created.values())
    assert {name: metric.compute() for name, metric in created.items()} == {"a": 1.0, "b": 2.5}


def test_shape_obj_to_defined_obj_gives_zeros_of_the_traced_shapes():
    shapes = jax.eval_shape(lambda: metrics.AveragePerStep.from_model_output(jnp.ones((2, 3), jnp.bfloat16)))
    zeros = metrics.shape_obj_to_defined_obj(shapes)
    assert isinstance(zeros, metrics.AveragePerStep)
    assert zeros.total.dtype == jnp.bfloat16
    assert zeros.total.shape == ()
    assert float(zeros.total) == 0.0
    # eval_shape traces the Python int step count too: it comes back as a zero of its dtype.
    assert int(zeros.steps) == 0


def test_type_predicates():
    assert metrics.is_metric_obj(metrics.Sum(1.0))
    assert not metrics.is_metric_obj(1.0)
    assert metrics.is_time_metric(metrics.StepsPerTime())
    assert not metrics.is_time_metric(metrics.Sum(1.0))
