"""Bad data files are named: the JSON Lines line, the corrupt TFRecord file, the CLI's exit code."""

import json

import pytest
import tensorflow as tf

import t5x.tasks as tt
from t5x.feature_converters import EncDecFeatureConverter
from t5x.tasks._cache_cli import remove_empty_cache_dirs
from t5x.tasks._cli import main as tasks_main
from t5x.tasks._sources import data_source_error

LENGTHS = {"inputs": 16, "targets": 16}


def _register(name, source, vocab):
    features = {"inputs": tt.Feature(vocab), "targets": tt.Feature(vocab)}
    tt.TaskRegistry.add(
        name, source=source, output_features=features, preprocessors=[tt.tokenize, tt.append_eos]
    )


def _first_batch(name):
    iterator = tt.BatchIterator(name, EncDecFeatureConverter(pack=False), LENGTHS, 2, shuffle=False)
    return next(iterator)


def _jsonl(path, lines):
    path.write_bytes(b"\n".join(line if isinstance(line, bytes) else line.encode() for line in lines) + b"\n")
    return path


GOOD = json.dumps({"inputs": "ab", "targets": "ba"})


@pytest.mark.parametrize(
    ("bad_line", "expected"),
    [
        ('{"inputs": "x", }', "invalid JSON (Expecting property name enclosed in double quotes"),
        ('{"inputs": 3, "targets": "b"}', "field 'inputs' is 3, expected string values"),
        ('{"inputs": "x"}', "the record lacks field 'targets'"),
        ('["inputs", "targets"]', "expected a JSON object, got list"),
        (b'{"inputs": "\xff", "targets": "b"}', "not UTF-8 text"),
    ],
)
def test_a_bad_json_lines_record_is_named_by_file_and_line(
    tmp_path, vocab, clean_registry, bad_line, expected
):
    # Line 4: the blank line 3 still counts.
    path = _jsonl(tmp_path / "data.jsonl", [GOOD, GOOD, "", bad_line, GOOD])
    _register("jsonl_bad", tt.JsonLinesDataSource({"train": str(path)}), vocab)
    with pytest.raises(tt.DataSourceError) as error:
        _first_batch("jsonl_bad")
    assert str(error.value).startswith(f"{path}:4: {expected}")


def test_a_bad_first_line_is_named_when_fields_are_inferred(tmp_path):
    path = _jsonl(tmp_path / "data.jsonl", ["{not json", GOOD])
    source = tt.JsonLinesDataSource({"train": str(path)})
    with pytest.raises(
        tt.DataSourceError, match=rf"^{path}:1: invalid JSON .*the first line gives the fields"
    ):
        _ = source.fields


def test_good_json_lines_still_read(tmp_path):
    path = _jsonl(tmp_path / "d.jsonl", [json.dumps({"t": "a", "n": 1, "x": 0.5, "ids": [1, 2]}), ""])
    _jsonl(path, [path.read_text().strip(), json.dumps({"t": "b", "n": 2, "x": 1, "ids": []})])
    rows = list(tt.JsonLinesDataSource({"train": str(path)}).get_dataset("train", shuffle=False))
    assert [r["t"].numpy() for r in rows] == [b"a", b"b"]
    assert [float(r["x"]) for r in rows] == [0.5, 1.0]
    assert [r["ids"].numpy().tolist() for r in rows] == [[1, 2], []]


def _write_tfrecord(path, n=20):
    with tf.io.TFRecordWriter(str(path)) as writer:
        for i in range(n):
            feature = {
                k: tf.train.Feature(bytes_list=tf.train.BytesList(value=[f"text {i}".encode()]))
                for k in ("inputs", "targets")
            }
            writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    return path


DESCRIPTION = {k: tf.io.FixedLenFeature([], tf.string) for k in ("inputs", "targets")}


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_a_corrupt_tfrecord_file_is_named(tmp_path, vocab, clean_registry, damage):
    good = _write_tfrecord(tmp_path / "a.tfrecord")
    bad = _write_tfrecord(tmp_path / "b.tfrecord")
    data = bytearray(bad.read_bytes())
    if damage == "flip":
        data[100] ^= 0xFF
    else:
        del data[-7:]
    bad.write_bytes(bytes(data))
    _register("tfrecord_bad", tt.TFExampleDataSource({"train": [str(good), str(bad)]}, DESCRIPTION), vocab)
    iterator = tt.BatchIterator(
        "tfrecord_bad", EncDecFeatureConverter(pack=False), LENGTHS, 8, shuffle=False, block_size=64
    )
    with pytest.raises(tt.DataSourceError) as error:
        list(zip(range(10), iterator, strict=False))
    message = str(error.value)
    assert message.startswith(f"{bad}: corrupt or truncated data (")
    assert "'tfrecord_bad'" in message


def test_other_tensorflow_errors_are_not_data_errors():
    error = tf.errors.InvalidArgumentError(None, None, "shapes differ")
    assert data_source_error(error, []) is None
    lost = data_source_error(tf.errors.DataLossError(None, None, "corrupted record at 5"), [])
    assert isinstance(lost, tt.DataSourceError) and "corrupted record at 5" in str(lost)


def test_tasks_cli_inspect_names_the_bad_record_and_exits_2(tmp_path, vocab, clean_registry, capsys):
    path = _jsonl(tmp_path / "data.jsonl", [GOOD, "{oops"])
    _register("jsonl_cli", tt.JsonLinesDataSource({"train": str(path)}), vocab)
    assert tasks_main(["inspect", "jsonl_cli", "--n", "5"]) == 2
    assert f"t5x-tasks: error: {path}:2: invalid JSON" in capsys.readouterr().err


def test_tasks_cli_names_a_pattern_matching_no_files(tmp_path, vocab, clean_registry, capsys):
    _register("no_files", tt.TextLineDataSource({"train": str(tmp_path / "none-*.txt")}), vocab)
    assert tasks_main(["inspect", "no_files"]) == 2
    assert "matches no files" in capsys.readouterr().err


def test_a_failed_cache_attempt_leaves_no_empty_folders(tmp_path):
    root = tmp_path / "cache"
    root.mkdir()
    (root / "task_a").mkdir()  # this attempt's, left empty
    remove_empty_cache_dirs(str(root), None)
    assert not root.exists()

    root.mkdir()
    (root / "old_empty").mkdir()  # there before: kept
    (root / "done").mkdir()
    (root / "done" / "COMPLETED").write_text("{}")
    before = {"old_empty", "done"}
    (root / "new_empty").mkdir()
    remove_empty_cache_dirs(str(root), before)
    assert sorted(p.name for p in root.iterdir()) == ["done", "old_empty"]
