"""t5x.utils helpers upstream users call: zeros batches, model summary, axis overrides,
training-eval datasets, restore and TrainStateInitializer."""

import dataclasses
import logging
import pathlib
import types

import flax.core
import jax
import numpy as np
import pytest
import tensorflow as tf
from flax.linen import partitioning as flax_partitioning

from t5x import checkpoints, partitioning, utils
from t5x import seqio as t5x_seqio


def test_round_vocab_size_to_multiple():
    assert [utils.round_vocab_size_to_multiple(n) for n in (1, 128, 129)] == [128, 128, 256]
    assert utils.round_vocab_size_to_multiple(32100, divisor=384) == 32256


def test_zeros_batches_follow_specs_and_datasets():
    spec = {"ids": jax.ShapeDtypeStruct((2, 3), np.int32)}
    zeros = utils.get_zeros_batch_like_spec(spec)
    assert zeros["ids"].dtype == np.int32 and zeros["ids"].shape == (2, 3) and not zeros["ids"].any()
    ds = tf.data.Dataset.from_tensors({"x": np.ones((5, 7), np.float32)})
    assert utils.get_zeros_batch_like_dataset(ds)["x"].shape == (5, 7)
    batched = utils.get_zeros_batch_like_dataset(ds, batch_size=2)["x"]
    assert batched.shape == (2, 7) and batched.dtype == np.float32


def _state(target, state):
    return types.SimpleNamespace(state_dict=lambda: {"target": target, "state": state})


def test_log_model_info_lists_variables_with_names_sizes_and_specs(tmp_path, caplog):
    shapes = _state(
        {"dense": jax.ShapeDtypeStruct((4, 2), np.float32)},
        {"param_states": {"dense": None}, "step": np.array(0)},
    )
    logical = _state(
        {"dense": partitioning.AxisNames("embed", "mlp")}, {"param_states": {"dense": None}, "step": None}
    )
    mesh = _state(
        {"dense": partitioning.PartitionSpec(None, "model")}, {"param_states": {"dense": None}, "step": None}
    )
    partitioner = types.SimpleNamespace(get_logical_axes=lambda _: logical, get_mesh_axes=lambda _: mesh)
    log_file = tmp_path / "model-info.txt"
    with caplog.at_level(logging.INFO, logger="t5x.utils"):
        utils.log_model_info(str(log_file), shapes, partitioner)
    lines = [" ".join(line.split()) for line in log_file.read_text().splitlines()]
    assert lines == [
        "Variable dense size 8 shape (embed=4, mlp=2) partition spec (None, 'model')",
        "Total number of parameters: 8",
        "",
        "Variable param_states/dense None",
        "Variable step size 1 shape () partition spec None",
    ]
    assert len([r for r in caplog.records if r.name == "t5x.utils"]) == len(lines)


def test_override_params_axes_names_first_full_match_wins():
    variables = flax.core.freeze(
        {
            "params": {"mlp": {"wi": {"kernel": np.zeros((2, 3))}}},
            "params_axes": {
                "mlp": {"wi": {"kernel_axes": flax_partitioning.AxisMetadata(names=("embed", "mlp"))}}
            },
        }
    )
    out = utils.override_params_axes_names(variables, [("wi/kernel", ("a",)), (".*/kernel", ("x", "y"))])
    assert isinstance(out, flax.core.FrozenDict)
    assert out["params_axes"]["mlp"]["wi"]["kernel_axes"].names == ("x", "y")
    with pytest.raises(ValueError, match=r"mlp/wi/kernel does not match param rank \(2\)"):
        utils.override_params_axes_names(variables, [("mlp/wi/kernel", ("embed",))])
    with pytest.raises(ValueError, match="'params_axes' collection"):
        utils.override_params_axes_names({"params": {}}, [])


def test_training_eval_datasets_take_a_host_shard_of_each_task(monkeypatch):
    task = t5x_seqio.Task(
        "u2_eval_task",
        t5x_seqio.FunctionDataSource(lambda split, shuffle_files: tf.data.Dataset.range(3), splits=["train"]),
        output_features={},
    )
    calls = []

    def fake_get_dataset(cfg, **kwargs):
        calls.append((cfg, kwargs))
        return tf.data.Dataset.range(10).batch(1)

    monkeypatch.setattr(utils, "get_dataset", fake_get_dataset)
    cfg = utils.DatasetConfig(task, {}, "train", batch_size=4, shuffle=False, seed=None)
    out = utils.get_training_eval_datasets(
        cfg, shard_id=1, num_shards=2, eval_steps=2, feature_converter_cls=None
    )
    assert [b.tolist() for b in out["u2_eval_task"].as_numpy_iterator()] == [[1, 3], [5, 7]]
    assert calls[0][0] == dataclasses.replace(cfg, batch_size=1)
    assert calls[0][1]["num_epochs"] == 8 and calls[0][1]["num_shards"] == 1
    with pytest.raises(ValueError, match=r"Batch size \(4\) must be divisible by number of shards \(3\)"):
        utils.get_training_eval_datasets(
            cfg, shard_id=0, num_shards=3, eval_steps=1, feature_converter_cls=None
        )


def _text_task(name, features=("inputs", "targets")):
    vocabulary = t5x_seqio.ByteVocabulary()

    def texts(split, shuffle_files, seed=None):
        words = [f"example {i}" for i in range(12)]
        return tf.data.Dataset.from_tensor_slices({"text": words})

    return t5x_seqio.Task(
        name,
        t5x_seqio.FunctionDataSource(texts, splits=["train"]),
        preprocessors=[
            lambda ds: ds.map(lambda ex: {k: ex["text"] for k in features}),
            t5x_seqio.preprocessors.tokenize,
            t5x_seqio.preprocessors.append_eos_after_trim,
        ],
        output_features={k: t5x_seqio.Feature(vocabulary) for k in features},
    )


def test_get_dataset_gives_each_host_its_shard_of_converted_batches():
    task = _text_task("u2_get_dataset")
    cfg = utils.DatasetConfig(
        task, {"inputs": 16, "targets": 16}, "train", batch_size=4, shuffle=False, seed=3
    )
    hosts = [
        list(
            utils.get_dataset(
                cfg, shard, 2, t5x_seqio.EncDecFeatureConverter, num_epochs=1
            ).as_numpy_iterator()
        )
        for shard in (0, 1)
    ]
    assert len(hosts[0]) == len(hosts[1]) == 3  # 6 examples a host, 2 a batch
    batch = hosts[0][0]
    assert batch["encoder_input_tokens"].shape == (2, 16) and "decoder_target_tokens" in batch
    rows = [tuple(b["encoder_input_tokens"][i]) for host in hosts for b in host for i in range(2)]
    assert len(set(rows)) == 12  # the two shards are disjoint and cover the split
    with pytest.raises(ValueError, match=r"Batch size \(4\) must be divisible by number of shards \(3\)"):
        utils.get_dataset(cfg, 0, 3, t5x_seqio.EncDecFeatureConverter)
    with pytest.raises(ValueError, match="continue_from_last_checkpoint"):
        utils.get_dataset(cfg, 0, 1, t5x_seqio.EncDecFeatureConverter, continue_from_last_checkpoint=True)


def test_get_deterministic_dataset_repeats_and_starts_at_a_step():
    task = _text_task("u2_deterministic")
    cfg = utils.DatasetConfig(
        task, {"inputs": 16, "targets": 16}, "train", batch_size=2, shuffle=True, seed=None
    )

    def ids(start_step):
        dataset = utils.get_deterministic_dataset(
            cfg,
            0,
            1,
            t5x_seqio.EncDecFeatureConverter,
            model_dir="/unused",
            start_step=start_step,
            num_epochs=1,
        )
        return [b["encoder_input_tokens"].tolist() for b in dataset.as_numpy_iterator()]

    first = ids(0)
    assert first == ids(0) and len(first) == 6  # seed None: seed 0, the same order every time
    assert ids(2) == first[2:]


def test_get_vocabulary_gives_inputs_and_targets():
    task = _text_task("u2_vocabulary")
    cfg = utils.DatasetConfig(task, {"inputs": 8, "targets": 8}, "train", batch_size=2, shuffle=False, seed=0)
    inputs, targets = utils.get_vocabulary(cfg)
    assert inputs == targets == task.output_features["targets"].vocabulary
    lm = _text_task("u2_vocabulary_lm", features=("targets",))
    assert utils.get_vocabulary(dataclasses.replace(cfg, mixture_or_task_name=lm)) == (targets, targets)
    no_targets = _text_task("u2_vocabulary_none", features=("inputs",))
    with pytest.raises(ValueError, match="has no 'targets' feature"):
        utils.get_vocabulary(dataclasses.replace(cfg, mixture_or_task_name=no_targets))


class _PathCheckpointer:
    def __init__(self, **kwargs):
        self.kwargs = kwargs

    def restore(self, path, **kwargs):
        return {"restored_from": path}


def _model_dir(root: pathlib.Path, steps) -> str:
    for step in steps:
        (root / f"checkpoint_{step}").mkdir(parents=True)
        (root / f"checkpoint_{step}" / "checkpoint").write_bytes(b"")
    (root / "checkpoint_99").mkdir()  # no 'checkpoint' file: not a checkpoint
    return str(root)


@pytest.fixture
def initializer():
    def init_fn(rng, input_shapes, input_types):
        return {"params": {"w": jax.numpy.zeros(input_shapes["x"])}}

    partitioner = types.SimpleNamespace(
        get_mesh_axes=lambda shape: "axes-of-" + type(shape).__name__,
        partition=lambda fn, in_axis_resources, out_axis_resources: fn,
    )
    return utils.TrainStateInitializer(None, init_fn, {"x": (2, 3)}, partitioner)


def test_train_state_initializer_from_scratch_and_shapes(initializer):
    assert initializer.train_state_axes == "axes-of-InferenceState"
    state = initializer.from_scratch(jax.random.PRNGKey(0))
    assert state.params["w"].shape == (2, 3)


def test_train_state_initializer_restores_the_first_config_with_checkpoints(initializer, tmp_path):
    empty = utils.RestoreCheckpointConfig(path=str(tmp_path / "none"), checkpointer_cls=_PathCheckpointer)
    model_dir = _model_dir(tmp_path / "run", (10, 2))
    latest = utils.RestoreCheckpointConfig(path=model_dir, checkpointer_cls=_PathCheckpointer)
    restored = initializer.from_checkpoint_or_scratch([empty, latest], init_rng=jax.random.PRNGKey(0))
    assert restored == {"restored_from": str(tmp_path / "run" / "checkpoint_10")}
    every = dataclasses.replace(latest, mode="all")
    assert [s["restored_from"][-2:] for s in initializer.from_checkpoints([every])] == ["_2", "10"]
    with pytest.raises(ValueError, match="Expected at most 1 checkpoint but got 2"):
        initializer.from_checkpoint([every])
    # Nothing found anywhere: a fresh state.
    fresh = initializer.from_checkpoint_or_scratch([empty], init_rng=jax.random.PRNGKey(0))
    assert fresh.params["w"].shape == (2, 3)


def test_restore_without_a_checkpointer_class_uses_the_upstream_checkpointer(initializer, tmp_path):
    state = initializer.from_scratch(jax.random.PRNGKey(0))
    state = state.replace_params({"w": np.full((2, 3), 5.0, np.float32)})
    checkpoints.Checkpointer(state, None, str(tmp_path)).save(state)
    restored = initializer.from_checkpoint([utils.RestoreCheckpointConfig(path=str(tmp_path))])
    np.testing.assert_array_equal(restored.params["w"], np.full((2, 3), 5.0))


def test_restore_returns_one_state_or_a_list():
    cfg = utils.RestoreCheckpointConfig(path=[])
    assert utils.restore(_PathCheckpointer(), ["a"], cfg) == {"restored_from": "a"}
    assert utils.restore(_PathCheckpointer(), ["a", "b"], cfg) == [
        {"restored_from": "a"},
        {"restored_from": "b"},
    ]
