"""Sources backed by optional packages: TensorFlow Datasets and Hugging Face ``datasets``."""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from t5x.interfaces import ShardInfo
from t5x.tasks._lazy_tf import tf
from t5x.tasks._sources import DataSource


def _require(module: str, extra: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(
            f"{module} is not installed; install it with "
            f"`pip install --find-links dist 't5x-tasks[{extra}]'` "
            "(run in the t5x checkout after `python3 -m nox -s wheels`; see docs/installing.md)"
        ) from e


class TfdsDataSource(DataSource):
    """A TensorFlow Datasets dataset that is already prepared on local disk.

    Nothing is downloaded: when the dataset is not prepared under ``data_dir``
    the first read fails at once, saying how to prepare it.

    Args:
      tfds_name: ``"name/config:version"``, e.g. ``"c4/en:3.0.1"``.
      tfds_data_dir: the TFDS data directory (default: TFDS's own).
      splits: the split names to offer, or a ``{name: tfds_split}`` map
        (e.g. ``{"validation": "train[:1%]"}``); default: all prepared splits.
    """

    supports_arbitrary_sharding = True

    def __init__(
        self,
        tfds_name: str,
        tfds_data_dir: str | None = None,
        splits: Sequence[str] | Mapping[str, str] | None = None,
    ):
        if ":" not in tfds_name:
            raise ValueError(
                f"TfdsDataSource: tfds_name must include a version, e.g. 'c4/en:3.0.1', got {tfds_name!r}"
            )
        self._name = tfds_name
        self._data_dir = tfds_data_dir
        self._split_map = dict(splits) if isinstance(splits, Mapping) else None
        self._split_names = tuple(splits) if splits is not None else None
        self._builder: Any = None

    @property
    def builder(self) -> Any:
        """The prepared ``tfds`` builder.

        Raises:
          FileNotFoundError: the dataset is not prepared under the data dir.
        """
        if self._builder is None:
            tfds = _require("tensorflow_datasets", "tfds")
            builder = tfds.builder(self._name, data_dir=self._data_dir)
            if not tf.io.gfile.exists(builder.data_dir):
                raise FileNotFoundError(
                    f"TFDS dataset {self._name!r} is not prepared under {builder.data_dir!r}; t5x.tasks never "
                    f"downloads. Prepare it first, e.g. `tfds build {self._name.split(':')[0]} "
                    f"--data_dir {self._data_dir or '<dir>'}`, or pass tfds_data_dir."
                )
            self._builder = builder
        return self._builder

    @property
    def splits(self) -> tuple[str, ...]:
        if self._split_names is not None:
            return self._split_names
        return tuple(self.builder.info.splits.keys())

    def _tfds_split(self, split: str) -> str:
        self._check_split(split)
        return self._split_map[split] if self._split_map else split

    def num_input_examples(self, split: str) -> int | None:
        return int(self.builder.info.splits[self._tfds_split(split)].num_examples)

    def list_shards(self, split: str) -> list[str]:
        return list(self.builder.info.splits[self._tfds_split(split)].filenames)

    def get_dataset(
        self,
        split: str = "train",
        shuffle: bool = True,
        seed: int | None = None,
        shard_info: ShardInfo | None = None,
    ) -> tf.data.Dataset:
        tfds = _require("tensorflow_datasets", "tfds")
        builder = self.builder
        tfds_split = self._tfds_split(split)
        if shard_info is not None and shard_info.num_shards > 1:
            # Even, disjoint example ranges whose union is the split.
            tfds_split = tfds.even_splits(tfds_split, n=shard_info.num_shards)[shard_info.index]
        read_config = tfds.ReadConfig(shuffle_seed=seed)
        return builder.as_dataset(split=tfds_split, shuffle_files=shuffle, read_config=read_config)


# Arrow type -> tensor dtype name (names, so importing this module needs no TensorFlow).
_HF_DTYPES = {
    "string": "string", "large_string": "string", "bool": "bool", "int8": "int32", "int16": "int32",
    "int32": "int32", "int64": "int64", "float16": "float32", "float32": "float32", "float64": "float32",
}  # fmt: skip


def _hf_spec(name: str, feature: Any) -> tf.TensorSpec:
    dtype = getattr(feature, "dtype", None)
    if dtype in _HF_DTYPES:
        return tf.TensorSpec([], _HF_DTYPES[dtype])
    inner = getattr(feature, "feature", None)
    if inner is not None and getattr(inner, "dtype", None) in _HF_DTYPES:
        return tf.TensorSpec([None], _HF_DTYPES[inner.dtype])
    raise ValueError(f"HuggingFaceDataSource: feature {name!r} has unsupported type {feature!r}")


class HuggingFaceDataSource(DataSource):
    """A Hugging Face ``datasets`` dataset from local files, read without the network.

    Give exactly one of ``dataset_path`` (a folder written by ``save_to_disk``)
    or ``builder`` + ``data_files`` (e.g. ``"json"`` / ``"csv"`` / ``"parquet"``
    with ``{"train": "data/*.jsonl"}``). Scalar and list-of-scalar columns
    become features; sharding is by example (``Dataset.shard``).
    """

    supports_arbitrary_sharding = True

    def __init__(
        self,
        dataset_path: str | None = None,
        builder: str | None = None,
        data_files: Mapping[str, str | Sequence[str]] | None = None,
    ):
        if (dataset_path is None) == (builder is None):
            raise ValueError(
                "HuggingFaceDataSource: give exactly one of dataset_path or builder (+ data_files)"
            )
        if builder is not None and not data_files:
            raise ValueError("HuggingFaceDataSource: builder needs data_files ({split: pattern})")
        self._path = dataset_path
        self._builder = builder
        self._data_files = dict(data_files or {})
        self._splits: dict[str, Any] | None = None

    def _load(self) -> dict[str, Any]:
        if self._splits is None:
            datasets = _require("datasets", "hf")
            if self._path is not None:
                loaded = datasets.load_from_disk(self._path)
            else:
                loaded = datasets.load_dataset(self._builder, data_files=self._data_files)
            self._splits = dict(loaded.items()) if hasattr(loaded, "items") else {"train": loaded}
        return self._splits

    @property
    def splits(self) -> tuple[str, ...]:
        if self._path is None:
            return tuple(self._data_files)
        return tuple(self._load())

    def num_input_examples(self, split: str) -> int | None:
        self._check_split(split)
        return len(self._load()[split])

    def get_dataset(
        self,
        split: str = "train",
        shuffle: bool = True,
        seed: int | None = None,
        shard_info: ShardInfo | None = None,
    ) -> tf.data.Dataset:
        self._check_split(split)
        table = self._load()[split]
        if shard_info is not None and shard_info.num_shards > 1:
            table = table.shard(num_shards=shard_info.num_shards, index=shard_info.index, contiguous=True)
        specs = {name: _hf_spec(name, f) for name, f in table.features.items()}

        def rows() -> Any:
            for row in table:
                yield {k: np.asarray(row[k]) if specs[k].shape.rank else row[k] for k in specs}

        ds = tf.data.Dataset.from_generator(rows, output_signature=specs)
        if shuffle:
            ds = ds.shuffle(min(len(table), 10_000) or 1, seed=seed, reshuffle_each_iteration=True)
        return ds
