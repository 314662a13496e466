"""A cache folder in seqio's exact layout (written by hand here) is read by use_cached=True."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tensorflow as tf

import t5x.seqio as seqio
import t5x.tasks as core
from t5x.interfaces import ShardInfo

VOCAB = seqio.ByteVocabulary()
FEATURES = {"inputs": seqio.Feature(VOCAB), "targets": seqio.Feature(VOCAB)}
EXAMPLES = [
    {"inputs": [10, 11], "targets": [20], "text": b"ab", "ragged": [[1, 2], [3]]},
    {"inputs": [12], "targets": [21, 22, 23], "text": b"c", "ragged": [[4]]},
    {"inputs": [13, 14, 15], "targets": [24], "text": b"def", "ragged": [[], [5, 6, 7]]},
]


def _ints(values):
    return tf.train.Feature(int64_list=tf.train.Int64List(value=values))


def _record(ex, plaintext=False):
    """One record as seqio's cache_tasks_main writes it: flat values, ragged row lengths under _rl:0:."""
    feature = {
        "inputs": _ints(ex["inputs"]),
        "targets": _ints(ex["targets"]),
        ("inputs_plaintext" if plaintext else "inputs_pretokenized"): tf.train.Feature(
            bytes_list=tf.train.BytesList(value=[ex["text"]])
        ),
        "ragged": _ints([v for row in ex["ragged"] for v in row]),
        "_rl:0:ragged": _ints([len(row) for row in ex["ragged"]]),
    }
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def write_seqio_cache(root, task_name, *, version="0.0.0", plaintext=False, int_dtype="int32"):
    """``root/<name with ':' as '/'>/``: COMPLETED, info/stats JSON, two TFRecord shards."""
    task_dir = root.joinpath(*task_name.split(":"))
    task_dir.mkdir(parents=True)
    text_key = "inputs_plaintext" if plaintext else "inputs_pretokenized"
    info = {
        "features": {
            "inputs": {"dtype": int_dtype, "shape": [None]},
            "targets": {"dtype": int_dtype, "shape": [None]},
            text_key: {"dtype": "string", "shape": []},
            "ragged": {"dtype": int_dtype, "shape": [None, None]},
        },
        "num_shards": 2,
    }
    if version is not None:
        info["seqio_version"] = version
    (task_dir / "info.train.json").write_text(json.dumps(info))
    (task_dir / "stats.train.json").write_text(
        json.dumps({"examples": 3, "inputs_tokens": 6, "text_chars": 42})
    )
    for shard, rows in enumerate([EXAMPLES[:2], EXAMPLES[2:]]):
        with tf.io.TFRecordWriter(str(task_dir / f"train.tfrecord-{shard:05d}-of-00002")) as writer:
            for ex in rows:
                writer.write(_record(ex, plaintext))
    (task_dir / "COMPLETED").write_text("")
    return task_dir


@pytest.fixture
def cache_root(tmp_path):
    saved = core.get_global_cache_dirs()
    core.set_global_cache_dirs([str(tmp_path)])
    yield tmp_path
    core.set_global_cache_dirs(saved)


def _cached_task(name, task_cls=seqio.Task):
    return task_cls(
        name,
        source=seqio.FunctionDataSource(lambda split, shuffle_files: None, splits=["train"]),
        output_features=FEATURES,
        preprocessors=[seqio.CacheDatasetPlaceholder(), seqio.preprocessors.append_eos_after_trim],
    )


def test_facade_task_reads_a_seqio_cache(cache_root):
    write_seqio_cache(cache_root, "cached_seqio:v1")
    task = _cached_task("cached_seqio:v1")
    assert task.cache_dir == str(cache_root / "cached_seqio" / "v1")
    ds = task.get_dataset({"inputs": 3, "targets": 2}, split="train", use_cached=True, shuffle=False)
    assert ds.element_spec["inputs"].dtype == tf.int32
    assert isinstance(ds.element_spec["ragged"], tf.RaggedTensorSpec)
    got = list(ds.as_numpy_iterator())
    assert [list(ex["inputs"]) for ex in got] == [[10, 11, 1], [12, 1], [13, 14, 1]]
    assert [list(ex["targets"]) for ex in got] == [[20, 1], [21, 1], [24, 1]]
    assert [ex["ragged"].to_list() for ex in ds] == [ex["ragged"] for ex in EXAMPLES]
    assert [ex["inputs_pretokenized"] for ex in got] == [b"ab", b"c", b"def"]
    assert task.get_cached_stats("train")["examples"] == 3


def test_cached_shards_are_split_by_file(cache_root):
    write_seqio_cache(cache_root, "cached_shards")
    task = _cached_task("cached_shards")
    second = task.get_dataset(None, use_cached=True, shuffle=False, shard_info=ShardInfo(1, 2))
    assert [list(ex["targets"]) for ex in second.as_numpy_iterator()] == [[24, 1]]


def test_legacy_cache_int64_and_plaintext_are_read_as_seqio_does(cache_root):
    write_seqio_cache(cache_root, "cached_legacy", version=None, plaintext=True, int_dtype="int64")
    ds = _cached_task("cached_legacy").get_dataset(None, use_cached=True, shuffle=False)
    assert ds.element_spec["inputs"].dtype == tf.int32  # caches before seqio 0.0.0 stored int32 as int64
    assert "inputs_pretokenized" in ds.element_spec and "inputs_plaintext" not in ds.element_spec


def test_core_task_reads_a_seqio_cache(cache_root):
    write_seqio_cache(cache_root, "cached_for_core")
    task = core.Task(
        "cached_for_core",
        source=core.InMemoryDataSource({"train": [{"inputs": "x", "targets": "y"}]}),
        output_features={"inputs": core.Feature(VOCAB), "targets": core.Feature(VOCAB)},
        preprocessors=[core.CacheDatasetPlaceholder(), core.append_eos],
    )
    ds = task.get_dataset(None, split="train", use_cached=True, shuffle=False)
    assert [list(ex["inputs"]) for ex in ds.as_numpy_iterator()] == [[10, 11, 1], [12, 1], [13, 14, 15, 1]]


def test_rates_use_cached_stats(cache_root):
    write_seqio_cache(cache_root, "cached_rates")
    task = _cached_task("cached_rates")
    assert seqio.mixing_rate_num_examples(task) == 3.0
    assert seqio.mixing_rate_num_examples(task, scale=2.0, maximum=5) == 5.0
    assert seqio.mixing_rate_num_characters(task) == 42.0
    assert seqio.mixing_rate_num_characters(task, temperature=2.0) == pytest.approx(np.sqrt(42.0))


def test_uncached_task_rates():
    task = seqio.Task(
        "uncached_rates",
        source=core.InMemoryDataSource({"train": [{"inputs": "x", "targets": "y"}] * 4}),
        output_features=FEATURES,
    )
    assert seqio.mixing_rate_num_examples(task) == 4.0  # falls back to the source's count
    # seqio's Task asserts that it is cached (an AssertionError, as seqio's).
    with pytest.raises(AssertionError, match="'uncached_rates' does not exist in any of the task cache"):
        seqio.mixing_rate_num_examples(task, fallback_to_num_input_examples=False)
    with pytest.raises(AssertionError, match="'uncached_rates' does not exist in any of the task cache"):
        seqio.mixing_rate_num_characters(task)
    core_task = core.Task("core_uncached_rates", task.source, FEATURES)  # the core's lookup: ValueError
    with pytest.raises(ValueError, match="not cached"):
        seqio.mixing_rate_num_characters(core_task)


def test_a_cache_missing_a_shard_is_refused(cache_root):
    task_dir = write_seqio_cache(cache_root, "cached_broken")
    (task_dir / "train.tfrecord-00001-of-00002").unlink()
    with pytest.raises(ValueError, match="should have 2 shards, found 1"):
        _cached_task("cached_broken").get_dataset(None, use_cached=True, shuffle=False)


def test_requires_caching_refuses_on_the_fly():
    task = seqio.Task(
        "must_cache",
        source=core.InMemoryDataSource({"train": [{"inputs": "x", "targets": "y"}]}),
        output_features=FEATURES,
        preprocessors=[seqio.CacheDatasetPlaceholder(required=True)],
    )
    with pytest.raises(ValueError, match="requires caching"):
        task.get_dataset(None, use_cached=False)


def test_core_task_rates_use_cached_stats(cache_root):
    write_seqio_cache(cache_root, "cached_core_rates")
    task = core.Task(
        "cached_core_rates",
        source=core.InMemoryDataSource({"train": [{"inputs": "x", "targets": "y"}]}),
        output_features={"inputs": core.Feature(VOCAB), "targets": core.Feature(VOCAB)},
    )
    assert seqio.mixing_rate_num_examples(task) == 3.0  # the cache's count, not the source's 1
    assert seqio.mixing_rate_num_characters(task) == 42.0
