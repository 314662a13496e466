"""seqio's loggers (call convention and file formats) and ``utils.LazyTfdsLoader``."""

from __future__ import annotations

import dataclasses
import json
import sys
import types
from unittest import mock

import numpy as np
import pytest
import tensorflow as tf

import t5x.seqio as seqio
from t5x.seqio import loggers, metrics, utils


def _events(folder):
    (path,) = tf.io.gfile.glob(f"{folder}/*")
    return [tf.compat.v1.Event.FromString(r.numpy()) for r in tf.data.TFRecordDataset(path)][1:]


def _examples():
    rows = [{"inputs_pretokenized": "i0", "targets_pretokenized": "t0"}, {"inputs_pretokenized": "i1"}]
    rows[1]["targets_pretokenized"] = "t1"
    return tf.data.Dataset.from_generator(
        lambda: iter(rows), output_signature={k: tf.TensorSpec([], tf.string) for k in rows[0]}
    )


def test_json_logger_writes_seqio_metrics_and_inference_lines(tmp_path):
    logger = loggers.JSONLogger(str(tmp_path), write_n_results=None)
    logger(
        task_name="t",
        step=7,
        metrics={
            "acc": metrics.Scalar(50),
            "txt": metrics.Text("hi"),
            "img": metrics.Image(np.ones((1, 2, 2, 3))),
        },
        dataset=_examples(),
        inferences={"prediction": [b"\x99", object()], "score": [0.5, 0.25], "aux_value": {"len": [3, 4]}},
        targets=["a", "b"],
    )
    logger("t", 8, {"acc": 60.0}, None, None, None)  # a plain number is a scalar; no inference file
    lines = [json.loads(x) for x in (tmp_path / "t-metrics.jsonl").read_text().splitlines()]
    assert lines == [{"step": 7, "acc": 50, "txt": "hi"}, {"step": 8, "acc": 60.0}]  # images are not JSON
    rows = [json.loads(x) for x in (tmp_path / "t-000007.jsonl").read_text().splitlines()]
    assert rows[0] == {
        "input": {"inputs_pretokenized": "i0", "targets_pretokenized": "t0"},
        "target": "a",
        "prediction": "mQ==",  # bytes that are not UTF-8 come out base64
        "score": 0.5,
        "aux_len": 3,
    }
    assert "prediction" not in rows[1]  # what the encoder cannot write is left out
    assert not (tmp_path / "t-000008.jsonl").exists()


def test_json_logger_accepts_the_core_evaluator_call(tmp_path):
    # The core Evaluator passes example dicts and plural inference keys; the seqio logger takes both.
    examples = [{"inputs": np.array([3, 4]), "targets_pretokenized": b"x"}]
    inferences = {"predictions": ["p"], "scores": [0.1], "aux_values": [{"n": 2}]}
    loggers.JSONLogger(str(tmp_path))("t", 1, {"m": 1.0}, examples, inferences, ["x"])
    (row,) = [json.loads(x) for x in (tmp_path / "t-000001.jsonl").read_text().splitlines()]
    assert row == {"input": {"inputs": [3, 4], "targets_pretokenized": "x"}, "target": "x",
                   "prediction": "p", "score": 0.1, "aux_n": 2}  # fmt: skip


def test_tensor_and_numpy_encoder_summarizes_long_arrays_and_dataclasses():
    @dataclasses.dataclass
    class Point:
        x: int
        label: str | None = None

    enc = loggers.TensorAndNumpyEncoder()
    assert enc.encode(tf.constant([1, 2])) == "[1, 2]"
    assert enc.encode(np.arange(40, dtype=np.int32)) == (
        '"ndarray(shape=(40,), dtype=int32); summary: 0, 1, 2, 3, 4 ... 35, 36, 37, 38, 39"'
    )
    assert enc.encode(Point(1)) == '{"x": 1}'


def test_tensorboard_loggers_write_each_kind_with_its_plugin(tmp_path):
    loggers.TensorBoardLogger(str(tmp_path / "v2"))(
        "t", 3, {"s": metrics.Scalar(2), "x": metrics.Text("hey"), "h": metrics.Histogram(np.arange(10), bins=2),
                 "i": metrics.Image(np.zeros((3, 2, 5, 3), np.uint8), max_outputs=2)},
        None, {}, [],
    )  # fmt: skip
    values = {e.summary.value[0].tag: e.summary.value[0] for e in _events(tmp_path / "v2" / "t")}
    plugins = {k: v.metadata.plugin_data.plugin_name for k, v in values.items()}
    assert plugins == {"eval/s": "scalars", "eval/x": "text", "eval/h": "histograms", "eval/i": "images"}
    assert float(tf.make_ndarray(values["eval/s"].tensor)) == 2.0
    np.testing.assert_array_equal(tf.make_ndarray(values["eval/h"].tensor), [[0, 4.5, 5], [4.5, 9, 5]])
    image = tf.make_ndarray(values["eval/i"].tensor)
    assert list(image[:2]) == [b"5", b"2"] and len(image) == 4  # width, height, then max_outputs PNGs
    loggers.TensorBoardLoggerV1(str(tmp_path / "v1"))("t", 3, {"s": metrics.Scalar(2)}, None, {}, [])
    (event,) = _events(tmp_path / "v1" / "t")
    assert event.summary.value[0].simple_value == 2.0 and event.step == 3


@pytest.fixture
def fake_tfds(monkeypatch):
    """A stand-in ``tensorflow_datasets`` module recording what the loader asks of it."""
    module = types.ModuleType("tensorflow_datasets")
    module.builder = mock.Mock(side_effect=lambda name, data_dir: f"builder:{name}:{data_dir}")
    module.load = mock.Mock(return_value="dataset")

    class ReadConfig:
        shuffle_seed = None
        skip_prefetch = False
        shuffle_reshuffle_each_iteration = None

    module.ReadConfig = ReadConfig
    monkeypatch.setitem(sys.modules, "tensorflow_datasets", module)
    monkeypatch.setattr(utils.LazyTfdsLoader, "_MEMOIZED_BUILDERS", {})
    return module


def test_lazy_tfds_loader_memoizes_builders_and_maps_splits(fake_tfds):
    with pytest.raises(ValueError, match="must contain a version number, got: plain"):
        utils.LazyTfdsLoader("plain")
    a = utils.LazyTfdsLoader("ds/c:1.0.0", split_map={"train": "validation"})
    assert a.builder == "builder:ds/c:1.0.0:None" and a.builder is utils.LazyTfdsLoader("ds/c:1.0.0").builder
    assert fake_tfds.builder.call_count == 1  # one builder per (name, data_dir), shared
    assert utils.LazyTfdsLoader("ds/c:1.0.0", "dir").builder == "builder:ds/c:1.0.0:dir"
    a.load("train", shuffle_files=False, seed=5)
    _, kwargs = fake_tfds.load.call_args
    assert kwargs["split"] == "validation" and kwargs["read_config"].shuffle_seed == 5
    assert kwargs["read_config"].skip_prefetch
    assert str(a) == "LazyTfdsLoader(name=ds/c:1.0.0, data_dir=None)"


def test_lazy_tfds_loader_data_dir_overrides(fake_tfds):
    utils.set_tfds_data_dir_override("/global")
    try:
        loader = utils.LazyTfdsLoader("d:1.0.0", data_dir="/own")
        assert loader.data_dir == "/global" and loader.builder == "builder:d:1.0.0:/global"
        loader.override_data_dir("/mine")  # the loader's own override wins over the global one
        assert loader.data_dir == "/mine" and loader.builder == "builder:d:1.0.0:/mine"
    finally:
        utils.set_tfds_data_dir_override(None)
    assert utils.LazyTfdsLoader("d:1.0.0", data_dir="/own").data_dir == "/own"


def test_lazy_tfds_loader_sizes_and_tfds_splits(fake_tfds):
    split = mock.Mock(num_examples=12, file_instructions=["f0", "f1"])
    utils.LazyTfdsLoader._MEMOIZED_BUILDERS[("a:1.0.0", None)] = mock.Mock(
        info=mock.Mock(splits={"test": split})
    )
    with pytest.raises(ValueError, match="`name` and `data_dir` must be `None`"):
        utils.LazyTfdsLoader("a:1.0.0", split_map={"train": utils.TfdsSplit("a:1.0.0", "test")})
    loader = utils.LazyTfdsLoader(split_map={"train": utils.TfdsSplit("a:1.0.0", "test")})
    assert loader.size("train") == 12 and loader.files("train") == ["f0", "f1"]
    with pytest.raises(KeyError):
        loader.size("validation")


def test_tfds_data_source_reads_through_the_patchable_loader(monkeypatch):
    fake = mock.Mock()
    fake.files.return_value = [{"filename": "x-00000-of-00002"}, {"filename": "x-00001-of-00002"}]
    fake.size.return_value = 9
    fake.load.return_value = tf.data.Dataset.from_tensors({"text": "hi"})
    monkeypatch.setattr(utils, "LazyTfdsLoader", mock.Mock(return_value=fake))
    source = seqio.TfdsDataSource("any:1.0.0", splits=["train"])
    assert source.splits == ("train",) and source.tfds_dataset is fake
    assert source.list_shards("train") == ["x-00000-of-00002", "x-00001-of-00002"]
    assert source.num_input_examples("train") == 9
    assert next(iter(source.get_dataset("train", shuffle=False)))["text"] == b"hi"
    fake.load.assert_called_once_with("train", shuffle_files=False, seed=None, shard_info=None)
