import functools

import numpy as np
import pytest
import tensorflow as tf
from tasks_testlib import make_docs, span_task, take, text_task

import t5x.tasks as tt
from t5x.interfaces import ShardInfo


def test_get_dataset_trims_and_is_deterministic(vocab):
    task = span_task("t_span", vocab, make_docs(40))
    lengths = {"inputs": 64, "targets": 16}
    a = take(task.get_dataset(lengths, seed=3))
    b = take(task.get_dataset(lengths, seed=3))
    c = take(task.get_dataset(lengths, seed=4))
    assert len(a) == len(b) and all(
        np.array_equal(x["inputs"], y["inputs"]) for x, y in zip(a, b, strict=True)
    )
    assert any(not np.array_equal(x["inputs"], y["inputs"]) for x, y in zip(a, c, strict=False))
    assert max(len(x["inputs"]) for x in a) == 64 and max(len(x["targets"]) for x in a) <= 16


def test_num_epochs_and_sharding(vocab):
    pairs = [(f"in {i}", f"out {i}") for i in range(12)]
    task = text_task("t_text", vocab, pairs)
    rows = take(task.get_dataset(None, shuffle=False, num_epochs=2))
    assert len(rows) == 24
    shards = [take(task.get_dataset(None, shuffle=False, shard_info=ShardInfo(i, 4))) for i in range(4)]
    texts = [r["inputs_pretokenized"] for s in shards for r in s]
    assert sorted(texts) == sorted(p[0].encode() for p in pairs)


def test_missing_feature_names_the_preprocessor(vocab):
    def drop_targets(ds):
        return ds.map(lambda x: {"inputs": x["inputs"]})

    source = tt.InMemoryDataSource({"train": [{"inputs": "a", "targets": "b"}]})
    features = {"inputs": tt.Feature(vocab), "targets": tt.Feature(vocab)}
    task = tt.Task("t_missing", source, features, preprocessors=[tt.tokenize, drop_targets])
    with pytest.raises(
        ValueError,
        match=r"'t_missing'.*'targets' is missing; it disappeared after preprocessor 1 \(.*drop_targets\)",
    ):
        task.get_dataset(None)
    never = tt.Task("t_never", tt.InMemoryDataSource({"train": [{"inputs": "a"}]}), features, [tt.tokenize])
    with pytest.raises(ValueError, match="source does not provide it"):
        never.get_dataset(None)


def test_untokenized_feature_gives_dtype_error(vocab):
    source = tt.InMemoryDataSource({"train": [{"targets": "b"}]})
    task = tt.Task("t_dtype", source, {"targets": tt.Feature(vocab)})
    with pytest.raises(ValueError, match="'targets' has dtype string .* expected int32"):
        task.get_dataset(None)


def test_raising_preprocessor_is_named(vocab):
    def broken(ds):
        raise RuntimeError("boom")

    task = tt.Task(
        "t_broken",
        tt.InMemoryDataSource({"train": [{"targets": "b"}]}),
        {"targets": tt.Feature(vocab)},
        [broken],
    )
    with pytest.raises(RuntimeError, match="boom") as info:
        task.get_dataset(None)
    assert any(
        "preprocessor 0 (test_raising_preprocessor_is_named.<locals>.broken)" in n
        for n in info.value.__notes__
    )
    assert any("'t_broken'" in n for n in info.value.__notes__)


def test_optional_feature_and_unknown_split(vocab):
    features = {"inputs": tt.Feature(vocab, required=False), "targets": tt.Feature(vocab)}
    task = tt.Task("t_opt", tt.InMemoryDataSource({"train": [{"targets": "b"}]}), features, [tt.tokenize])
    assert set(take(task.get_dataset(None))[0]) == {"targets", "targets_pretokenized"}
    with pytest.raises(ValueError, match="no split 'validation'; available splits: train"):
        task.get_dataset(None, split="validation")


def test_random_preprocessors_get_fresh_seeds_per_epoch(vocab):
    @tt.map_over_dataset(num_seeds=1)
    def noise(x, seed):
        return {"targets": tf.random.stateless_uniform([3], seed=seed, maxval=50, dtype=tf.int32) + 3}

    source = tt.InMemoryDataSource({"train": [{"targets": "b"}]})
    task = tt.Task("t_seeds", source, {"targets": tt.Feature(vocab)}, [tt.tokenize, noise])
    rows = take(task.get_dataset(None, seed=1, num_epochs=3, shuffle=False))
    assert len({tuple(r["targets"]) for r in rows}) == 3
    again = take(task.get_dataset(None, seed=1, num_epochs=3, shuffle=False))
    assert [r["targets"].tolist() for r in rows] == [r["targets"].tolist() for r in again]


def test_postprocess_and_metric_fns(vocab):
    def acc(targets, predictions):
        return {"acc": 1.0}

    def score_metric(targets, scores):
        return {"s": 0.0}

    task = tt.Task(
        "t_meta",
        tt.InMemoryDataSource({"train": [{"targets": "b"}]}),
        {"targets": tt.Feature(vocab)},
        [tt.tokenize],
        postprocess_fn=lambda s, **kw: s.upper(),
        metric_fns=[acc, score_metric],
    )
    assert task.postprocess_fn("abc") == "ABC"
    assert task.predict_metric_fns == (acc,) and task.score_metric_fns == (score_metric,)
    with pytest.raises(ValueError, match="use_cached=True but no cache folders are set.*t5x-tasks cache"):
        task.get_dataset(None, use_cached=True)


def test_feature_rejects_non_vocabulary():
    with pytest.raises(TypeError, match="Vocabulary contract"):
        tt.Feature(object())


def test_cache_placeholder_splits_pre_and_post(vocab):
    calls = []

    def pre(ds):
        calls.append("pre")
        return ds

    def post(ds, sequence_length):
        calls.append(("post", dict(sequence_length)))
        return ds

    task = tt.Task(
        "t_cache",
        tt.InMemoryDataSource({"train": [{"targets": "b"}]}),
        {"targets": tt.Feature(vocab)},
        [functools.partial(tt.tokenize, copy_pretokenized=False), pre, tt.CacheDatasetPlaceholder(), post],
    )
    task.preprocess_precache(task.source_dataset("train"))
    assert calls == ["pre"]
    task.get_dataset({"targets": 4})
    assert calls[1:] == ["pre", ("post", {"targets": 4})]
