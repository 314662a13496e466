"""TFDS / Hugging Face sources, with the optional packages replaced by small fakes."""

import sys
import types

import pytest

import t5x.tasks as tt
from t5x.interfaces import ShardInfo


def test_missing_package_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)
    with pytest.raises(ImportError, match=r"t5x-tasks\[tfds\]"):
        _ = tt.TfdsDataSource("c4/en:3.0.1").builder
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(ImportError, match=r"t5x-tasks\[hf\]"):
        _ = tt.HuggingFaceDataSource(dataset_path="/x").splits


def test_tfds_not_prepared_fails_fast_without_network(monkeypatch, tmp_path):
    calls = []

    class Builder:
        data_dir = str(tmp_path / "c4" / "en" / "3.0.1")

        def download_and_prepare(self, *a, **k):  # must never be called
            calls.append("download")

    fake = types.SimpleNamespace(builder=lambda name, data_dir=None: Builder())
    monkeypatch.setitem(sys.modules, "tensorflow_datasets", fake)
    source = tt.TfdsDataSource("c4/en:3.0.1", tfds_data_dir=str(tmp_path), splits=["train"])
    with pytest.raises(FileNotFoundError, match=r"'c4/en:3.0.1' is not prepared .* never downloads"):
        source.get_dataset("train")
    assert calls == []
    with pytest.raises(ValueError, match="must include a version"):
        tt.TfdsDataSource("c4/en")


class _Feature:
    def __init__(self, dtype=None, feature=None):
        self.dtype, self.feature = dtype, feature


class _Table:
    def __init__(self, rows):
        self.rows = rows
        self.features = {"text": _Feature("string"), "ids": _Feature(feature=_Feature("int64"))}

    def __len__(self):
        return len(self.rows)

    def __iter__(self):
        return iter(self.rows)

    def shard(self, num_shards, index, contiguous):
        n = len(self.rows)
        size, extra = divmod(n, num_shards)
        start = index * size + min(index, extra)
        return _Table(self.rows[start : start + size + (index < extra)])


def test_huggingface_from_disk_shards_and_converts(monkeypatch):
    rows = [{"text": f"t{i}", "ids": list(range(i % 3))} for i in range(10)]
    fake = types.SimpleNamespace(load_from_disk=lambda path: {"train": _Table(rows)})
    monkeypatch.setitem(sys.modules, "datasets", fake)
    source = tt.HuggingFaceDataSource(dataset_path="/data/saved")
    assert source.splits == ("train",) and source.num_input_examples("train") == 10
    seen = []
    for i in range(4):
        shard = list(
            source.get_dataset("train", shuffle=False, shard_info=ShardInfo(i, 4)).as_numpy_iterator()
        )
        seen.extend(r["text"].decode() for r in shard)
    assert sorted(seen) == sorted(r["text"] for r in rows) and len(seen) == 10
    first = next(source.get_dataset("train", shuffle=False).as_numpy_iterator())
    assert first["ids"].tolist() == []
    with pytest.raises(ValueError, match="exactly one of dataset_path or builder"):
        tt.HuggingFaceDataSource()
