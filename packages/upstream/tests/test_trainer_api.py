"""t5x.trainer: upstream's Trainer object (train / eval loops), step functions, MetricsManager, actions."""

import glob
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("clu")

import clu.metrics
import clu.values

from t5x import metrics as metrics_lib
from t5x import optimizers, partitioning, test_utils, trainer
from t5x import train_state as train_state_lib

LENGTH = 8


def _batch(rows: int = 4, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    targets = rng.integers(3, 120, size=(rows, LENGTH)).astype(np.int32)
    decoder_inputs = np.concatenate([np.zeros((rows, 1), np.int32), targets[:, :-1]], axis=1)
    return {
        "encoder_input_tokens": rng.integers(3, 120, size=(rows, LENGTH)).astype(np.int32),
        "decoder_input_tokens": decoder_inputs,
        "decoder_target_tokens": targets,
        "decoder_loss_weights": np.ones((rows, LENGTH), np.float32),
    }


@pytest.fixture(scope="module")
def t5_model():
    return test_utils.get_t5_test_model(vocab_size=128, dtype="float32")


def _t5_state(model):
    shapes = {k: v.shape for k, v in _batch().items()}
    variables = model.get_initial_variables(jax.random.PRNGKey(0), shapes)
    return train_state_lib.FlaxOptimTrainState.create(model.optimizer_def, variables)


def _replicated(state):
    return jax.tree.map(lambda _: None, state)


def _t5_trainer(model, state, summary_dir=None, eval_names=(), **kwargs):
    kwargs.setdefault("learning_rate_fn", lambda step: 0.05)
    kwargs.setdefault("num_microbatches", None)
    return trainer.Trainer(
        model,
        state,
        partitioning.PjitPartitioner(num_partitions=1),
        eval_names=list(eval_names),
        summary_dir=summary_dir,
        train_state_axes=_replicated(state),
        rng=jax.random.PRNGKey(3),
        **kwargs,
    )


def _events(folder):
    import tensorflow as tf

    (path,) = glob.glob(os.path.join(folder, "events.out.tfevents.*"))
    found = {}
    for event in tf.compat.v1.train.summary_iterator(path):
        for value in event.summary.value:
            tensor = value.tensor
            if value.WhichOneof("value") == "simple_value":  # t5x.training's writer (no clu)
                found[value.tag] = (event.step, value.simple_value)
            elif tensor.string_val:
                found[value.tag] = (event.step, tensor.string_val[0].decode())
            else:
                found[value.tag] = (event.step, float(tf.make_ndarray(tensor)))
    return found


def test_train_lowers_the_loss_of_a_tiny_t5(t5_model, tmp_path):
    batch = _batch()
    with _t5_trainer(t5_model, _t5_state(t5_model), summary_dir=str(tmp_path)) as t:
        losses = [t.train(iter([batch] * 2), 2).result()["loss"].value for _ in range(4)]
        assert int(t.train_state.step) == 8
        t.train_metrics_manager.flush()
        summary = t.train(iter([batch]), 1).result()
    assert losses[-1] < 0.8 * losses[0], losses
    assert summary["learning_rate"].value == pytest.approx(0.05)
    assert summary["timing/uptime"].value > 0
    assert 0.0 <= summary["accuracy"].value <= 1.0
    t.train_metrics_manager.flush()
    events = _events(tmp_path / "train")
    assert events["loss"][0] == 9 and events["loss"][1] == pytest.approx(float(summary["loss"].value))


def test_microbatched_gradients_equal_the_whole_batch_gradients(t5_model):
    state = _t5_state(t5_model)
    batch = {k: jnp.asarray(v) for k, v in _batch(rows=4, seed=1).items()}
    rng = jax.random.PRNGKey(0)
    whole, whole_metrics, mutables = trainer.accumulate_grads_microbatched(t5_model, state, batch, rng, None)
    split, split_metrics, _ = trainer.accumulate_grads_microbatched(t5_model, state, batch, rng, 2)
    assert mutables is None
    for got, want in zip(jax.tree.leaves(split), jax.tree.leaves(whole), strict=True):
        np.testing.assert_allclose(got, want, rtol=2e-4, atol=1e-6)
    for name in ("loss", "num_target_tokens"):  # totals add up over microbatches
        np.testing.assert_allclose(split_metrics[name].total, whole_metrics[name].total, rtol=1e-5)
    assert isinstance(whole_metrics["accuracy"], clu.metrics.Average)
    with pytest.raises(ValueError, match="not divisible"):
        trainer.accumulate_grads_microbatched(t5_model, state, batch, rng, 3)


class _DrawModel:
    """loss = (one uniform draw from the dropout key) * sum(w): its gradient is the draw."""

    def loss_fn(self, params, batch, rng):
        draw = jax.random.uniform(rng)
        return draw * jnp.sum(params["w"]), {"loss": draw}


def test_each_microbatch_draws_from_its_own_dropout_key():
    # Upstream gives every microbatch one key; here microbatch i uses fold_in(key, i)
    # (docs/differences.md), so its dropout masks are independent of the others'.
    state = train_state_lib.FlaxOptimTrainState(
        optimizers.Optimizer(
            optimizers.sgd(0.1),
            state=optimizers.OptimizerState(step=0, param_states={"w": 0}),
            target={"w": jnp.zeros(2)},
        )
    )
    key = jax.random.PRNGKey(5)
    grads, metrics, _ = trainer.accumulate_grads_microbatched(
        _DrawModel(), state, {"x": jnp.zeros((4, 1))}, key, 2
    )
    draws = [float(jax.random.uniform(jax.random.fold_in(key, i))) for i in range(2)]
    assert draws[0] != draws[1]
    np.testing.assert_allclose(grads["w"], [sum(draws)] * 2, rtol=1e-6)
    np.testing.assert_allclose(metrics["loss"].total, sum(draws), rtol=1e-6)


def test_eval_summarises_each_dataset_and_writes_its_events(t5_model, tmp_path):
    state = _t5_state(t5_model)
    batch = _batch(seed=2)
    expected_loss, _ = t5_model.eval_fn(state.params, batch)
    with _t5_trainer(t5_model, state, summary_dir=str(tmp_path), eval_names=["held_out"]) as t:
        t.compile_eval({"held_out": batch})
        results = t.eval({"held_out": iter([batch, batch])})
        t.eval_metrics_managers["held_out"].flush()
    # Two identical batches: the per-step average is one batch's loss.
    assert results["held_out"]["loss"].value == pytest.approx(float(expected_loss), rel=1e-5)
    events = _events(tmp_path / "training_eval" / "held_out")
    assert events["timing/compilation_seconds"][0] == 0
    assert events["loss"] == (0, pytest.approx(float(expected_loss), rel=1e-5))


class _LinearModel:
    """loss = sum(w * x); reports the sum of the dropout key it was given."""

    def loss_fn(self, params, batch, dropout_rng):
        loss = jnp.sum(params["w"] * batch["x"])
        return loss, {
            "loss": loss,
            "rng_sum": metrics_lib.Sum(jnp.sum(jax.random.key_data(dropout_rng))),
        }

    def eval_fn(self, params, batch):
        loss = jnp.sum(params["w"] * batch["x"])
        return loss, {"loss": loss}


def _linear_trainer(step=0, weight_metrics_computer=None):
    # An Optax-wrapped optimizer keeps its own rate; learning_rate_fn is then only logged.
    optimizer = optimizers.sgd(0.5).create({"w": jnp.zeros(3, jnp.float32)})
    state = train_state_lib.FlaxOptimTrainState(optimizer).replace_step(jnp.asarray(step, jnp.int32))
    return trainer.Trainer(
        _LinearModel(),
        state,
        partitioning.PjitPartitioner(num_partitions=1),
        eval_names=[],
        summary_dir=None,
        train_state_axes=_replicated(state),
        rng=jax.random.PRNGKey(11),
        learning_rate_fn=lambda step: 0.5,
        num_microbatches=None,
        weight_metrics_computer=weight_metrics_computer,
    )


def test_each_step_trains_with_the_base_key_folded_with_its_step():
    with _linear_trainer(step=5) as t:
        summary = t.train(iter([{"x": np.ones((2, 3), np.float32)}] * 3), 3).result()
        expected = sum(
            np.sum(jax.random.key_data(jax.random.fold_in(jax.random.PRNGKey(11), s)), dtype=np.uint32)
            for s in (5, 6, 7)
        )
        np.testing.assert_array_equal(summary["rng_sum"].value, np.uint32(expected))
        # sgd at 0.5 on d(sum(w * x))/dw = 2 per element (two rows of ones), three times.
        np.testing.assert_allclose(t.train_state.params["w"], -3.0 * np.ones(3))
        assert int(t.train_state.step) == 8


def test_weight_metrics_computer_adds_per_parameter_summaries():
    with _linear_trainer(weight_metrics_computer=trainer.WeightMetricsComputer()) as t:
        summary = t.train(iter([{"x": np.ones((2, 3), np.float32)}]), 1).result()
    assert summary["weight_rms/w"].value == pytest.approx(1.0)  # w = -1 everywhere
    assert summary["weight_gradient_norm"].value == pytest.approx(np.sqrt(12.0))
    assert summary["weight_max/w"].value == pytest.approx(1.0)


def test_metrics_manager_writes_events_only_on_process_zero(tmp_path, monkeypatch):
    monkeypatch.setattr(jax, "process_index", lambda: 1)
    other = trainer.MetricsManager("eval", str(tmp_path))
    other.write_scalar("loss", 1.0, 3)
    other.flush()
    other.close()
    assert other.summary_dir == str(tmp_path / "eval")
    assert not os.path.exists(other.summary_dir)

    monkeypatch.setattr(jax, "process_index", lambda: 0)
    mm = trainer.MetricsManager("eval", str(tmp_path))
    mm.write_scalar("loss", 1.0, 3)
    mm.start_duration_timer()
    summary = mm.write_metrics_summary(
        {
            "total": metrics_lib.Sum(6.0),
            "mean": metrics_lib.AveragePerStep.from_model_output(6.0),
            "rate": metrics_lib.StepsPerTime(),
        },
        step=4,
        num_steps=3,
    ).result()
    mm.flush()
    mm.close()
    assert summary["total"] == clu.values.Scalar(6.0) and summary["mean"].value == pytest.approx(2.0)
    assert summary["rate"].value > 0
    events = _events(mm.summary_dir)
    assert events["loss"] == (3, 1.0) and events["mean"] == (4, pytest.approx(2.0))


def test_metrics_manager_needs_a_started_timer():
    mm = trainer.MetricsManager("train")
    with pytest.raises(ValueError, match="start_duration_timer"):
        mm.write_metrics_summary({}, 0, 1)
    mm.close()


def test_a_settings_only_trainer_refuses_to_train():
    settings = trainer.Trainer(learning_rate_fn=abs, num_microbatches=4)
    assert settings.num_microbatches == 4 and settings.learning_rate_fn is abs
    with pytest.raises(RuntimeError, match="settings record"):
        settings.train(iter([]), 1)
    settings.close()


def test_early_stopping_follows_upstream_rule_on_scalars_and_floats():
    def stops(values, **kwargs):
        action = trainer.EarlyStoppingAction(("task", "m"), **kwargs)
        return [action.run(None, {"task": {"m": v}}) for v in values][-1]

    assert stops([clu.values.Scalar(1.0), clu.values.Scalar(1.0), clu.values.Scalar(1.0)], mode="min")
    assert stops([1.0, 0.9, 0.71], mode="min", atol=0.2)
    assert not stops([1.0, 0.8, 0.6], mode="min", atol=0.15)
    assert not stops([3, 2, 1], mode="min")  # ints are not metric values (upstream)
    assert stops([1.0, 1.5], mode="min", patience=1) and stops([1.0, float("nan")], mode="min", patience=1)
    missing = trainer.EarlyStoppingAction(("task", "m"), mode="max")
    assert not missing.run(None, {"other": {"m": 1.0}})


def test_terminate_on_nan_takes_clu_scalars_and_floats():
    action = trainer.TerminateOnNanAction(task="t")
    assert action.run(None, {"t": {"loss": clu.values.Scalar(np.inf)}})
    assert action.run(None, {"t": {"loss": float("nan")}})
    assert not action.run(None, {"t": {"loss": clu.values.Scalar(1.0)}})
    assert not action.run(None, {"t": {"other": float("nan")}}) and not action.run(None, {})
