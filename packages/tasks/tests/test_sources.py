import json

import numpy as np
import pytest
import tensorflow as tf

import t5x.tasks as tt
from t5x.interfaces import ShardInfo


def _write_lines(tmp_path, num_files, per_file, prefix="part"):
    lines = []
    for f in range(num_files):
        rows = [f"file{f} line{i}" for i in range(per_file)]
        (tmp_path / f"{prefix}-{f:03d}.txt").write_text("\n".join(rows) + "\n")
        lines.extend(rows)
    return lines


def _texts(ds, key="text"):
    return [x[key].decode() for x in ds.as_numpy_iterator()]


def test_text_lines_glob_and_split_info(tmp_path):
    lines = _write_lines(tmp_path, 3, 5)
    source = tt.TextLineDataSource({"train": str(tmp_path / "part-*.txt")}, num_input_examples={"train": 15})
    assert source.splits == ("train",)
    assert len(source.list_shards("train")) == 3
    assert source.num_input_examples("train") == 15
    assert sorted(_texts(source.get_dataset("train", shuffle=False))) == sorted(lines)
    with pytest.raises(ValueError, match="no split 'test'"):
        source.get_dataset("test")


def test_text_lines_skip_header(tmp_path):
    (tmp_path / "a.tsv").write_text("header\nx\ty\n")
    source = tt.TextLineDataSource({"train": str(tmp_path / "a.tsv")}, skip_header_lines=1)
    assert _texts(source.get_dataset("train", shuffle=False)) == ["x\ty"]


@pytest.mark.parametrize("num_files", [8, 2])  # 8 files: shard by files; 2 files: by examples
def test_sharding_disjoint_and_complete(tmp_path, num_files):
    lines = _write_lines(tmp_path, num_files, 10)
    source = tt.TextLineDataSource({"train": str(tmp_path / "part-*.txt")})
    shards = [
        _texts(source.get_dataset("train", shuffle=True, seed=5, shard_info=ShardInfo(i, 4)))
        for i in range(4)
    ]
    flat = [x for s in shards for x in s]
    assert len(flat) == len(set(flat)) == len(lines)
    assert set(flat) == set(lines)
    assert all(shards)


def test_file_shuffle_is_seeded(tmp_path):
    _write_lines(tmp_path, 6, 3)
    source = tt.TextLineDataSource({"train": str(tmp_path / "part-*.txt")})
    a = _texts(source.get_dataset("train", shuffle=True, seed=1))
    b = _texts(source.get_dataset("train", shuffle=True, seed=1))
    assert a == b
    orders = {tuple(_texts(source.get_dataset("train", shuffle=True, seed=s))) for s in range(6)}
    assert len(orders) > 1


def test_tfrecord_examples(tmp_path):
    path = str(tmp_path / "data.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
        for i in range(5):
            ex = tf.train.Example(
                features=tf.train.Features(
                    feature={
                        "text": tf.train.Feature(bytes_list=tf.train.BytesList(value=[f"doc {i}".encode()])),
                        "ids": tf.train.Feature(int64_list=tf.train.Int64List(value=list(range(i)))),
                    }
                )
            )
            writer.write(ex.SerializeToString())
    source = tt.TFExampleDataSource(
        {"train": path},
        {"text": tf.io.FixedLenFeature([], tf.string), "ids": tf.io.VarLenFeature(tf.int64)},
    )
    rows = list(source.get_dataset("train", shuffle=False).as_numpy_iterator())
    assert [r["text"].decode() for r in rows] == [f"doc {i}" for i in range(5)]
    assert [r["ids"].tolist() for r in rows] == [list(range(i)) for i in range(5)]


def test_json_lines_infers_fields(tmp_path):
    path = tmp_path / "d.jsonl"
    rows = [{"question": f"q{i}", "answer": f"a{i}", "score": i * 0.5, "ids": [i, i + 1]} for i in range(4)]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    source = tt.JsonLinesDataSource({"validation": str(path)})
    got = list(source.get_dataset("validation", shuffle=False).as_numpy_iterator())
    assert [g["question"].decode() for g in got] == [r["question"] for r in rows]
    assert np.allclose([g["score"] for g in got], [r["score"] for r in rows])
    assert [g["ids"].tolist() for g in got] == [r["ids"] for r in rows]
    assert source.get_dataset("validation").element_spec["ids"].shape.as_list() == [None]


def test_function_source_passes_seed_and_shards():
    calls = []

    def fn(split, shuffle_files, seed=None):
        calls.append((split, shuffle_files, seed))
        return tf.data.Dataset.range(10).map(lambda i: {"x": i})

    source = tt.FunctionDataSource(fn, splits=["train"], num_input_examples={"train": 10})
    got = [int(x["x"]) for x in source.get_dataset("train", True, 7, ShardInfo(1, 3)).as_numpy_iterator()]
    assert got == [1, 4, 7]
    assert calls == [("train", True, 7)]
    assert source.num_input_examples("train") == 10


def test_in_memory_source_ragged_and_empty_shard():
    source = tt.InMemoryDataSource({"train": [{"ids": [1, 2, 3], "t": "a"}, {"ids": [4], "t": "b"}]})
    rows = list(source.get_dataset("train", shuffle=False).as_numpy_iterator())
    assert [r["ids"].tolist() for r in rows] == [[1, 2, 3], [4]]
    with pytest.raises(ValueError, match="shard 2 of 3 has no examples"):
        source.get_dataset("train", shard_info=ShardInfo(2, 3))


def test_glob_matching_nothing_names_the_pattern(tmp_path):
    source = tt.TextLineDataSource({"train": str(tmp_path / "nope-*.txt")})
    with pytest.raises(FileNotFoundError, match="nope-"):
        source.list_shards("train")
