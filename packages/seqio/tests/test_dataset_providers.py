"""seqio.dataset_providers: sources, Task, Mixture, registries, get_dataset, helpers."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import tensorflow as tf

import t5x.seqio as seqio
import t5x.tasks as core
from t5x.seqio import test_utils as tu

VOCAB = seqio.ByteVocabulary()
FEATURES = {"inputs": seqio.Feature(VOCAB), "targets": seqio.Feature(VOCAB)}
ROWS = [{"inputs": "ab", "targets": "c"}, {"inputs": "de", "targets": "fg"}, {"inputs": "h", "targets": "ij"}]


def _function_source(rows=ROWS, **kwargs):
    def dataset_fn(split, shuffle_files, seed=None):
        return tf.data.Dataset.from_tensor_slices({k: [r[k] for r in rows] for k in rows[0]})

    return seqio.FunctionDataSource(dataset_fn, splits=["train", "validation"], **kwargs)


def _add(name, preprocessors=(seqio.preprocessors.tokenize, seqio.preprocessors.append_eos), **kwargs):
    return seqio.TaskRegistry.add(
        name, source=_function_source(), preprocessors=list(preprocessors), output_features=FEATURES, **kwargs
    )


def test_task_registered_through_seqio_is_a_core_task(clean_registry):
    task = _add("dp_task")
    assert core.get_mixture_or_task("dp_task") is task is seqio.get_mixture_or_task("dp_task")
    assert isinstance(task, core.Task) and seqio.TaskRegistry.get("dp_task") is task
    assert "dp_task" in seqio.TaskRegistry.names()
    tu.assert_dataset(
        task.get_dataset(None, shuffle=False).map(lambda x: {"targets": x["targets"]}),
        [{"targets": [102, 1]}, {"targets": [105, 106, 1]}, {"targets": [108, 109, 1]}],
    )
    with pytest.raises(ValueError, match="Attempting to register duplicate provider: dp_task"):
        _add("dp_task")
    # seqio's name rule: '#' is allowed, '/' is not (the core's Task accepts '/').
    assert _add("dp#hash").name == "dp#hash"
    with pytest.raises(ValueError, match="Task name 'dp/slash' contains invalid characters"):
        _add("dp/slash")
    with pytest.raises(ValueError, match="can appear at most once"):
        seqio.Task("two_placeholders", _function_source(), FEATURES,
                   preprocessors=[seqio.CacheDatasetPlaceholder(), seqio.CacheDatasetPlaceholder()])  # fmt: skip


def test_unknown_names_raise_value_error_and_key_error():
    for lookup in (seqio.get_mixture_or_task, seqio.TaskRegistry.get, seqio.MixtureRegistry.get):
        with pytest.raises(ValueError, match="no_such_task"):
            lookup("no_such_task")
        with pytest.raises(KeyError):
            lookup("no_such_task")


def test_function_source_is_called_with_keywords_and_checked():
    calls = []

    def dataset_fn(split, shuffle_files):
        calls.append((split, shuffle_files))
        return tf.data.Dataset.from_tensors({"x": 1})

    source = seqio.FunctionDataSource(dataset_fn, splits=["train"], num_input_examples={"train": 1})
    source.get_dataset("train", shuffle=False)
    assert calls == [("train", False)] and source.num_input_examples("train") == 1
    assert source.caching_permitted and source.list_shards("train") == ["train"]
    with pytest.raises(
        ValueError, match=r"must have initial args \('split', 'shuffle_files'\), got: \('shuffle', 'split'\)"
    ):
        seqio.FunctionDataSource(lambda shuffle, split: None, splits=["train"])


def test_tfexample_source_keeps_varlen_sparse(tmp_path):
    path = str(tmp_path / "data.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
        writer.write(seqio.dict_to_tfexample({"ids": [1, 2, 3], "name": "x"}).SerializeToString())
    source = seqio.TFExampleDataSource(
        {"train": path}, {"ids": tf.io.VarLenFeature(tf.int64), "name": tf.io.FixedLenFeature([], tf.string)}
    )
    ex = next(iter(source.get_dataset("train", shuffle=False)))
    assert isinstance(ex["ids"], tf.SparseTensor)
    np.testing.assert_array_equal(tf.sparse.to_dense(ex["ids"]), [1, 2, 3])
    proto = seqio.ProtoDataSource(
        {"train": path},
        decode_proto_fn=lambda r: tf.io.parse_single_example(
            r, {"name": tf.io.FixedLenFeature([], tf.string)}
        ),
    )
    assert next(iter(proto.get_dataset("train", shuffle=False)))["name"].numpy() == b"x"


def test_file_source_sharding_needs_enough_files(tmp_path):
    for i in range(2):
        (tmp_path / f"part{i}.txt").write_text(f"line{i}\n")
    source = seqio.TextLineDataSource({"train": str(tmp_path / "part*.txt")})
    assert [
        x.numpy() for x in source.get_dataset("train", shuffle=False, shard_info=seqio.ShardInfo(1, 2))
    ] == [b"line1"]
    with pytest.raises(ValueError, match="too few"):
        source.get_dataset("train", shard_info=seqio.ShardInfo(0, 3))


def test_task_validates_metric_functions_lazily():
    def predict_metric(targets, predictions):
        return {}

    def score_metric(targets, scores):
        return {}

    def aux_metric(targets, predictions, aux_values):
        return {}

    task = seqio.Task(
        "metrics_task", _function_source(), FEATURES, metric_fns=[score_metric, predict_metric, aux_metric]
    )
    assert task.predict_metric_fns == [predict_metric]
    assert task.score_metric_fns == [score_metric]
    assert task.predict_with_aux_metric_fns == [aux_metric]
    bad = seqio.Task("bad_metrics", _function_source(), FEATURES, metric_fns=[lambda x, y: {}])
    with pytest.raises(ValueError, match="positional arguments"):
        _ = bad.metric_fns


def test_validation_messages_and_shuffle_rules():
    missing = seqio.Task("missing_feature", _function_source(), FEATURES, preprocessors=[])
    with pytest.raises(ValueError, match="incorrect type for feature 'inputs'"):
        missing.get_dataset(None, shuffle=False)
    no_shuffle = seqio.Task(
        "no_shuffle",
        _function_source(),
        FEATURES,
        preprocessors=[seqio.preprocessors.tokenize],
        shuffle_buffer_size=None,
    )
    assert len(list(no_shuffle.get_dataset(None, shuffle=False))) == 3
    with pytest.raises(ValueError, match="Shuffling is disallowed"):
        no_shuffle.get_dataset(None, shuffle=True)


@seqio.map_over_dataset(num_seeds=1)
def _random_id(ex, seed):
    return {**ex, "r": tf.random.stateless_uniform([], seed=seed, maxval=10**9, dtype=tf.int64)}


def test_seeded_tasks_are_reproducible_and_post_cache_seeds_are_offset():
    task = seqio.Task(
        "seeded",
        _function_source(),
        FEATURES,
        preprocessors=[seqio.preprocessors.tokenize, seqio.CacheDatasetPlaceholder(), _random_id],
    )
    one = [ex["r"] for ex in task.get_dataset(None, shuffle=False, seed=7).as_numpy_iterator()]
    two = [ex["r"] for ex in task.get_dataset(None, shuffle=False, seed=7).as_numpy_iterator()]
    other = [ex["r"] for ex in task.get_dataset(None, shuffle=False, seed=8).as_numpy_iterator()]
    assert one == two != other
    # seqio: post-cache preprocessors draw from seed + 42 * (index of the placeholder).
    first = next(iter(tf.data.Dataset.zip((tf.data.Dataset.random(7 + 42), tf.data.Dataset.random(7 + 43)))))
    want = int(tf.random.stateless_uniform([], seed=tf.stack(first), maxval=10**9, dtype=tf.int64))
    assert one[0] == want


def test_get_dataset_converts_batches_and_trims(clean_registry):
    _add("dp_get")
    batched = seqio.get_dataset(
        "dp_get", {"inputs": 3, "targets": 3}, seqio.EncDecFeatureConverter(pack=False), batch_size=2
    )
    batches = list(batched.as_numpy_iterator())
    assert len(batches) == 1 and batches[0]["encoder_input_tokens"].shape == (2, 3)
    raw = list(seqio.get_dataset("dp_get", {"inputs": 2, "targets": 8}).as_numpy_iterator())
    assert [list(ex["inputs"]) for ex in raw] == [[100, 101], [103, 104], [107, 1]]
    untrimmed = list(seqio.get_dataset("dp_get", {"inputs": 2, "targets": 8}, trim_output_features=False))
    assert len(untrimmed[0]["inputs"]) == 3
    assert seqio.maybe_get_mixture_or_task("dp_get") is seqio.maybe_get_mixture_or_task(
        seqio.get_mixture_or_task("dp_get")
    )


def test_mixtures_and_rates(clean_registry):
    _add("mix_a")
    _add("mix_b")
    mixture = seqio.MixtureRegistry.add("mix_ab", [("mix_a", 3), ("mix_b", 1)])
    assert isinstance(mixture, core.Mixture) and core.get_mixture_or_task("mix_ab") is mixture
    assert [t.name for t in seqio.get_subtasks(mixture)] == ["mix_a", "mix_b"]
    assert mixture.get_rate(seqio.get_mixture_or_task("mix_a")) == 3.0 and mixture.total_rate == 4.0
    counted = seqio.Mixture(
        "mix_counted", ["mix_a", "mix_b"], default_rate=functools.partial(seqio.mixing_rate_num_examples)
    )
    with pytest.raises(ValueError, match="does not know"):
        counted.total_rate  # noqa: B018  (function sources have no size)
    assert (
        len(list(mixture.get_dataset({"inputs": 4, "targets": 4}, shuffle=False, num_epochs=1).take(4))) == 4
    )


def test_mixture_or_task_with_new_vocab(clean_registry):
    _add("vocab_a")
    _add("vocab_b")
    seqio.MixtureRegistry.add("vocab_mix", [("vocab_a", 1), ("vocab_b", 2)])
    new_vocab = seqio.ByteVocabulary(extra_ids=5)
    task = seqio.mixture_or_task_with_new_vocab("vocab_a", "vocab_a_new", new_vocab=new_vocab)
    assert (
        task.output_features["inputs"].vocabulary == new_vocab
        and seqio.get_mixture_or_task("vocab_a_new") is task
    )
    mix = seqio.mixture_or_task_with_new_vocab("vocab_mix", "vocab_mix_new", new_vocab=new_vocab)
    assert [t.name for t in mix.tasks] == ["vocab_mix_new.vocab_a", "vocab_mix_new.vocab_b"]
    assert mix.get_rate(seqio.get_mixture_or_task("vocab_mix_new.vocab_b")) == 2.0
    with pytest.raises(ValueError, match="exactly one"):
        seqio.mixture_or_task_with_new_vocab(
            "vocab_a", "x", new_vocab=new_vocab, new_output_features=FEATURES
        )
    with pytest.raises(ValueError, match="names"):
        seqio.mixture_or_task_with_new_vocab(
            "vocab_a", "y", new_output_features={"inputs": FEATURES["inputs"]}
        )
    short = seqio.helpers.mixture_or_task_with_truncated_data(
        "vocab_a", "vocab_a_short", split_sizes={"train": 2}
    )
    assert len(list(short.get_dataset(None, shuffle=False))) == 2


def test_continuous_feature_and_cache_placeholder():
    feature = seqio.ContinuousFeature(dtype=tf.float32, rank=2)
    assert feature.add_eos is False and feature.vocabulary.eos_id is None
    placeholder = seqio.CacheDatasetPlaceholder(required=True, file_shuffle_buffer_size=16)
    assert placeholder.required and placeholder.file_shuffle_buffer_size == 16
    with pytest.raises(RuntimeError, match="never be called"):
        placeholder(tf.data.Dataset.range(1))
    with pytest.raises(ValueError, match="the underlying data source prohibits caching"):
        seqio.Task(
            "no_cache", _function_source(caching_permitted=False), FEATURES, preprocessors=[placeholder]
        )


def test_task_replace_keeps_the_rest():
    task = seqio.Task("orig", _function_source(), FEATURES, preprocessors=[seqio.preprocessors.tokenize])
    copy = task.replace(name="orig_copy", shuffle_buffer_size=7)
    assert (
        copy.name == "orig_copy"
        and copy.shuffle_buffer_size == 7
        and copy.preprocessors == task.preprocessors
    )
    with pytest.raises(ValueError, match="Expected keys of kwargs argument task.replace.*'bogus'"):
        task.replace(bogus=1)


def test_assigning_a_new_registry_dict_resets_the_shared_registry(clean_registry):
    saved_tasks, saved_mixtures = dict(core.TaskRegistry._REGISTRY), dict(core.MixtureRegistry._REGISTRY)
    try:
        seqio.TaskRegistry._REGISTRY = {}  # how seqio's own tests clear the registry
        seqio.MixtureRegistry._REGISTRY = {}
        assert core.TaskRegistry.names() == [] and core.MixtureRegistry.names() == []
        task = _add("after_reset")
        assert core.get_mixture_or_task("after_reset") is task
        mixture = seqio.MixtureRegistry.add("after_reset_mix", [("after_reset", 2.0)])
        assert mixture._task_to_rate == {"after_reset": 2.0}
    finally:
        core.TaskRegistry._REGISTRY.clear()
        core.TaskRegistry._REGISTRY.update(saved_tasks)
        core.MixtureRegistry._REGISTRY.clear()
        core.MixtureRegistry._REGISTRY.update(saved_mixtures)


def test_get_dataset_trims_each_dimension_with_list_lengths():
    matrix_feature = seqio.Feature(seqio.PassThroughVocabulary(100), add_eos=False, rank=2)
    task = seqio.Task(
        "per_dim",
        source=core.InMemoryDataSource({"train": [{"grid": [[1, 2, 3], [4, 5, 6], [7, 8, 9]]}]}),
        output_features={"grid": matrix_feature},
        preprocessors=[],
    )
    ex = next(iter(seqio.get_dataset(task, {"grid": [2, 1]})))
    np.testing.assert_array_equal(ex["grid"], [[1], [4]])
