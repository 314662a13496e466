"""t5x.checkpoints: upstream's Checkpointer calling convention over t5x.checkpointing."""

from __future__ import annotations

import os

import jax.numpy as jnp
import numpy as np
import pytest

from t5x import checkpoints, optimizers, state_utils
from t5x import train_state as train_state_lib


def _state(step: int = 42, kernel_shape: tuple[int, int] = (2, 16)) -> train_state_lib.FlaxOptimTrainState:
    optimizer = optimizers.Optimizer(
        optimizers.sgd(0.1),
        state=optimizers.OptimizerState(
            step=np.int32(step),
            param_states={"bias": np.int32(1), "kernel": np.array([1, 2], np.uint8)},
        ),
        target={
            "bias": np.arange(4, dtype=jnp.bfloat16).reshape((4, 1)),
            "kernel": np.arange(32, dtype=np.float32).reshape(kernel_shape),
        },
    )
    return train_state_lib.FlaxOptimTrainState(optimizer)


def _with_step(state: train_state_lib.FlaxOptimTrainState, step: int) -> train_state_lib.FlaxOptimTrainState:
    state_dict = state.state_dict()
    state_dict["state"]["step"] = np.int32(step)
    return state.restore_state(state_dict)


def test_save_restore_round_trip_in_upstream_layout(tmp_path):
    state = _state()
    ckpt = checkpoints.Checkpointer(state, None, str(tmp_path))
    ckpt.save(state)
    assert os.path.isfile(tmp_path / "checkpoint_42" / "checkpoint")
    assert ckpt.all_steps() == [42] and ckpt.latest_step() == 42
    restored = ckpt.restore()
    assert int(restored.step) == 42 and restored.step.dtype == np.int32
    np.testing.assert_array_equal(restored.params["kernel"], state.params["kernel"])
    assert restored.params["bias"].dtype == np.float32  # as stored (save_dtype), as upstream
    assert restored.param_states["kernel"].dtype == np.uint8
    loaded = checkpoints.load_t5x_checkpoint(str(tmp_path))
    np.testing.assert_array_equal(loaded["target"]["kernel"], state.params["kernel"])


def test_save_and_restore_dtypes(tmp_path):
    state = _state()
    checkpoints.Checkpointer(state, None, str(tmp_path), save_dtype=jnp.bfloat16).save(state)
    loaded = checkpoints.load_t5x_checkpoint(str(tmp_path))
    assert loaded["target"]["kernel"].dtype == jnp.bfloat16
    restored = checkpoints.Checkpointer(state, None, str(tmp_path), restore_dtype=np.float32).restore(step=42)
    assert restored.params["bias"].dtype == np.float32
    assert restored.params["kernel"].dtype == np.float32
    assert restored.param_states["kernel"].dtype == np.uint8  # not a parameter: not cast


def test_keep_drops_oldest_and_honours_pins(tmp_path):
    state = _state()
    ckpt = checkpoints.Checkpointer(state, None, str(tmp_path), keep=2)
    for step in (1, 2, 3):
        ckpt.save(_with_step(state, step))
    assert ckpt.all_steps() == [2, 3]
    (tmp_path / "checkpoint_2" / "PINNED").write_text("1")
    ckpt.keep = 1
    ckpt.save(_with_step(state, 4))
    assert ckpt.all_steps() == [2, 4]


def test_wrong_shape_names_the_parameter(tmp_path):
    checkpoints.Checkpointer(_state(), None, str(tmp_path)).save(_state())
    other = checkpoints.Checkpointer(_state(kernel_shape=(4, 8)), None, str(tmp_path))
    with pytest.raises(ValueError, match=r"Shape of `target/kernel` in checkpoint \(2, 16\) does not match"):
        other.restore(step=42)


def test_assignment_map_with_fallback_state(tmp_path):
    state = _state()
    checkpoints.Checkpointer(state, None, str(tmp_path)).save(state)
    bigger = train_state_lib.FlaxOptimTrainState(
        optimizers.Optimizer(
            optimizers.sgd(0.1),
            state=optimizers.OptimizerState(
                step=np.int32(42),
                param_states={
                    "bias": np.int32(1),
                    "kernel": np.array([1, 2], np.uint8),
                    "extra": np.int32(0),
                },
            ),
            target={
                "bias": np.zeros((4, 1), jnp.bfloat16),
                "kernel": np.zeros((2, 16), np.float32),
                "extra": np.zeros((3,), np.float32),
            },
        )
    )
    ckpt = checkpoints.Checkpointer(bigger, None, str(tmp_path))
    rules = [("target/extra", None), ("state/step", None), ("state/param_states/extra", None)]

    def transform(ckpt_state, model_state):
        return state_utils.apply_assignment_map(ckpt_state, model_state, rules)

    restored = ckpt.restore(
        step=42,
        state_transformation_fns=[transform],
        fallback_state={
            "target": {"extra": np.ones((3,), np.float32)},
            "state": {"step": 7, "param_states": {"extra": np.int32(5)}},
        },
    )
    assert int(restored.step) == 7
    np.testing.assert_array_equal(restored.params["extra"], np.ones(3))
    np.testing.assert_array_equal(restored.params["kernel"], state.params["kernel"])
    with pytest.raises(ValueError, match="target/extra"):
        ckpt.restore(step=42)


def test_assignment_map_errors():
    ckpt_state = {"target": {"kernel": 1}}
    with pytest.raises(ValueError, match="Unused patterns"):
        state_utils.apply_assignment_map(ckpt_state, {"target": {"kernel": 0}}, [("target/nope", None)])
    with pytest.raises(ValueError, match="'target/missing' does not exist"):
        state_utils.apply_assignment_map(
            ckpt_state, {"target": {"kernel": 0}}, [("target/kernel", "target/missing")]
        )


def test_lazy_restore(tmp_path):
    state = _state()
    ckpt = checkpoints.Checkpointer(state, None, str(tmp_path))
    ckpt.save(state)
    lazy = ckpt.restore(step=42, lazy_parameters=True)
    assert isinstance(lazy.params["kernel"], checkpoints.LazyArray)
    np.testing.assert_array_equal(lazy.params["kernel"].get(), state.params["kernel"])


def test_dataset_iterator_checkpointed(tmp_path):
    tf = pytest.importorskip("tensorflow")
    state = _state()
    iterator = iter(tf.data.Dataset.range(10))
    ckpt = checkpoints.Checkpointer(state, None, str(tmp_path), iterator, keep_dataset_checkpoints=1)
    next(iterator)
    ckpt.save(_with_step(state, 1))
    ckpt.save(_with_step(state, 2))
    assert ckpt.all_steps() == [1, 2] and ckpt.all_dataset_checkpoint_steps() == [2]
    next(iterator)
    ckpt.restore(step=2)
    assert int(next(iterator)) == 1


def test_steps_and_find_checkpoint(tmp_path):
    for name in ("checkpoint_0", "checkpoint_10", "checkpoint_7.tmp-0", "checkpoint_3"):
        (tmp_path / name).mkdir()
        if name != "checkpoint_3":
            (tmp_path / name / "checkpoint").write_text("")
    assert checkpoints.all_steps(str(tmp_path)) == [0, 10]
    assert checkpoints.latest_step(str(tmp_path)) == 10
    assert checkpoints.latest_step(str(tmp_path / "none")) is None
    index = str(tmp_path / "checkpoint_10" / "checkpoint")
    assert checkpoints.find_checkpoint(str(tmp_path)) == index
    assert checkpoints.find_checkpoint(str(tmp_path / "checkpoint_10")) == index
    assert checkpoints.find_checkpoint(index, 5) == index
    assert checkpoints.get_checkpoint_dir(str(tmp_path), 10) == str(tmp_path / "checkpoint_10")
    with pytest.raises(ValueError, match="step 3"):
        checkpoints.find_checkpoint(str(tmp_path), 3)
    with pytest.raises(ValueError, match="step folder"):
        checkpoints.find_checkpoint(str(tmp_path / "checkpoint_10"), 10)
    with pytest.raises(ValueError, match="not a valid T5X checkpoint"):
        checkpoints.find_checkpoint(str(tmp_path / "missing"))


def test_bad_arguments(tmp_path):
    with pytest.raises(TypeError, match="state_dict"):
        checkpoints.Checkpointer({"target": {}}, None, str(tmp_path))
    with pytest.raises(ValueError, match="keep must be None or >= 1, got 0"):
        checkpoints.Checkpointer(_state(), None, str(tmp_path), keep=0)
    with pytest.raises(ValueError, match="No checkpoint to restore"):
        checkpoints.Checkpointer(_state(), None, str(tmp_path)).restore()
