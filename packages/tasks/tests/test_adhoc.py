"""adhoc_task: a Task from a user's TFRecord / JSON Lines / text files, without registering it."""

import json

import numpy as np
import pytest

import t5x.tasks
from t5x.tasks import ADHOC_SPLIT, adhoc_task

LENGTHS = {"inputs": 12, "targets": 6}


def _examples(task):
    ds = task.get_dataset(LENGTHS, split=ADHOC_SPLIT, shuffle=False)
    return list(ds.as_numpy_iterator())


@pytest.fixture(scope="module")
def vocabulary():
    return t5x.tasks.builtin_vocabulary()


def test_json_lines_fields_become_inputs_and_targets(tmp_path, vocabulary):
    path = tmp_path / "my-questions.jsonl"
    rows = [{"q": "two plus two", "a": "four", "extra": 3}, {"q": "a very long question here", "a": "no"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    task = adhoc_task(str(path), vocabulary=vocabulary, inputs_key="q", targets_key="a")
    assert task.name == "infer_my_questions"
    assert task.splits == (ADHOC_SPLIT,)
    got = _examples(task)
    assert [e["inputs_pretokenized"].decode() for e in got] == [r["q"] for r in rows]
    assert [e["targets_pretokenized"].decode() for e in got] == [r["a"] for r in rows]
    eos = 1
    for example, row in zip(got, rows, strict=True):
        ids = [*vocabulary.encode(row["q"])[: LENGTHS["inputs"] - 1], eos]
        np.testing.assert_array_equal(example["inputs"], ids)  # trimmed, then EOS
        assert "extra" not in example and "q" not in example


def test_tfrecord_and_text_files_and_the_format_from_the_suffix(tmp_path, vocabulary):
    tf = pytest.importorskip("tensorflow")
    record = tmp_path / "data.tfrecord-00000-of-00001"
    with tf.io.TFRecordWriter(str(record)) as writer:
        for text in ("alpha", "beta"):
            feature = {"text": tf.train.Feature(bytes_list=tf.train.BytesList(value=[text.encode()]))}
            writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    from_records = adhoc_task(str(record), vocabulary=vocabulary, inputs_key="text", name="records")
    assert [e["inputs_pretokenized"] for e in _examples(from_records)] == [b"alpha", b"beta"]
    assert all(e["targets_pretokenized"] == b"" for e in _examples(from_records))  # no targets field

    lines = tmp_path / "prompts.txt"
    lines.write_text("first prompt\nsecond prompt\n")
    from_text = adhoc_task([str(lines)], vocabulary=vocabulary)
    assert [e["inputs_pretokenized"] for e in _examples(from_text)] == [b"first prompt", b"second prompt"]


def test_bad_arguments_are_named(tmp_path, vocabulary):
    with pytest.raises(ValueError, match="no input files"):
        adhoc_task(" , ", vocabulary=vocabulary)
    with pytest.raises(ValueError, match="cannot tell the format of .*inputs.csv.*set file_format"):
        adhoc_task(str(tmp_path / "inputs.csv"), vocabulary=vocabulary)
    with pytest.raises(ValueError, match="file_format must be one of tfrecord, jsonl, text, got 'csv'"):
        adhoc_task(str(tmp_path / "inputs.csv"), vocabulary=vocabulary, file_format="csv")
    with pytest.raises(ValueError, match="no targets; got targets_key='answer'"):
        adhoc_task(str(tmp_path / "a.txt"), vocabulary=vocabulary, targets_key="answer")


def test_example_batches_keep_each_rows_example_and_resume_by_count(tmp_path, vocabulary):
    path = tmp_path / "lines.txt"
    texts = [f"line {i}" for i in range(5)]
    path.write_text("\n".join(texts) + "\n")
    task = adhoc_task(str(path), vocabulary=vocabulary)

    def first_token(ds, lengths):  # a stand-in feature converter: one fixed-shape feature
        return ds.map(lambda x: {"first": x["inputs"][:1]})

    def collect(batches):
        return [
            (row["inputs_pretokenized"].decode(), int(first[0]))
            for batch in batches
            for row, first in zip(batch[t5x.tasks.EXAMPLE_FIELD], batch["first"], strict=True)
        ]

    batches = t5x.tasks.ExampleBatches(task, first_token, LENGTHS, split=ADHOC_SPLIT, rows=2, shard_info=None)
    first = next(batches)
    assert first["first"].shape == (2, 1) and first[t5x.tasks.EXAMPLE_FIELD].dtype == object
    state = batches.get_state()
    assert state == {"examples": 2}
    rest = collect(batches)
    assert [text for text, _ in rest] == texts[2:]
    assert all(token == vocabulary.encode(text)[0] for text, token in rest)
    resumed = t5x.tasks.ExampleBatches(task, first_token, LENGTHS, split=ADHOC_SPLIT, rows=2, shard_info=None)
    resumed.set_state(state)
    assert collect(resumed) == rest
