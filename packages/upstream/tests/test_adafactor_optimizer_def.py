"""t5x.adafactor.Adafactor: upstream's OptimizerDef, computing t5x.training.adafactor's updates."""

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from t5x import adafactor, optimizers, training

P = jax.sharding.PartitionSpec
OPTIONS = dict(
    decay_rate=0.8, min_dim_size_to_factor=4, beta1=0.9, weight_decay_rate=1e-3, clipping_threshold=1.0
)


def _params():
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    return {
        "wide": jax.random.normal(keys[0], (6, 8)),  # factored
        "small": jax.random.normal(keys[1], (3, 2)),  # too small to factor
        "bias": jax.random.normal(keys[2], (8,)),
    }


def _grads(params, step):
    return jax.tree.map(lambda p: jnp.sin(p * (step + 1)), params)


def test_optimizer_def_steps_equal_the_optax_transformation_over_several_steps():
    params = _params()
    optimizer = adafactor.Adafactor(**OPTIONS).create(params)
    tx = training.adafactor(**OPTIONS)
    tx_state, tx_params = tx.init(params), params
    for step in range(4):
        learning_rate = 0.1 / (step + 1)
        optimizer = optimizer.apply_gradient(_grads(optimizer.target, step), learning_rate=learning_rate)
        updates, tx_state = tx.update(
            _grads(tx_params, step), tx_state, tx_params, learning_rate=learning_rate
        )
        tx_params = optax.apply_updates(tx_params, updates)
    assert int(optimizer.state.step) == 4
    for name in params:
        np.testing.assert_allclose(optimizer.target[name], tx_params[name], rtol=1e-6, atol=1e-7)
        for slot in ("v_row", "v_col", "v", "m"):
            np.testing.assert_allclose(
                getattr(optimizer.state.param_states[name], slot),
                getattr(tx_state.param_states[name], slot),
                rtol=1e-6,
            )
    # The form t5x-launch trains with is that same transformation.
    launch_tx = optimizers.to_optax(adafactor.Adafactor(**OPTIONS))
    assert isinstance(launch_tx, training.Adafactor)
    assert launch_tx.options["decay_rate"] == 0.8 and launch_tx.options["beta1"] == 0.9


def test_slots_follow_upstreams_layout_and_state_dict_round_trips():
    params = _params()
    optimizer = adafactor.Adafactor(0.1, **OPTIONS).create(params)
    wide = optimizer.state.param_states["wide"]
    assert (wide.v_row.shape, wide.v_col.shape, wide.v.shape, wide.m.shape) == ((6,), (8,), (1,), (6, 8))
    assert optimizer.state.param_states["small"].v.shape == (3, 2)
    optimizer = optimizer.apply_gradient(_grads(params, 0))
    state_dict = optimizer.state_dict()
    assert sorted(state_dict["state"]["param_states"]["wide"]) == ["m", "v", "v_col", "v_row"]
    fresh = adafactor.Adafactor(0.1, **OPTIONS).create(params)
    restored = fresh.restore_state(state_dict)
    assert int(restored.state.step) == 1
    jax.tree.map(np.testing.assert_array_equal, restored.state.param_states, optimizer.state.param_states)


def test_logical_axes_and_factor_rules_from_axes():
    params = flax.core.freeze({"kernel": jnp.ones((8, 6)), "stacked": jnp.ones((2, 8, 6))})
    axes = flax.core.freeze({"kernel": P("embed", "mlp"), "stacked": P("layers", "embed", "mlp")})
    opt_def = adafactor.Adafactor(
        0.1,
        beta1=0.9,
        min_dim_size_to_factor=4,
        logical_factor_rules=adafactor.standard_logical_factor_rules(),
    )
    opt_def.set_param_axes(axes)
    F = adafactor.FactorDim
    assert opt_def.hyper_params.factor_map["stacked"] == (F.BATCH, F.ROW, F.COLUMN)
    optimizer = opt_def.create(params)
    # Scanned layers keep their batch dim in both factors.
    assert optimizer.state.param_states["stacked"].v_row.shape == (2, 8)
    assert optimizer.state.param_states["stacked"].v_col.shape == (2, 6)
    logical = opt_def.derive_logical_axes(optimizer, axes)
    kernel = logical.state.param_states["kernel"]
    assert kernel.m == P("embed", "mlp") and kernel.v is None and kernel.v_row is None
    assert logical.target == axes and logical.state.step is None


def test_bad_arguments_name_the_keyword():
    with pytest.raises(TypeError, match="factor_map"):
        adafactor.Adafactor(factor_map={"a": None})
    with pytest.raises(ValueError, match="factored=False"):
        adafactor.Adafactor(factored=False, factor_map=adafactor.HParamMap([(".*", None)]))
    with pytest.raises(ValueError, match="no learning rate"):
        adafactor.Adafactor().create({"w": jnp.ones(2)}).apply_gradient({"w": jnp.ones(2)})
    with pytest.raises(ValueError, match="rank > 2"):
        adafactor.Adafactor(0.1).create({"w": jnp.ones((2, 3, 4))})
