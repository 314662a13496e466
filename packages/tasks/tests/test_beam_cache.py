"""Offline caching with a real Apache Beam pipeline (DirectRunner, multi-worker) and reading it back.

The pipeline tests need apache_beam, which lives in the optional ``beam`` extra
(its own environment); without it they skip, and only the reader's error paths run.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import textwrap

import pytest
import tensorflow as tf

import t5x.tasks as tt
from t5x.interfaces import ShardInfo
from t5x.tasks._offline_cache import (
    COMPLETED,
    add_global_cache_dirs,
    find_task_cache,
    get_global_cache_dirs,
    read_cached_split,
    set_global_cache_dirs,
    task_cache_dir,
)

HAS_BEAM = importlib.util.find_spec("apache_beam") is not None
needs_beam = pytest.mark.skipif(
    not HAS_BEAM,
    reason="apache_beam is not installed (it is the optional `beam` extra, tested in its own env)",
)

TASKS_MODULE = textwrap.dedent(
    '''
    """Registers the tasks the Beam cache test caches (imported on every worker)."""
    import functools

    import tensorflow as tf

    import t5x.tasks as tt
    from t5x.vocabularies import ByteVocabulary

    VOCAB = ByteVocabulary(extra_ids=100)
    DOCS = [f"document number {i} " + "word " * (i % 7) for i in range(40)]
    FEATURES = {"inputs": tt.Feature(VOCAB), "targets": tt.Feature(VOCAB)}


    def prefix(ds):
        return ds.map(lambda x: {"inputs": tf.strings.join(["summarize: ", x["text"]]), "targets": x["text"]})


    def explode_on_17(ds):
        def check(x):
            bad = tf.strings.regex_full_match(x["text"], "document number 17 .*")
            with tf.control_dependencies([tf.debugging.Assert(tf.logical_not(bad), ["simulated worker crash"])]):
                return {k: tf.identity(v) for k, v in x.items()}

        return ds.map(check)


    def register():
        for name, extra in (("beam_cached", []), ("beam_broken", [explode_on_17])):
            if name not in tt.TaskRegistry.names():
                tt.TaskRegistry.add(
                    name,
                    source=tt.InMemoryDataSource({"train": [{"text": d} for d in DOCS], "validation": [{"text": d} for d in DOCS[:5]]}),
                    output_features=FEATURES,
                    preprocessors=[*extra, prefix, tt.tokenize, tt.CacheDatasetPlaceholder(), tt.append_eos_after_trim],
                )


    register()
    '''
)


SPM_TASKS_MODULE = textwrap.dedent(
    '''
    """A T5-style task: SentencePiece with 100 sentinels, span corruption after the cache."""
    import functools
    import os

    import t5x.tasks as tt
    from t5x.vocabularies import SentencePieceVocabulary

    # Built on every worker: sentinels are added to the model proto there too.
    VOCAB = SentencePieceVocabulary(os.environ["T5X_BEAM_TEST_SPM_MODEL"], extra_ids=100)
    DOCS = tt.generate_corpus(48, seed=11, min_sentences=1, max_sentences=6)

    if "beam_span_corruption" not in tt.TaskRegistry.names():
        tt.TaskRegistry.add(
            "beam_span_corruption",
            source=tt.InMemoryDataSource({"train": [{"text": d} for d in DOCS]}),
            output_features={"inputs": tt.Feature(VOCAB), "targets": tt.Feature(VOCAB)},
            preprocessors=[
                functools.partial(tt.rekey, key_map={"inputs": None, "targets": "text"}),
                tt.tokenize,
                tt.CacheDatasetPlaceholder(),
                tt.span_corruption,
                tt.append_eos_after_trim,
            ],
        )
    '''
)


def _install_module(name, source, tmp_path, monkeypatch):
    module_dir = tmp_path / "modules"
    module_dir.mkdir(exist_ok=True)
    (module_dir / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(module_dir))
    # Beam's multi-process DirectRunner starts fresh Python workers: they find the module via PYTHONPATH.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(module_dir), os.environ.get("PYTHONPATH", "")]))
    sys.modules.pop(name, None)


@pytest.fixture
def spm_tasks_module(tmp_path, monkeypatch):
    """The T5-style task module, over a unigram model trained here (T5's special ids)."""
    import sentencepiece

    model_dir = tmp_path / "spm"
    model_dir.mkdir()
    corpus = model_dir / "corpus.txt"
    corpus.write_text("\n".join(tt.generate_corpus(300, seed=5)))
    sentencepiece.SentencePieceTrainer.train(
        input=str(corpus),
        model_prefix=str(model_dir / "t5like"),
        vocab_size=400,
        model_type="unigram",
        pad_id=0,
        eos_id=1,
        unk_id=2,
        bos_id=-1,
        hard_vocab_limit=False,
        num_threads=1,
        minloglevel=2,
    )
    monkeypatch.setenv("T5X_BEAM_TEST_SPM_MODEL", str(model_dir / "t5like.model"))
    _install_module("beam_cache_spm_tasks", SPM_TASKS_MODULE, tmp_path, monkeypatch)
    yield "beam_cache_spm_tasks"
    sys.modules.pop("beam_cache_spm_tasks", None)
    if "beam_span_corruption" in tt.TaskRegistry.names():
        tt.TaskRegistry.remove("beam_span_corruption")


@pytest.fixture
def tasks_module(tmp_path, monkeypatch):
    _install_module("beam_cache_test_tasks", TASKS_MODULE, tmp_path, monkeypatch)
    yield "beam_cache_test_tasks"
    sys.modules.pop("beam_cache_test_tasks", None)
    for name in ("beam_cached", "beam_broken"):
        if name in tt.TaskRegistry.names():
            tt.TaskRegistry.remove(name)


def run_cache(module, task, out_dir, *extra, mode="multi_processing", workers=2):
    from t5x.tasks._cache_cli import main

    return main(
        [
            f"--module_import={module}",
            f"--tasks={task}",
            f"--output_cache_dir={out_dir}",
            "--num_input_shards=4",
            "--num_shards=3",
            "--runner=DirectRunner",
            f"--direct_running_mode={mode}",
            f"--direct_num_workers={workers}",
            *extra,
        ]
    )


def key(example):
    return (bytes(example["inputs"].tobytes()), bytes(example["targets"].tobytes()))


def full_key(example):
    """Every feature of an example, values and dtypes, as something sortable."""
    return tuple(
        (name, str(getattr(value, "dtype", type(value))), getattr(value, "tobytes", lambda v=value: v)())
        for name, value in sorted(example.items())
    )


@pytest.mark.slow
@needs_beam
def test_cache_equals_uncached_fixed_order_and_shards(tasks_module, tmp_path):
    out = tmp_path / "cache"
    assert run_cache(tasks_module, "beam_cached", out, "--seed=7") == 0
    task = tt.TaskRegistry.get("beam_cached")
    task_dir = task_cache_dir(str(out), "beam_cached")
    assert os.path.exists(os.path.join(task_dir, COMPLETED))
    assert sorted(f for f in os.listdir(task_dir) if f.startswith("train.tfrecord")) == [
        f"train.tfrecord-0000{i}-of-00003" for i in range(3)
    ]
    with open(os.path.join(task_dir, "stats.train.json")) as f:
        stats = json.load(f)
    assert stats["examples"] == 40

    uncached = list(task.get_dataset(split="train", shuffle=False).as_numpy_iterator())
    cached_ds = task.preprocess_postcache(read_cached_split("beam_cached", "train", cache_dirs=[str(out)]))
    cached = list(cached_ds.as_numpy_iterator())
    assert sorted(map(key, cached)) == sorted(map(key, uncached))  # equal as multisets
    assert stats["targets_tokens"] == sum(
        len(x["targets"]) - 1 for x in uncached
    )  # EOS is added after the cache
    assert list(map(key, cached)) != list(map(key, uncached))  # globally shuffled ...
    again = list(read_cached_split("beam_cached", "train", cache_dirs=[str(out)]).as_numpy_iterator())
    assert [key(x) for x in again] == [
        key(x) for x in read_cached_split("beam_cached", "train", cache_dirs=[str(out)]).as_numpy_iterator()
    ]

    # ... in an order fixed by the seed: a second job (other worker timing) writes the same order.
    out2 = tmp_path / "cache2"
    assert run_cache(tasks_module, "beam_cached", out2, "--seed=7", mode="multi_threading", workers=3) == 0
    order2 = [
        key(x) for x in read_cached_split("beam_cached", "train", cache_dirs=[str(out2)]).as_numpy_iterator()
    ]
    assert order2 == [key(x) for x in again]
    out3 = tmp_path / "cache3"
    assert run_cache(tasks_module, "beam_cached", out3, "--seed=8", mode="in_memory", workers=1) == 0
    order3 = [
        key(x) for x in read_cached_split("beam_cached", "train", cache_dirs=[str(out3)]).as_numpy_iterator()
    ]
    assert order3 != order2 and sorted(order3) == sorted(order2)

    # Host sharding: disjoint shards whose union is the split, for whole-file and per-example sharding.
    for n in (2, 5):
        parts = [
            [
                key(x)
                for x in read_cached_split(
                    "beam_cached", "train", ShardInfo(i, n), cache_dirs=[str(out)]
                ).as_numpy_iterator()
            ]
            for i in range(n)
        ]
        assert sorted(k for p in parts for k in p) == sorted(map(key, again))

    # get_dataset(use_cached=True) reads the same cache through the global cache dirs.
    set_global_cache_dirs([str(out)])
    try:
        via_task = task.get_dataset(split="validation", shuffle=False, use_cached=True)
    finally:
        set_global_cache_dirs([])
    want = task.get_dataset(split="validation", shuffle=False)
    assert sorted(map(key, via_task.as_numpy_iterator())) == sorted(map(key, want.as_numpy_iterator()))


@pytest.mark.slow
@needs_beam
def test_sentencepiece_task_with_sentinels_caches(spm_tasks_module, tmp_path):
    """A T5 task (SentencePiece, extra_ids=100, span corruption) through Beam's multi-process runner.

    Beam's environment has an older protobuf than SentencePiece's generated
    ``sentencepiece_model_pb2`` needs, so adding the sentinels must not import it.
    """
    out = tmp_path / "cache"
    assert run_cache(spm_tasks_module, "beam_span_corruption", out, "--seed=3") == 0
    task = tt.TaskRegistry.get("beam_span_corruption")
    vocab = task.output_features["targets"].vocabulary
    assert vocab.extra_ids == 100

    # The cache holds exactly what the uncached pipeline makes before the placeholder.
    cached = list(
        read_cached_split("beam_span_corruption", "train", cache_dirs=[str(out)]).as_numpy_iterator()
    )
    precache = task.preprocess_precache(task.source_dataset("train", shuffle=False))
    uncached = list(precache.as_numpy_iterator())
    assert len(cached) == len(uncached) == 48
    assert sorted(map(full_key, cached)) == sorted(map(full_key, uncached))
    for example in uncached:
        assert vocab.decode(example["targets"]) == example["targets_pretokenized"].decode()

    # Span corruption after the cache gives the same examples from the cache as from the
    # same tokens fed in the same order, and its inputs carry the sentinels.
    lengths = {"inputs": 64, "targets": 32}
    by_key = {full_key(x): x for x in uncached}
    same_order = [by_key[full_key(x)] for x in cached]
    from_cache = task.preprocess_postcache(
        read_cached_split("beam_span_corruption", "train", cache_dirs=[str(out)]), lengths, seed=5
    )
    from_memory = task.preprocess_postcache(
        tf.data.Dataset.from_generator(
            lambda: iter(same_order),
            output_signature=precache.element_spec,
        ),
        lengths,
        seed=5,
    )
    got = list(from_cache.as_numpy_iterator())
    want = list(from_memory.as_numpy_iterator())
    assert [key(x) for x in got] == [key(x) for x in want]
    sentinel_ids = set(range(vocab.vocab_size - 100, vocab.vocab_size))
    assert all(sentinel_ids & set(x["inputs"].tolist()) for x in got)
    assert "<extra_id_0>" in vocab.decode(got[0]["inputs"])


@needs_beam
def test_interrupted_job_leaves_no_marker_and_is_refused(tasks_module, tmp_path):
    out = tmp_path / "cache"
    with pytest.raises(Exception, match="simulated worker crash"):
        run_cache(tasks_module, "beam_broken", out, mode="multi_threading")
    task_dir = task_cache_dir(str(out), "beam_broken")
    # Whatever the crashed job left, it is never taken for a cache: no completion marker, and an
    # empty task folder is removed with the attempt (the root too: this attempt made it).
    assert not os.path.exists(os.path.join(task_dir, COMPLETED))
    assert not (os.path.isdir(task_dir) and not os.listdir(task_dir))
    with pytest.raises(ValueError, match="t5x-tasks cache --module_import"):
        read_cached_split("beam_broken", "train", cache_dirs=[str(out)])


@needs_beam
def test_task_without_placeholder_is_refused(tasks_module, tmp_path, vocab):
    tt.TaskRegistry.add(
        "beam_no_placeholder",
        source=tt.InMemoryDataSource({"train": [{"inputs": "a", "targets": "b"}]}),
        output_features={"inputs": tt.Feature(vocab), "targets": tt.Feature(vocab)},
        preprocessors=[tt.tokenize],
    )
    try:
        assert (
            run_cache(tasks_module, "beam_no_placeholder", tmp_path / "c", mode="in_memory", workers=1) == 2
        )
    finally:
        tt.TaskRegistry.remove("beam_no_placeholder")


def test_missing_and_incomplete_caches_say_how_to_build(tmp_path):
    with pytest.raises(ValueError, match="no cache folders are set"):
        find_task_cache("some_task", cache_dirs=[])
    with pytest.raises(ValueError, match=r"no cache found in .*--tasks=some_task"):
        read_cached_split("some_task", "train", cache_dirs=[str(tmp_path)])
    os.makedirs(task_cache_dir(str(tmp_path), "some_task"))
    with pytest.raises(ValueError, match="incomplete \\(no COMPLETED marker"):
        read_cached_split("some_task", "train", cache_dirs=[str(tmp_path)])
    (tmp_path / "some_task" / COMPLETED).write_text(json.dumps({"task": "some_task", "splits": ["train"]}))
    with pytest.raises(ValueError, match="has no split 'validation'; it has \\['train'\\]"):
        read_cached_split("some_task", "validation", cache_dirs=[str(tmp_path)])


def test_global_cache_dirs():
    before = get_global_cache_dirs()
    try:
        set_global_cache_dirs(["/a"])
        add_global_cache_dirs(["/b", "/a"])
        assert get_global_cache_dirs() == ["/a", "/b"]
        with pytest.raises(TypeError, match="list of folders"):
            add_global_cache_dirs("/c")
    finally:
        set_global_cache_dirs(before)
