"""seqio.test_utils' fake tasks, helpers for derived mixtures, and smaller seqio behaviours."""

from __future__ import annotations

import functools
from unittest import mock

import numpy as np
import pytest
import tensorflow as tf

import t5x.seqio as seqio
import t5x.tasks as core
from t5x.seqio import evaluation, helpers, utils
from t5x.seqio import test_utils as tu


class _FakeCase(tu.FakeMixtureTest):
    __test__ = False  # used through the fixture below, not collected

    def runTest(self):
        pass


@pytest.fixture(scope="module")
def fake_case():
    case = _FakeCase()
    case.setUp()
    yield case
    case.doCleanups()


def test_fake_task_test_registers_seqio_fake_tasks(fake_case):
    names = set(seqio.TaskRegistry.names())
    assert {"tfds_task", "text_line_task", "tf_example_task", "proto_task", "function_task",
            "cached_task", "cached_plaintext_task", "random_task", "uncached_task"} <= names  # fmt: skip
    assert {"cached_mixture", "uncached_mixture", "uncached_random_mixture"} <= set(
        seqio.MixtureRegistry.names()
    )
    # Each source gives the fake examples; the comparison derives ids from the test model in use.
    fake_case.verify_task_matches_fake_datasets("function_task", splits=["train"])
    fake_case.verify_task_matches_fake_datasets("text_line_task", splits=["train"], num_shards=2)
    fake_case.verify_task_matches_fake_datasets("cached_task", use_cached=True)
    assert utils.mixing_rate_num_examples(fake_case.cached_task) == 3.0  # from the cache's stats
    assert utils.mixing_rate_num_examples(fake_case.uncached_task) == 30.0  # the fake TFDS size
    with pytest.raises(AssertionError, match="'uncached_task' does not exist in any of the task cache"):
        utils.mixing_rate_num_examples(fake_case.uncached_task, fallback_to_num_input_examples=False)
    assert (
        str(fake_case.proto_source)
        == f"ProtoDataSource({{'train': '{fake_case.test_data_dir}/train.tfrecord*'}})"
    )
    assert "cycle_length=16, block_length=16)" in repr(fake_case.text_line_source)


def test_fake_task_comparison_fails_on_other_data(fake_case):
    with pytest.raises(AssertionError):
        fake_case.verify_task_matches_fake_datasets(
            "function_task", splits=["train"], token_preprocessed=True
        )


def test_fake_dataset_features_and_sharding():
    ds = tu.get_fake_dataset("validation", ndfeatures=True, shard_info=seqio.ShardInfo(1, 2))
    (ex,) = list(ds.as_numpy_iterator())
    assert ex["suffix"] == b"was another validation" and ex["3d_feature"].shape == (1, 2, 3)
    ragged = next(iter(tu.get_fake_dataset("train", ragged_features=True)))["ragged_feature"]
    assert ragged.to_list() == [[[3, 1], [4, 1]], [[5, 9], [2, 6]]]


def test_sentencepiece_vocab_without_test_data_is_trained_here(monkeypatch):
    from t5x.seqio import _fake_tasks

    monkeypatch.setattr(_fake_tasks, "_FOUND_TEST_DATA_DIR", None)
    monkeypatch.setattr(_fake_tasks, "_caller_test_data_dirs", lambda: [])
    vocab = tu.sentencepiece_vocab(extra_ids=2)
    assert vocab.decode(vocab.encode("this is a test")) == "this is a test"
    assert vocab.eos_id == 1 and vocab.extra_ids == 2


def _source(splits=("train",)):
    return seqio.FunctionDataSource(
        lambda split, shuffle_files: tf.data.Dataset.from_tensor_slices({"a": ["x", "y"]}),
        splits=list(splits),
    )


def test_feature_given_as_none_registers_and_a_mixture_refuses_it(clean_registry):
    """docs/differences.md row 17."""
    feats = {"a": seqio.Feature(seqio.ByteVocabulary())}
    seqio.TaskRegistry.add("with_a", source=_source(), preprocessors=[], output_features=feats)
    task = seqio.TaskRegistry.add("none_feature", source=_source(), preprocessors=[],
                                  output_features={"other": None})  # fmt: skip
    assert task.output_features == {"other": None}  # kept as given, like seqio
    with pytest.raises(ValueError, match="contains Tasks with different output features"):
        seqio.MixtureRegistry.add("mixed_features", [("with_a", 1.0), ("none_feature", 1.0)])
    # The core Task still wants a Feature object.
    with pytest.raises(TypeError, match="'other' must be a Feature, got NoneType"):
        core.Task("core_none", source=core.InMemoryDataSource({"train": [{"a": "x"}]}),
                  output_features={"other": None})  # fmt: skip


def test_task_without_output_features_and_shared_tasks_in_nested_mixtures(clean_registry):
    task = seqio.TaskRegistry.add("raw_only", source=_source(), preprocessors=[], output_features={})
    assert task.output_features == {}
    with pytest.raises(ValueError, match="at least one feature"):
        core.Task("core_raw", source=core.InMemoryDataSource({"train": [{"a": "x"}]}), output_features={})
    feats = {"a": seqio.Feature(seqio.ByteVocabulary())}
    for name in ("shared_a", "shared_b"):
        seqio.TaskRegistry.add(name, source=_source(), preprocessors=[seqio.preprocessors.tokenize],
                               output_features=feats)  # fmt: skip
    seqio.MixtureRegistry.add("inner_mix", [("shared_a", 1.0), ("shared_b", 3.0)])
    outer = seqio.MixtureRegistry.add("outer_mix", [("shared_a", 2.0), ("inner_mix", 4.0)])
    assert [t.name for t in outer.tasks] == ["shared_a", "shared_b"]  # each once
    assert outer.get_rate(outer.tasks[0]) == pytest.approx(2.0 + 4.0 * 1 / 4)  # both paths add up
    assert outer.rate_per_task_name == {"shared_a": 2.0, "inner_mix": 4.0}
    assert [t.name for t in outer._tasks] == ["shared_a"] and [m.name for m in outer._sub_mixtures] == [
        "inner_mix"
    ]
    with pytest.raises(ValueError, match="more than once"):
        seqio.MixtureRegistry.add("dup_mix", [("shared_a", 1.0), ("shared_a", 1.0)])


def test_helpers_keep_source_info_validate_and_drop_missing_splits(clean_registry):
    feats = {"a": seqio.Feature(seqio.ByteVocabulary())}
    info = seqio.dataset_providers.SourceInfo(file_path="tasks.py")
    assert info.line_number is None
    seqio.TaskRegistry.add(
        "h_both", source=_source(("train", "test")), output_features=feats, source_info=info
    )
    seqio.TaskRegistry.add("h_train", source=_source(("train",)), output_features=feats)
    new = helpers.mixture_or_task_with_new_vocab("h_both", "h_both_v2", new_vocab=seqio.ByteVocabulary(2))
    assert new.source_info.file_path == "tasks.py"
    ranked = {"a": seqio.Feature(seqio.ByteVocabulary(), rank=2)}
    with pytest.raises(ValueError, match="rank"):
        helpers.mixture_or_task_with_new_vocab("h_both", "h_bad", new_output_features=ranked)
    loose = helpers.mixture_or_task_with_new_vocab(
        "h_both", "h_rank2", new_output_features=ranked, validate_features=False
    )
    assert loose.output_features["a"].rank == 2
    seqio.MixtureRegistry.add("h_mix", [("h_both", 0.3), ("h_train", 0.9)])
    only_test = helpers.mixture_with_missing_task_splits_removed(
        "h_mix", split="test", new_mixture_name="h_mix_test", add_to_seqio_registry=False
    )
    assert (
        only_test.rate_per_task_name == {"h_both": 0.3} and "h_mix_test" not in seqio.MixtureRegistry.names()
    )
    # Unregistered copies leave the registries alone, sub-tasks included.
    loose_mix = helpers.mixture_or_task_with_new_vocab(
        "h_mix", "h_mix_v2", new_vocab=seqio.ByteVocabulary(3), add_to_seqio_registry=False
    )
    assert [t.name for t in loose_mix.tasks] == ["h_mix_v2.h_both", "h_mix_v2.h_train"]
    assert not [n for n in seqio.TaskRegistry.names() if n.startswith("h_mix_v2")]
    with pytest.raises(ValueError, match="no task of 'h_mix' has split 'dev'"):
        helpers.mixture_with_missing_task_splits_removed("h_mix", split="dev", new_mixture_name="h_dev")


def test_utils_seqio_behaviours(tmp_path):
    # A keyword bound by functools.partial stays bound.
    bound = utils.add_kwargs_to_transform(functools.partial(lambda x, y: x * y, x=2), x=5, y=3)
    assert bound() == 6
    # Rates from characters ask the task's own cached stats.
    task = mock.Mock(get_cached_stats=lambda split: {"text_chars": 8})
    assert utils.mixing_rate_num_characters(task, temperature=0.5) == pytest.approx(64.0)
    with mock.patch.object(tf.compat.v2.io.gfile, "glob", return_value=["/b2", "/b1"]) as glob:
        assert utils.list_files(["/sharded@2", "/b*", "/b1"]) == ["/sharded@2", "/b1", "/b2"]
        utils.list_files("/b*")
    glob.assert_called_once_with("/b*")  # each pattern is listed once per process


def test_function_source_checks_the_dataset_fn_signature():
    def good(split, shuffle_files, seed=None):
        return tf.data.Dataset.range(1)

    seqio.FunctionDataSource(good, splits=["train"])

    def bad(split):
        return None

    def extra(split, shuffle_files, other):
        return None

    with pytest.raises(
        ValueError, match=r"^'bad' must have initial args \('split', 'shuffle_files'\), got: \('split',\)$"
    ):
        seqio.FunctionDataSource(bad, splits=["train"])
    with pytest.raises(ValueError, match=r"'extra' may only have positional args"):
        seqio.FunctionDataSource(extra, splits=["train"])


def test_evaluation_module_names():
    assert evaluation.EncDecFeatureConverter is seqio.EncDecFeatureConverter
    with_metrics = mock.Mock(splits=("validation",), metric_fns=[len], metric_objs=[])
    no_metrics = mock.Mock(splits=("validation",), metric_fns=[], metric_objs=[])
    no_split = mock.Mock(splits=("train",), metric_fns=[len], metric_objs=[])
    assert evaluation.get_valid_eval_tasks([with_metrics, no_metrics, no_split], "validation") == [
        with_metrics
    ]


def test_make_autoregressive_inputs_rank2_follows_seqio_and_refuses_packed_batches():
    x = tf.constant([[3, 8, 1], [9, 5, 2]])
    np.testing.assert_array_equal(utils.make_autoregressive_inputs(x), [[0, 0, 0], [3, 8, 1]])
    with pytest.raises(ValueError, match="Only 1-D sequences are supported with packing"):
        utils.make_autoregressive_inputs(x, sequence_id=tf.constant([[1, 1, 1], [1, 1, 1]]))
    np.testing.assert_array_equal(utils.make_autoregressive_inputs(tf.constant([4, 5, 1])), [0, 4, 5])


def test_task_refuses_lengths_before_the_cache_and_honours_source_shuffling(clean_registry):
    feats = {"a": seqio.Feature(seqio.ByteVocabulary())}

    def needs_lengths(ds, sequence_length):
        return ds

    task = seqio.Task(
        "len_pre_cache", _source(), feats, preprocessors=[needs_lengths, seqio.CacheDatasetPlaceholder()]
    )
    with pytest.raises(
        ValueError, match="'needs_lengths' has a `sequence_length` argument but occurs before"
    ):
        task.get_dataset(None, shuffle=False)
    source = _source()
    unshuffled = seqio.Task("no_buffer", source, {}, preprocessors=[], shuffle_buffer_size=None)
    with pytest.raises(ValueError, match="Shuffling is disallowed for Task 'no_buffer'"):
        unshuffled.get_dataset(None, shuffle=True)
    source._performs_internal_shuffling = True  # seqio's flag: the source shuffles by itself
    assert len(list(unshuffled.get_dataset(None, shuffle=True))) == 2
