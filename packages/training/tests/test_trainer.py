"""TrainState, Trainer and accumulation on the tiny test model."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from training_doubles import ArrayIterator, LocalPartitioner, TinyModel, make_data

from t5x.interfaces.testing import check_model
from t5x.training import (
    Trainer,
    TrainState,
    adafactor,
    adamw,
    create_learning_rate_scheduler,
    init_train_state,
    lion,
    multi_transform,
    sgd,
)

SHAPES = {"inputs": (8, 8), "targets": (8, 8)}
TYPES = {"inputs": jnp.int32, "targets": jnp.int32}


def make_trainer(optimizer=None, num_microbatches=None, seed=0, lr=0.1, model=None):
    model = model or TinyModel()
    partitioner = LocalPartitioner()
    init = init_train_state(model, optimizer or adafactor(), partitioner, SHAPES, TYPES, seed=seed)
    return Trainer(
        model,
        partitioner,
        init.state,
        init.shardings,
        learning_rate_fn=create_learning_rate_scheduler("constant", base_learning_rate=lr),
        num_microbatches=num_microbatches,
        seed=seed,
        peak_flops=1e9,
    )


def test_tiny_model_meets_model_contract():
    model = TinyModel()
    params = model.get_initial_variables(jax.random.PRNGKey(0), SHAPES)["params"]
    check_model(model, params, make_data(4))


def test_training_drives_loss_below_threshold():
    trainer = make_trainer(lr=0.1)
    data = ArrayIterator(make_data(256), batch_size=8)
    first = float(trainer.train_step(next(data))["loss"])
    for _ in range(100):
        metrics = trainer.train_step(next(data))
    eval_loss = float(trainer.eval_step(make_data(64, seed=9))["loss"]) / 64  # per sequence
    # The loss sums over the 64 tokens of a batch; chance is 8 * log(16) = 22.2 nats per sequence.
    assert first > 100
    assert eval_loss < 0.5, eval_loss
    assert float(metrics["accuracy"]) > 0.9
    assert {"loss", "z_loss", "accuracy", "grad_norm", "learning_rate"} <= set(metrics)
    assert int(trainer.state.step) == 101


def test_gradient_accumulation_matches_full_batch():
    model = TinyModel(dropout_rate=0.0)
    full = make_trainer(optimizer=sgd(), model=model)
    accumulated = make_trainer(optimizer=sgd(), num_microbatches=4, model=model)
    batch = make_data(8, seed=3)
    m_full = full.train_step(batch)
    m_acc = accumulated.train_step(batch)
    for a, b in zip(
        jax.tree.leaves(full.state.params), jax.tree.leaves(accumulated.state.params), strict=True
    ):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(float(m_full["loss"]), float(m_acc["loss"]), rtol=1e-5)
    np.testing.assert_allclose(float(m_full["grad_norm"]), float(m_acc["grad_norm"]), rtol=1e-5)
    np.testing.assert_allclose(float(m_full["accuracy"]), float(m_acc["accuracy"]), rtol=1e-5)


def test_step_rng_depends_on_seed_and_step_only():
    batch = make_data(8, seed=4)
    a, c = make_trainer(), make_trainer(seed=1)
    saved = jax.tree.map(jnp.copy, a.state)
    first = [float(a.train_step(batch)["loss"]) for _ in range(2)]
    a.state = jax.tree.map(jnp.copy, saved)
    assert [float(a.train_step(batch)["loss"]) for _ in range(2)] == first
    c.state = dataclasses.replace(jax.tree.map(jnp.copy, saved), optimizer=c.state.optimizer)
    assert float(c.train_step(batch)["loss"]) != first[0]  # another seed draws other dropout masks


def test_train_state_uses_partitioned_shapes_and_t5x_layout():
    trainer = make_trainer()
    sd = trainer.state.state_dict()
    assert set(sd["state"]) == {"step", "param_states"}
    assert set(sd["state"]["param_states"]["out"]["kernel"]) == {"v_row", "v_col", "v", "m"}
    assert trainer.state.params["out"]["kernel"].sharding.spec == jax.sharding.PartitionSpec(None, None)


@pytest.mark.parametrize(
    "make_opt", [lambda: adamw(weight_decay=0.01), lambda: lion(), lambda: optax.adam(1e-2)]
)
def test_optax_optimizers_round_trip_through_state_dict(make_opt):
    trainer = make_trainer(optimizer=make_opt(), lr=1e-2)
    batch = make_data(8)
    trainer.train_step(batch)
    sd = jax.device_get(trainer.state.state_dict())
    restored = TrainState.from_state_dict(sd, make_opt())
    for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(trainer.state), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert all(np.size(v) for v in jax.tree.leaves(sd["state"]["param_states"]))
    # Continuing from the restored state repeats the original's next step exactly.
    want = float(trainer.train_step(batch)["loss"])
    want_params = jax.tree.map(np.asarray, trainer.state.params)
    trainer.state = trainer.state.restore_state(sd)
    assert float(trainer.train_step(batch)["loss"]) == want
    for a, b in zip(jax.tree.leaves(trainer.state.params), jax.tree.leaves(want_params), strict=True):
        np.testing.assert_array_equal(np.asarray(a), b)


def test_different_optimizers_for_parameter_subsets():
    labels = {"embed": {"embedding": "frozen"}, "out": {"kernel": "ada", "bias": "ada"}}
    opt = multi_transform({"ada": adafactor(), "frozen": optax.set_to_zero()}, labels)
    trainer = make_trainer(optimizer=opt)
    before = jax.tree.map(np.asarray, trainer.state.params)
    trainer.train_step(make_data(8))
    after = trainer.state.params
    np.testing.assert_array_equal(before["embed"]["embedding"], np.asarray(after["embed"]["embedding"]))
    assert not np.array_equal(before["out"]["kernel"], np.asarray(after["out"]["kernel"]))
    sd = trainer.state.state_dict()
    restored = TrainState.from_state_dict(jax.device_get(sd), opt)
    assert jax.tree.structure(restored.opt_state) == jax.tree.structure(trainer.state.opt_state)


def test_throughput_metrics_and_mfu():
    trainer = make_trainer()
    m = trainer.throughput_metrics({"inputs": (8, 8), "targets": (8, 8)}, steps=10, seconds=2.0)
    assert m["timing/steps_per_second"] == 5.0
    assert m["timing/sequences_per_second"] == 40.0
    assert m["timing/tokens_per_second"] == 320.0  # largest 2-D feature: 8 x 8 per step
    assert m["timing/mfu"] == pytest.approx(320.0 * 6 * 32 * 16 / 1e9)
