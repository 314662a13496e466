"""t5x.train_state: upstream's FlaxOptimTrainState and InferenceState."""

import flax
import jax
import numpy as np
import pytest
from flax.linen.partitioning import AxisMetadata

from t5x import adafactor, optimizers, partitioning
from t5x import train_state as train_state_lib

P = jax.sharding.PartitionSpec
RULES = {"vocab": adafactor.FactorDim.COLUMN, "embed": adafactor.FactorDim.ROW}


def _variables(**extra):
    return flax.core.freeze(
        {
            "params": {"dense": {"bias": np.zeros(4), "kernel": np.zeros((2, 4))}},
            "params_axes": {
                "dense": {
                    "bias_axes": AxisMetadata(names=("embed",)),
                    "kernel_axes": AxisMetadata(names=("vocab", "embed")),
                }
            },
            **extra,
        }
    )


def test_create_splits_collections_and_gives_adafactor_the_axes():
    variables = _variables(
        cache={"c": np.ones(3)}, cache_axes={"c": AxisMetadata(names=("embed",))}, other={"x": np.ones(2)}
    )
    opt_def = adafactor.Adafactor(0.1, logical_factor_rules=RULES)
    state = train_state_lib.FlaxOptimTrainState.create(opt_def, variables)
    assert state.step == 0 and isinstance(state, train_state_lib.TrainState)
    assert set(state.flax_mutables) == {"cache", "other"} and set(state.flax_mutables_axes) == {"cache"}
    # Half-factored (bias: ROW only) falls back to unfactored.
    assert opt_def.hyper_params.factor_map == {
        "dense/bias": (adafactor.FactorDim.NONE,),
        "dense/kernel": (adafactor.FactorDim.COLUMN, adafactor.FactorDim.ROW),
    }
    axes = state.as_logical_axes()
    assert axes.params == {"dense": {"bias": P("embed"), "kernel": P("vocab", "embed")}}
    assert axes.flax_mutables == {"cache": {"c": P("embed")}}
    kernel_slots = axes.param_states["dense"]["kernel"]
    assert kernel_slots.v == P("vocab", "embed") and kernel_slots.v_row is None and kernel_slots.m is None


def test_create_refuses_missing_or_incomplete_axes():
    no_axes = flax.core.freeze({"params": {"w": np.zeros(2)}})
    with pytest.raises(ValueError, match="not emitting them"):
        train_state_lib.FlaxOptimTrainState.create(adafactor.Adafactor(), no_axes)
    partial = flax.core.freeze(
        {
            "params": {"a": np.zeros(2), "b": np.zeros(2)},
            "params_axes": {"a_axes": AxisMetadata(names=("embed",))},
        }
    )
    with pytest.raises(ValueError, match="Missing axis names for parameters: {'b'}"):
        train_state_lib.InferenceState.create(partial)


def test_state_dict_round_trip_and_step_replacement():
    state = train_state_lib.FlaxOptimTrainState.create(
        optimizers.adam(0.1), flax.core.freeze({"params": {"w": np.ones(3)}, "stats": {"n": np.zeros(1)}})
    )
    state = state.apply_gradient(
        flax.core.freeze({"w": np.ones(3)}), learning_rate=0.1, flax_mutables=state.flax_mutables
    )
    state_dict = state.state_dict()
    assert state_dict["state"]["step"] == 1 and "flax_mutables" in state_dict
    restored = state.replace_step(5).restore_state(state_dict)
    assert restored.step == 1
    jax.tree.map(np.testing.assert_array_equal, restored.params, state.params)
    jax.tree.map(np.testing.assert_array_equal, restored.param_states, state.param_states)
    assert state.replace_step(np.array(7)).step == 7
    replaced = state.replace_params({"w": np.zeros(3)})
    np.testing.assert_array_equal(replaced.params["w"], np.zeros(3))


def test_inference_state_has_no_optimizer():
    state = train_state_lib.InferenceState.create(_variables(stats={"n": np.ones(1)}))
    assert state.state_dict()["state"] == {"step": 0}
    with pytest.raises(NotImplementedError):
        state.apply_gradient({}, learning_rate=0.1)
    with pytest.raises(NotImplementedError):
        _ = state.param_states
    restored = state.restore_state({"state": {"step": 3}, "target": {"w": np.ones(1)}})
    assert restored.step == 3 and restored.flax_mutables == train_state_lib.EMPTY_DICT
    axes = state.as_logical_axes()
    assert axes.step is None and axes.params["dense"]["kernel"] == P("vocab", "embed")


def test_partitioner_maps_a_train_state_through_its_logical_axes():
    partitioner = partitioning.PjitPartitioner(
        num_partitions=1, logical_axis_rules=(("vocab", "model"), ("embed", None), ("batch", "data"))
    )
    opt_def = adafactor.Adafactor(0.1, beta1=0.9, logical_factor_rules=RULES)
    state = train_state_lib.FlaxOptimTrainState.create(opt_def, _variables())
    mesh_axes = partitioner.get_mesh_axes(state)
    kernel = mesh_axes.param_states["dense"]["kernel"]
    assert mesh_axes.params["dense"]["kernel"] == P("model", None)
    assert kernel.m == P("model", None) and kernel.v is not None
    assert mesh_axes.step is None and kernel.v_row is None  # unpartitioned stays None, as upstream
