"""seqio.beam_utils: seqio's Beam transforms, run on Beam's DirectRunner (the `beam` nox session)."""

from __future__ import annotations

import json

import numpy as np
import pytest

beam = pytest.importorskip("apache_beam")

import tensorflow as tf  # noqa: E402
from apache_beam.testing import util  # noqa: E402
from apache_beam.testing.test_pipeline import TestPipeline as BeamPipeline  # noqa: E402

from t5x import seqio  # noqa: E402
from t5x.seqio import beam_utils  # noqa: E402

VOCAB = seqio.ByteVocabulary()  # id = byte + 3; pad 0, EOS 1


def _ids(text: str) -> list[int]:
    return [b + 3 for b in text.encode()]


def _split_line(ds):
    def fn(line):
        inputs, targets = tf.strings.split(line, "\t")[0], tf.strings.split(line, "\t")[1]
        return {"inputs": inputs, "targets": targets}

    return ds.map(fn)


@pytest.fixture
def task(tmp_path, clean_registry):
    """A two-file TextLine task: split on a tab, tokenize with bytes, cache cut after tokenizing."""
    (tmp_path / "a.tsv").write_text("ab\tc\nd\tef\n")
    (tmp_path / "b.tsv").write_text("g\th\n")
    features = {
        "inputs": seqio.Feature(VOCAB, add_eos=True),
        "targets": seqio.Feature(VOCAB, add_eos=True),
    }
    return seqio.TaskRegistry.add(
        "beam_utils_task",
        source=seqio.TextLineDataSource({"train": str(tmp_path / "*.tsv")}),
        preprocessors=[_split_line, seqio.preprocessors.tokenize, seqio.CacheDatasetPlaceholder()],
        output_features=features,
    )


def _plain(ex):
    def value(v):
        v = v.numpy() if isinstance(v, tf.Tensor) else v
        return v.tolist() if isinstance(v, np.ndarray) else v

    return {k: value(v) for k, v in ex.items()}


def test_preprocess_task_emits_precache_examples_with_provenance(task, tmp_path):
    shard_a, shard_b = sorted(task.source.list_shards("train"))
    with BeamPipeline() as p:
        out = (
            p
            | beam_utils.PreprocessTask(task, "train", preprocessors_seed=7, add_provenance=True)
            | beam.Map(_plain)
        )

        def provenance(shard, index, position):
            return {
                "provenance/task": "beam_utils_task",
                "provenance/source_shard": shard,
                "provenance/source_shard_index": index,
                "provenance/index_within_shard": position,
                "provenance/preprocessors_seed": 7,
            }

        expected = [
            {"inputs_pretokenized": b"ab", "inputs": _ids("ab"), "targets_pretokenized": b"c",
             "targets": _ids("c"), **provenance(shard_a, 0, 0)},
            {"inputs_pretokenized": b"d", "inputs": _ids("d"), "targets_pretokenized": b"ef",
             "targets": _ids("ef"), **provenance(shard_a, 0, 1)},
            {"inputs_pretokenized": b"g", "inputs": _ids("g"), "targets_pretokenized": b"h",
             "targets": _ids("h"), **provenance(shard_b, 1, 0)},
        ]  # fmt: skip
        util.assert_that(out, util.equal_to(expected))


def test_preprocess_task_without_provenance_has_only_features(task):
    with BeamPipeline() as p:
        out = p | beam_utils.PreprocessTask(task, "train") | beam.Map(lambda ex: sorted(ex))
        keys = ["inputs", "inputs_pretokenized", "targets", "targets_pretokenized"]
        util.assert_that(out, util.equal_to([keys] * 3))


def test_shard_seed_is_deterministic_per_task_and_shard():
    assert beam_utils.shard_seed("t", 0, 5) == beam_utils.shard_seed("t", 0, 5)
    assert beam_utils.shard_seed("t", 0, 5) != beam_utils.shard_seed("t", 1, 5)
    assert beam_utils.shard_seed("t", 0, 5) - beam_utils.shard_seed("t", 0, None) == 5
    assert 0 <= beam_utils.shard_seed("u", 3, None) < 2**63 - 1


def test_write_tfrecord_info_and_stats_form_a_readable_cache(task, tmp_path):
    out = tmp_path / "cache"
    with BeamPipeline() as p:
        examples = p | beam_utils.PreprocessTask(task, "train")
        _ = examples | beam_utils.WriteExampleTfRecord(str(out / "train.tfrecord"), num_shards=2)
        _ = (
            examples
            | beam_utils.GetInfo(num_shards=2)
            | "info" >> beam_utils.WriteJson(str(out / "info.json"))
        )
        _ = (
            examples
            | beam_utils.GetStats(task.output_features)
            | "stats" >> beam_utils.WriteJson(str(out / "stats.json"))
        )
    files = sorted(out.glob("train.tfrecord-*"))
    assert [f.name for f in files] == ["train.tfrecord-00000-of-00002", "train.tfrecord-00001-of-00002"]
    info = json.loads((out / "info.json").read_text())
    assert info["num_shards"] == 2
    assert info["seqio_version"] == seqio.__version__
    assert info["features"]["inputs"] == {"shape": [None], "dtype": "int32"}
    assert info["features"]["inputs_pretokenized"] == {"shape": [], "dtype": "string"}
    stats = json.loads((out / "stats.json").read_text())
    assert stats == {
        "examples": 3,
        "inputs_tokens": 4,
        "inputs_max_tokens": 2,
        "targets_tokens": 4,
        "targets_max_tokens": 2,
    }
    read = [tf.train.Example.FromString(r.numpy()) for r in tf.data.TFRecordDataset([str(f) for f in files])]
    targets = sorted(list(ex.features.feature["targets"].int64_list.value) for ex in read)
    assert targets == sorted([_ids("c"), _ids("ef"), _ids("h")])


def test_get_stats_skips_eos_and_padding_and_counts_characters():
    features = {"targets": seqio.Feature(VOCAB), "text": seqio.Feature(VOCAB, dtype=tf.string)}
    examples = [
        {"targets": np.array([5, 6, 1, 0, 0], np.int32), "text": b"hello"},
        {"targets": np.array([7, 1], np.int64), "text": b"hi"},
    ]
    with BeamPipeline() as p:
        stats = (
            p
            | beam.Create(examples)
            | beam_utils.GetStats(features, task_ids={"a": np.int64(3)}, enable_char_counts=True)
        )
        util.assert_that(
            stats,
            util.equal_to(
                [
                    {
                        "examples": 2,
                        "targets_tokens": 3,
                        "targets_max_tokens": 2,
                        "text_chars": 7,
                        "task_ids": {"a": 3},
                    }
                ]
            ),
        )


def test_write_json_prettify(tmp_path):
    with BeamPipeline() as p:
        _ = (
            p
            | "a" >> beam.Create([{"b": 1, "a": [2]}])
            | "pretty" >> beam_utils.WriteJson(str(tmp_path / "p.json"))
        )
        _ = (
            p
            | "b" >> beam.Create([{"b": 1}])
            | "plain" >> beam_utils.WriteJson(str(tmp_path / "q.json"), prettify=False)
        )
    assert (tmp_path / "p.json").read_text() == '{\n  "a": [\n    2\n  ],\n  "b": 1\n}\n'
    assert (tmp_path / "q.json").read_text() == '{"b": 1}\n'


def test_preprocess_task_without_shards_names_task_and_split(clean_registry, tmp_path):
    task = seqio.TaskRegistry.add(
        "beam_utils_empty",
        source=seqio.FunctionDataSource(
            lambda split, shuffle_files: tf.data.Dataset.range(1), splits=["train"]
        ),
        preprocessors=[],
        output_features={},
    )
    task.source.list_shards = lambda split: []  # a source with nothing to read
    with pytest.raises(FileNotFoundError, match=r"beam_utils_empty.*'train'"):
        beam_utils.PreprocessTask(task, "train")
