import jax
import jax.numpy as jnp
import numpy as np
import pytest
from ckpt_helpers import assert_same_tree, make_state

from t5x.checkpointing import (
    Checkpointer,
    LazyArray,
    load_t5x_checkpoint,
    pin_checkpoint,
    save_t5x_checkpoint,
)


def test_round_trip_numpy_state(tmp_path):
    state = make_state()
    ckpt = Checkpointer(tmp_path)
    ckpt.save(7, state, {"epoch": 1})
    ckpt.close()
    restored = Checkpointer(tmp_path).restore(target=state)
    assert restored.step == 7
    assert restored.input_state == {"epoch": 1}
    assert_same_tree(restored.state, state)
    assert restored.state["target"]["token_embedder"]["embedding"].dtype == jnp.bfloat16
    assert restored.state["state"]["step"].dtype == np.int32


def test_round_trip_jax_arrays_without_target(tmp_path):
    state = jax.tree.map(jnp.asarray, make_state(seed=1))
    save_t5x_checkpoint(tmp_path, 3, state)
    loaded = load_t5x_checkpoint(tmp_path)
    assert_same_tree(loaded, jax.tree.map(np.asarray, state))


def test_load_accepts_step_folder_index_file_and_step(tmp_path):
    save_t5x_checkpoint(tmp_path, 1, make_state(seed=1))
    save_t5x_checkpoint(tmp_path, 2, make_state(seed=2))
    want = make_state(seed=1)
    assert_same_tree(load_t5x_checkpoint(tmp_path, step=1), want)
    assert_same_tree(load_t5x_checkpoint(tmp_path / "checkpoint_1"), want)
    assert_same_tree(load_t5x_checkpoint(tmp_path / "checkpoint_1" / "checkpoint"), want)
    assert_same_tree(load_t5x_checkpoint(tmp_path), make_state(seed=2))


def test_lazy_load_reads_on_demand(tmp_path):
    state = make_state()
    save_t5x_checkpoint(tmp_path, 5, state)
    lazy = load_t5x_checkpoint(tmp_path, lazy=True)
    kernel = lazy["target"]["encoder"]["layers_0"]["attention"]["query"]["kernel"]
    assert isinstance(kernel, LazyArray)
    assert kernel.shape == (16, 8)
    assert kernel.dtype == np.float32
    np.testing.assert_array_equal(
        kernel.get(), state["target"]["encoder"]["layers_0"]["attention"]["query"]["kernel"]
    )
    np.testing.assert_array_equal(np.asarray(kernel), kernel.get())


def test_restore_dtype_and_save_dtype(tmp_path):
    state = make_state()
    save_t5x_checkpoint(tmp_path / "a", 1, state)
    loaded = load_t5x_checkpoint(tmp_path / "a", restore_dtype=jnp.bfloat16)
    kernel = loaded["target"]["encoder"]["layers_0"]["attention"]["query"]["kernel"]
    assert kernel.dtype == jnp.bfloat16
    # Optimizer slots are never cast.
    assert loaded["state"]["param_states"]["token_embedder"]["embedding"]["v_row"].dtype == np.float32

    ckpt = Checkpointer(tmp_path / "b", save_dtype=jnp.bfloat16, async_save=False)
    ckpt.save(1, state)
    stored = load_t5x_checkpoint(tmp_path / "b")
    query = stored["target"]["encoder"]["layers_0"]["attention"]["query"]["kernel"]
    assert query.dtype == jnp.bfloat16
    np.testing.assert_array_equal(
        query, state["target"]["encoder"]["layers_0"]["attention"]["query"]["kernel"].astype(jnp.bfloat16)
    )
    # Restoring into a float32 target casts back up.
    restored = ckpt.restore(target=state).state
    assert restored["target"]["encoder"]["layers_0"]["attention"]["query"]["kernel"].dtype == np.float32


def test_params_only_keeps_fresh_optimizer_state(tmp_path):
    pretrained = make_state(seed=1, step=1000)
    save_t5x_checkpoint(tmp_path, 1000, pretrained)
    fresh = make_state(seed=2, step=0)
    restored = Checkpointer(tmp_path).restore(target=fresh, params_only=True).state
    assert_same_tree(restored["target"], pretrained["target"])
    assert_same_tree(restored["state"], fresh["state"])


def test_assignment_map_renames_and_drops(tmp_path):
    saved = make_state(seed=1)
    save_t5x_checkpoint(tmp_path, 1, saved)
    target = make_state(seed=2)
    target["target"]["decoder"] = {"layers_0": target["target"]["encoder"].pop("layers_0")}
    target["state"]["param_states"]["decoder"] = {
        "layers_0": target["state"]["param_states"]["encoder"].pop("layers_0")
    }
    restored = (
        Checkpointer(tmp_path)
        .restore(
            target=target,
            assignment_map=[(r"(.*)token_embedder(.*)", None), (r"(.*)/decoder/(.*)", r"\1/encoder/\2")],
        )
        .state
    )
    assert_same_tree(restored["target"]["decoder"]["layers_0"], saved["target"]["encoder"]["layers_0"])
    assert_same_tree(restored["target"]["token_embedder"], target["target"]["token_embedder"])


def test_fallback_to_target_for_missing_leaves(tmp_path):
    saved = make_state(seed=1)
    save_t5x_checkpoint(tmp_path, 1, saved)
    target = make_state(seed=2)
    target["target"]["new_head"] = {"kernel": np.ones((3, 2), np.float32)}
    with pytest.raises(KeyError, match="target/new_head/kernel"):
        Checkpointer(tmp_path).restore(target=target)
    restored = Checkpointer(tmp_path).restore(target=target, fallback_to_target=True).state
    np.testing.assert_array_equal(restored["target"]["new_head"]["kernel"], np.ones((3, 2)))
    assert_same_tree(restored["target"]["encoder"], saved["target"]["encoder"])


def test_shape_mismatch_names_parameter_and_shapes(tmp_path):
    save_t5x_checkpoint(tmp_path, 1, make_state())
    target = make_state()
    target["target"]["encoder"]["layers_0"]["attention"]["query"]["kernel"] = jax.ShapeDtypeStruct(
        (16, 9), np.float32
    )
    with pytest.raises(
        ValueError, match=r"target/encoder/layers_0/attention/query/kernel.*\(16, 9\).*\(16, 8\)"
    ):
        Checkpointer(tmp_path).restore(target=target)


def test_dtype_kind_mismatch_is_an_error(tmp_path):
    save_t5x_checkpoint(tmp_path, 1, make_state())
    target = make_state()
    target["target"]["encoder"]["layers_0"]["pre_attention_layer_norm"]["scale"] = np.zeros(16, np.int32)
    with pytest.raises(
        ValueError, match="dtype mismatch for target/encoder/layers_0/pre_attention_layer_norm/scale"
    ):
        Checkpointer(tmp_path).restore(target=target)


def test_restore_into_shape_dtype_structs(tmp_path):
    state = make_state()
    save_t5x_checkpoint(tmp_path, 1, state)
    target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype), state)
    assert_same_tree(Checkpointer(tmp_path).restore(target=target).state, state)


def test_missing_step_names_folder_and_newest(tmp_path):
    save_t5x_checkpoint(tmp_path, 4, make_state())
    with pytest.raises(FileNotFoundError, match=r"checkpoint_9.*newest complete step is 4"):
        Checkpointer(tmp_path).restore(9)
    with pytest.raises(FileNotFoundError, match="no complete checkpoint"):
        Checkpointer(tmp_path / "empty").restore()


def test_retention_keep_keep_every_and_pinned(tmp_path):
    state = make_state()
    ckpt = Checkpointer(tmp_path, keep=2, keep_every=4, async_save=False)
    ckpt.save(1, state)
    pin_checkpoint(ckpt.step_dir(1))
    for step in (2, 3, 4, 5, 6, 7):
        ckpt.save(step, state)
    assert ckpt.all_steps() == [1, 4, 6, 7]
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"checkpoint_{s}" for s in (1, 4, 6, 7)]


def test_saving_an_existing_step_is_skipped(tmp_path):
    ckpt = Checkpointer(tmp_path, async_save=False)
    ckpt.save(1, make_state(seed=1))
    ckpt.save(1, make_state(seed=2))
    assert_same_tree(ckpt.restore(1).state, make_state(seed=1))


def test_async_save_snapshots_state_before_returning(tmp_path):
    state = make_state()
    want = make_state()
    ckpt = Checkpointer(tmp_path)
    ckpt.save(1, state)
    # The caller may reuse its buffers as soon as save returns.
    state["target"]["encoder"]["layers_0"]["attention"]["query"]["kernel"][:] = 0
    ckpt.save(2, make_state(seed=5))  # waits for the first save
    ckpt.close()
    assert_same_tree(load_t5x_checkpoint(tmp_path, step=1), want)
    assert Checkpointer(tmp_path).all_steps() == [1, 2]


def test_background_failure_surfaces_at_next_call(tmp_path, monkeypatch):
    from t5x.checkpointing import _format

    ckpt = Checkpointer(tmp_path)
    ckpt.save(1, make_state())
    ckpt.wait_until_finished()

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(_format, "write_arrays", full_disk)
    ckpt.save(2, make_state(seed=3))
    with pytest.raises(OSError, match="No space left"):
        ckpt.wait_until_finished()
    assert ckpt.all_steps() == [1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint_1"]
    assert_same_tree(ckpt.restore(1).state, make_state())
    ckpt.close()


def test_closed_checkpointer_refuses_to_save(tmp_path):
    ckpt = Checkpointer(tmp_path)
    ckpt.close()
    with pytest.raises(RuntimeError, match="closed"):
        ckpt.save(1, make_state())


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="compression"):
        Checkpointer(tmp_path, compression="lz5")
    with pytest.raises(ValueError, match="keep"):
        Checkpointer(tmp_path, keep=0)


@pytest.mark.parametrize("on_cpu", [True, False], ids=["device-copy", "host-copy"])
def test_async_save_survives_deleted_device_arrays(tmp_path, monkeypatch, on_cpu):
    from t5x.checkpointing import _format

    # The accelerator path (host copies of replica-0 shards) is forced here on CPU.
    monkeypatch.setattr(_format, "_all_on_cpu", lambda arrays: on_cpu)
    want = make_state(seed=4)
    state = jax.tree.map(jnp.asarray, want)
    ckpt = Checkpointer(tmp_path)
    ckpt.save(1, state)
    for leaf in jax.tree.leaves(state):
        leaf.delete()  # what donating the state to the next train step does
    ckpt.close()
    assert_same_tree(load_t5x_checkpoint(tmp_path), want)


def test_lazy_with_shardings_is_refused(tmp_path):
    save_t5x_checkpoint(tmp_path, 1, make_state())
    sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    with pytest.raises(ValueError, match="lazy"):
        Checkpointer(tmp_path).restore(lazy=True, shardings=jax.tree.map(lambda _: sharding, make_state()))


def test_loading_a_path_without_checkpoint_names_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_t5x_checkpoint(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no complete checkpoint in .*empty"):
        load_t5x_checkpoint(tmp_path / "empty")


class _StateObject:
    """A train state that is not a mapping but knows its T5X state dict (as t5x.training's TrainState)."""

    def __init__(self, state_dict):
        self._state_dict = state_dict

    def state_dict(self):
        return self._state_dict


def test_restore_takes_train_state_objects_for_target_and_shardings(tmp_path):
    state = make_state()
    ckpt = Checkpointer(tmp_path, async_save=False)
    ckpt.save(7, state)
    sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    restored = ckpt.restore(
        target=_StateObject(jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), state)),
        shardings=_StateObject(jax.tree.map(lambda _: sharding, state)),
    )
    assert_same_tree(restored.state, state)
    kernel = restored.state["target"]["encoder"]["layers_0"]["attention"]["query"]["kernel"]
    assert isinstance(kernel, jax.Array) and kernel.sharding == sharding
    assert_same_tree(ckpt.restore(target=_StateObject(state), fallback_to_target=True).state, state)


@pytest.mark.parametrize("where", ["target", "shardings"])
def test_restore_names_a_target_it_cannot_read(tmp_path, where):
    ckpt = Checkpointer(tmp_path, async_save=False)
    ckpt.save(7, make_state())
    with pytest.raises(TypeError, match=f"{where} must be a T5X state dict .* got object"):
        ckpt.restore(**{where: object()})


@pytest.mark.parametrize("save_dtype", [np.float32, np.float16])
def test_save_dtype_casts_bfloat16_parameters_and_verifies(tmp_path, save_dtype):
    # bfloat16 is not a numpy floating type: the cast (and so the recorded checksums) must still apply.
    import jax.numpy as jnp

    from t5x.checkpointing import Checkpointer, load_t5x_checkpoint

    bias = np.arange(4, dtype=jnp.bfloat16).reshape(4, 1)
    checkpointer = Checkpointer(tmp_path, save_dtype=save_dtype, async_save=False)
    checkpointer.save(1, {"target": {"bias": bias}, "state": {"step": np.int32(1)}})
    checkpointer.close()
    loaded = load_t5x_checkpoint(tmp_path)["target"]["bias"]
    assert loaded.dtype == save_dtype
    np.testing.assert_array_equal(loaded, bias.astype(save_dtype))
