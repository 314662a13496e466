"""t5x.optimizers: upstream's OptimizerDef / Optimizer API over Optax."""

import flax
import gin
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import traverse_util

from t5x import adafactor, optimizers

P = jax.sharding.PartitionSpec


def _params():
    return flax.core.freeze({"dense": {"kernel": jnp.arange(6.0).reshape(3, 2) / 10, "bias": jnp.ones(2)}})


def _grads(params):
    return jax.tree.map(lambda p: 0.5 * p + 0.1, params)


AXES = flax.core.freeze({"dense": {"kernel": P("embed", "mlp"), "bias": P("mlp")}})


def test_optax_wrapper_steps_as_optax_does_and_counts_steps():
    params = _params()
    wrapped = optimizers.adam(0.1).create(params)
    tx = optax.adam(0.1)
    opt_state = tx.init(params)
    for _ in range(3):
        wrapped = wrapped.apply_gradient(_grads(wrapped.target))
        updates, opt_state = tx.update(_grads(params), opt_state, params)
        params = optax.apply_updates(params, updates)
    assert wrapped.state.step == 3
    jax.tree.map(np.testing.assert_allclose, wrapped.target, params)


def test_optax_wrapper_state_dict_drops_empty_states_and_round_trips():
    optimizer = optimizers.adamw(0.01, weight_decay=0.1).create(_params())
    optimizer = optimizer.apply_gradient(_grads(optimizer.target))
    state_dict = optimizer.state_dict()
    flat = traverse_util.flatten_dict(state_dict, sep="/")
    assert sorted(k for k in flat if k.startswith("state/")) == [
        "state/param_states/0/count",
        "state/param_states/0/mu/dense/bias",
        "state/param_states/0/mu/dense/kernel",
        "state/param_states/0/nu/dense/bias",
        "state/param_states/0/nu/dense/kernel",
        "state/step",
    ]
    fresh = optimizers.adamw(0.01, weight_decay=0.1).create(_params())
    restored = fresh.restore_state(state_dict)
    jax.tree.map(np.testing.assert_array_equal, restored.state.param_states, optimizer.state.param_states)
    assert restored.state.step == 1
    del state_dict["state"]["param_states"]["0"]["nu"]
    with pytest.raises(ValueError, match="0/nu"):
        fresh.restore_state(state_dict)


def test_optax_wrapper_logical_axes_follow_the_params():
    wrapper = optimizers.adamw(0.01)
    axes = wrapper.derive_logical_axes(wrapper.create(_params()), AXES)
    adam_axes = axes.state.param_states[0]
    assert adam_axes.count is None and adam_axes.mu == AXES and adam_axes.nu == AXES
    assert axes.state.step is None and axes.target == AXES


def test_multi_optimizer_updates_each_subset_with_its_optimizer_and_rejects_overlap():
    params = _params()
    kernels = traverse_util.ModelParamTraversal(lambda path, _: "kernel" in path)
    biases = traverse_util.ModelParamTraversal(lambda path, _: "bias" in path)
    multi = optimizers.MultiOptimizer([(kernels, adafactor.Adafactor(0.1, decay_rate=0.8))])
    optimizer = multi.create(params).apply_gradient(_grads(params))
    alone = adafactor.Adafactor(0.1, decay_rate=0.8).create({"kernel": params["dense"]["kernel"]})
    alone = alone.apply_gradient({"kernel": _grads(params)["dense"]["kernel"]})
    np.testing.assert_allclose(optimizer.target["dense"]["kernel"], alone.target["kernel"])
    # No optimizer picks the bias: unchanged, no state.
    np.testing.assert_array_equal(optimizer.target["dense"]["bias"], params["dense"]["bias"])
    assert optimizer.state.param_states["dense"]["bias"] is None and optimizer.state.step == 1
    axes = multi.derive_logical_axes(optimizer, AXES)
    # Too small to factor: the full second moment is laid out like the kernel.
    assert axes.state.param_states["dense"]["kernel"].v == P("embed", "mlp")
    everything = traverse_util.ModelParamTraversal(lambda path, _: True)
    with pytest.raises(ValueError, match="more than one optimizer"):
        optimizers.MultiOptimizer(
            [(everything, adafactor.Adafactor(0.1)), (biases, adafactor.Adafactor(0.1))]
        ).create(params)


def test_to_optax_gives_the_transformation_launch_trains_with():
    tx = optax.sgd(0.5)
    assert optimizers.to_optax(optimizers.OptaxWrapper(tx)) is tx
    assert optimizers.to_optax(tx) is tx and optimizers.to_optax(None) is None
    # Any other OptimizerDef runs through its own apply_gradient.
    params = _params()
    kernels = traverse_util.ModelParamTraversal(lambda path, _: "kernel" in path)
    multi = optimizers.MultiOptimizer([(kernels, adafactor.Adafactor(0.1, decay_rate=0.8))])
    adapter = optimizers.to_optax(multi)
    updates, state = adapter.update(_grads(params), adapter.init(params), params, learning_rate=0.2)
    want = multi.create(params).apply_gradient(_grads(params), learning_rate=0.2)
    jax.tree.map(np.testing.assert_allclose, optax.apply_updates(params, updates), want.target)
    assert int(state.step) == 1


def test_gin_binds_the_wrapped_optax_names():
    with gin.unlock_config():
        gin.parse_config(
            "from __gin__ import dynamic_registration\nfrom t5x import optimizers\n"
            "OPT = @optimizers.adamw()\noptimizers.adamw.learning_rate = 0.01\n"
            "optimizers.adamw.weight_decay = 0.5\n"
        )
        try:
            opt_def = gin.query_parameter("%OPT").scoped_configurable_fn()
        finally:
            gin.clear_config()
    assert isinstance(opt_def, optimizers.OptaxWrapper)
    params = {"w": jnp.ones(2)}
    optimizer = opt_def.create(params).apply_gradient({"w": jnp.zeros(2)})
    # adamw's decoupled weight decay alone: w - lr * wd * w.
    np.testing.assert_allclose(optimizer.target["w"], 1 - 0.01 * 0.5)
