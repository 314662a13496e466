"""RestoreCheckpointConfig rules for a new run: whole state, assignment_map, strict, fallback_to_scratch, dtype."""

import numpy as np
import pytest

import t5x.training
from t5x.launch import CheckpointConfig, ConfigurationError, DatasetConfig, RestoreCheckpointConfig
from t5x.launch._assembly import feature_converter_for
from t5x.launch._jobs import _flat_names, _input_shapes, restore_initial_state

TINY = [
    "models.T5Config.emb_dim = 32",
    "models.T5Config.mlp_dim = 64",
    "models.T5Config.num_heads = 2",
    "models.T5Config.head_dim = 16",
    "models.T5Config.num_encoder_layers = 1",
    "models.T5Config.num_decoder_layers = 1",
]
QUERY = "target/encoder/layers_0/attention/query/kernel"
KEY = "target/encoder/layers_0/attention/key/kernel"


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from t5x.launch import model_from_gin
    from t5x.partitioning import PjitPartitioner

    model = model_from_gin(["models/demo/tiny.gin"], TINY)
    partitioner = PjitPartitioner(num_partitions=1)
    cfg = DatasetConfig("synthetic_copy", {"inputs": 16, "targets": 16}, batch_size=8)
    shapes = _input_shapes(feature_converter_for(model, pack=False), cfg)

    def build(seed, optimizer):
        init = t5x.training.init_train_state(model, optimizer, partitioner, shapes, seed=seed)
        return t5x.training.Trainer(model, partitioner, init.state, init.shardings, seed=seed)

    # One trainer, handed out with its fresh state each time: initialising is slow on a loaded machine.
    trainer = build(2, t5x.training.adafactor())
    initial = trainer.state

    def make():
        trainer.state = initial
        return trainer

    folder = tmp_path_factory.mktemp("source")
    from t5x.checkpointing import Checkpointer

    # The checkpoint: the fresh adafactor state moved off its values (a float leaf + 0.25), at step 3.
    rng = np.random.default_rng(0)
    moved = {
        name: (
            value + rng.normal(0.25, 0.1, value.shape).astype(value.dtype)
            if value.dtype.kind == "f"
            else value
        )
        for name, value in _values(trainer).items()
    }
    moved["state/step"] = np.asarray(3, np.int32)
    from t5x.interfaces import unflatten

    checkpointer = Checkpointer(folder / "full", async_save=False)
    checkpointer.save(3, unflatten(moved))
    checkpointer.close()
    # The same parameters without optimizer slots (as saved by an optimizer with none, e.g. plain SGD).
    bare = {name: value for name, value in moved.items() if not name.startswith("state/param_states/")}
    checkpointer = Checkpointer(folder / "bare", async_save=False)
    checkpointer.save(3, unflatten(bare))
    checkpointer.close()
    return make, moved, folder / "full"


def _values(trainer):
    return {name: np.asarray(value) for name, value in _flat_names(trainer.state.state_dict()).items()}


def test_the_whole_state_is_restored_by_default(setup):
    make, source, folder = setup
    trainer = make()
    assert restore_initial_state(trainer, RestoreCheckpointConfig(path=str(folder))) == 3
    got = _values(trainer)
    assert int(got["state/step"]) == 3
    slots = [n for n in source if n.startswith("state/param_states/")]
    assert slots and all(np.array_equal(got[n], source[n]) for n in slots)
    assert all(np.array_equal(got[n], source[n]) for n in source if n.startswith("target/"))


def test_assignment_map_renames_and_skips(setup):
    make, source, folder = setup
    trainer = make()
    fresh = _values(trainer)
    rules = [(QUERY, KEY), (r"target/decoder/.*", None), (r"state/.*", None)]
    cfg = RestoreCheckpointConfig(path=str(folder / "checkpoint_3"), mode="specific", assignment_map=rules)
    restore_initial_state(trainer, cfg)
    got = _values(trainer)
    assert np.array_equal(got[QUERY], source[KEY])  # renamed: read from the checkpoint's key kernel
    assert not np.array_equal(got[QUERY], source[QUERY])
    decoder = [n for n in got if n.startswith("target/decoder/")]
    assert decoder and all(np.array_equal(got[n], fresh[n]) for n in decoder)  # skipped: fresh
    assert all(
        np.array_equal(got[n], source[n]) for n in got if n.startswith("target/encoder/") and n != QUERY
    )
    assert int(got["state/step"]) == 0


def test_strict_refuses_other_optimizer_slots_and_false_keeps_them_fresh(setup):
    make, source, folder = setup
    bare = folder.parent / "bare"
    trainer = make()
    with pytest.raises(ConfigurationError, match=r"no optimizer slot state/param_states/.*strict=False"):
        restore_initial_state(trainer, RestoreCheckpointConfig(path=str(bare)))
    fresh = _values(trainer)
    assert restore_initial_state(trainer, RestoreCheckpointConfig(path=str(bare), strict=False)) == 3
    got = _values(trainer)
    assert all(np.array_equal(got[n], source[n]) for n in source if n.startswith("target/"))
    slots = [n for n in got if n.startswith("state/param_states/")]
    assert slots and all(np.array_equal(got[n], fresh[n]) for n in slots)


def test_fallback_to_scratch_for_a_missing_checkpoint_or_parameter(setup, tmp_path, capsys):
    make, source, folder = setup
    trainer = make()
    with pytest.raises(ConfigurationError, match="holds no checkpoint.*fallback_to_scratch=True"):
        restore_initial_state(trainer, RestoreCheckpointConfig(path=str(tmp_path)))
    cfg = RestoreCheckpointConfig(path=str(tmp_path), fallback_to_scratch=True)
    assert restore_initial_state(trainer, cfg) is None
    assert "no checkpoint at" in capsys.readouterr().err
    renamed = [(QUERY, "target/not/in/the/checkpoint")]
    with pytest.raises(ConfigurationError, match=f"has no parameter {QUERY}"):
        restore_initial_state(trainer, RestoreCheckpointConfig(path=str(folder), assignment_map=renamed))
    fresh = _values(trainer)
    restore_initial_state(
        trainer, RestoreCheckpointConfig(path=str(folder), assignment_map=renamed, fallback_to_scratch=True)
    )
    got = _values(trainer)
    assert np.array_equal(got[QUERY], fresh[QUERY]) and np.array_equal(got[KEY], source[KEY])
    assert f"1 parameters are not in {folder}" in capsys.readouterr().err


def test_dtype_casts_values_as_they_are_read(setup):
    import jax.numpy as jnp

    make, source, folder = setup
    trainer = make()
    restore_initial_state(trainer, RestoreCheckpointConfig(path=str(folder), dtype="bfloat16"))
    got = _values(trainer)
    assert got[QUERY].dtype == np.float32  # the train state keeps the model's dtype
    rounded = np.asarray(jnp.asarray(source[QUERY]).astype(jnp.bfloat16).astype(jnp.float32))
    assert np.array_equal(got[QUERY], rounded) and not np.array_equal(got[QUERY], source[QUERY])


def test_paths_modes_and_the_older_initial_checkpoint_path(setup, tmp_path):
    make, source, folder = setup
    trainer = make()
    with pytest.raises(ConfigurationError, match="mode 'specific' needs a checkpoint_<step> folder"):
        restore_initial_state(trainer, RestoreCheckpointConfig(path=str(folder), mode="specific"))
    with pytest.raises(ConfigurationError, match="'all' is for evaluation"):
        restore_initial_state(trainer, RestoreCheckpointConfig(path=str(folder), mode="all"))
    # A list: the first path holding a checkpoint.
    listed = RestoreCheckpointConfig(path=[str(tmp_path), str(folder / "checkpoint_3")])
    assert restore_initial_state(trainer, listed) == 3
    # initial_checkpoint_path: parameters only, a fresh optimizer, step 0.
    trainer = make()
    fresh = _values(trainer)
    restore_initial_state(trainer, CheckpointConfig(initial_checkpoint_path=str(folder)).restore_config())
    got = _values(trainer)
    assert int(got["state/step"]) == 0
    assert all(np.array_equal(got[n], fresh[n]) for n in got if n.startswith("state/param_states/"))
    assert all(np.array_equal(got[n], source[n]) for n in source if n.startswith("target/"))
    kept_step = CheckpointConfig(initial_checkpoint_path=str(folder), keep_initial_step=True).restore_config()
    restore_initial_state(trainer, kept_step)
    assert int(_values(trainer)["state/step"]) == 3
    with pytest.raises(ValueError, match="either initial_checkpoint_path"):
        CheckpointConfig(initial_checkpoint_path="a", restore=RestoreCheckpointConfig(path="b"))
