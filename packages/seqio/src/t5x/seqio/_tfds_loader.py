"""``seqio.utils.LazyTfdsLoader`` / ``TfdsSplit``: a TFDS dataset opened on first use, builders shared.

TensorFlow Datasets is imported only when a loader is first used, so the
facade imports without it. Builders are memoized per ``(name, data_dir)`` for
the whole process, as seqio's are: two tasks on one TFDS dataset share one.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar

_READ_CONFIG_OVERRIDE: Any = None
_DATA_DIR_OVERRIDE: str | None = None


def set_tfds_data_dir_override(tfds_data_dir: str | None) -> None:
    """Makes every loader read under ``tfds_data_dir`` (unless one sets its own with ``override_data_dir``)."""
    global _DATA_DIR_OVERRIDE
    _DATA_DIR_OVERRIDE = tfds_data_dir


def get_tfds_data_dir_override() -> str | None:
    return _DATA_DIR_OVERRIDE


def set_tfds_read_config_override(read_config: Any) -> None:
    """Makes every loader start from ``read_config`` (a ``tfds.ReadConfig``; None: TFDS's default)."""
    global _READ_CONFIG_OVERRIDE
    _READ_CONFIG_OVERRIDE = read_config


def _tfds() -> Any:
    try:
        import tensorflow_datasets
    except ImportError as e:
        raise ImportError(
            "LazyTfdsLoader needs tensorflow_datasets; install it (`pip install 't5x-seqio[tfds]'`)"
        ) from e
    return tensorflow_datasets


@dataclasses.dataclass(frozen=True)
class TfdsSplit:
    """One split of one TFDS dataset, for split maps that draw each split from a different dataset."""

    dataset: str
    split: str | None
    data_dir: str | None = None


def _check_versioned(name: str) -> None:
    if ":" not in name:
        raise ValueError(f"TFDS name must contain a version number, got: {name}")


class LazyTfdsLoader:
    """Opens a TFDS dataset (``"name/config:version"``) on first use.

    Args:
      name: the dataset, version included (None when ``split_map`` holds ``TfdsSplit`` values).
      data_dir: the TFDS data directory (None: TFDS's default).
      split_map: our split name -> the TFDS split, or -> a ``TfdsSplit`` naming
        another dataset; splits not in the map are unknown.
      decoders: passed to TFDS (e.g. ``tfds.decode.SkipDecoding()`` values).
      read_only: read the prepared data through the builder; never download.
      builder_kwargs: extra keywords for ``tfds.builder`` / ``tfds.load``.
    """

    _MEMOIZED_BUILDERS: ClassVar[dict[tuple[str | None, str | None], Any]] = {}

    def __init__(
        self,
        name: str | None = None,
        data_dir: str | None = None,
        split_map: Mapping[str, Any] | None = None,
        decoders: Any = None,
        read_only: bool = False,
        builder_kwargs: Mapping[str, Any] | None = None,
    ):
        splits = dict(split_map or {})
        by_dataset = bool(splits) and all(isinstance(v, TfdsSplit) for v in splits.values())
        if by_dataset:
            if name is not None or data_dir is not None:
                raise ValueError(
                    "If split values are instances of `TfdsSplit`, `name` and `data_dir` must be `None`."
                )
            for value in splits.values():
                _check_versioned(value.dataset)
        elif name is not None:
            _check_versioned(name)
        self._name = name
        self._data_dir = data_dir
        self._data_dir_override: str | None = None
        self._split_map = dict(split_map) if split_map is not None else None
        self._decoders = decoders
        self._read_only = read_only
        self._builder_kwargs = dict(builder_kwargs) if builder_kwargs else None

    def __str__(self) -> str:
        return f"LazyTfdsLoader(name={self._name}, data_dir={self.data_dir})"

    def __repr__(self) -> str:
        return (
            f"LazyTfdsLoader(name={self._name}, data_dir={self.data_dir}, "
            f"split_map={self._split_map}, decoders={self._decoders})"
        )

    @property
    def name(self) -> str | None:
        return self._name

    @property
    def data_dir(self) -> str | None:
        """This loader's override, else the global one (``set_tfds_data_dir_override``), else ``data_dir``."""
        return self._data_dir_override or _DATA_DIR_OVERRIDE or self._data_dir

    def override_data_dir(self, data_dir: str) -> None:
        self._data_dir_override = data_dir

    @property
    def split_map(self) -> dict[str, Any] | None:
        return self._split_map

    def set_decoders(self, decoders: Any) -> None:
        self._decoders = decoders

    def _source(self, split: str | None) -> tuple[str | None, str | None, str | None]:
        """(dataset, data_dir, tfds split) for our ``split``; KeyError for a split the map lacks."""
        if self._split_map is None or split is None:
            return self._name, self.data_dir, split
        target = self._split_map[split]
        if isinstance(target, TfdsSplit):
            return target.dataset, target.data_dir, target.split
        return self._name, self.data_dir, target

    def is_memoized(self, split: str | None = None) -> bool:
        dataset, data_dir, _ = self._source(split)
        return (dataset, data_dir) in LazyTfdsLoader._MEMOIZED_BUILDERS

    def _get_builder(self, split: str | None = None) -> Any:
        dataset, data_dir, _ = self._source(split)
        key = (dataset, data_dir)
        if key not in LazyTfdsLoader._MEMOIZED_BUILDERS:
            tfds = _tfds()
            if dataset is None:
                builder = tfds.builder_from_directory(data_dir)
            elif self._builder_kwargs:
                builder = tfds.builder(dataset, data_dir=data_dir, **self._builder_kwargs)
            else:
                builder = tfds.builder(dataset, data_dir=data_dir)
            LazyTfdsLoader._MEMOIZED_BUILDERS[key] = builder
        return LazyTfdsLoader._MEMOIZED_BUILDERS[key]

    @property
    def builder(self) -> Any:
        return self._get_builder()

    @property
    def info(self) -> Any:
        return self.builder.info

    def builder_cls(self) -> Any:
        """The registered builder class of the dataset, or None when TFDS has none by that name."""
        tfds = _tfds()
        dataset = self._name
        if dataset is None and self._split_map:
            dataset = next(iter(self._split_map.values())).dataset
        if dataset is None:
            return None
        base = dataset.split(":", 1)[0].split("/", 1)[0]
        try:
            return tfds.builder_cls(base)
        except Exception:  # tfds raises its own DatasetNotFoundError (a subclass differs by version)
            return None

    def resolved_tfds_name(self, split: str | None = None) -> str | None:
        """The dataset name; a wildcard version (``1.0.*``) resolves once the builder is loaded."""
        dataset, _, _ = self._source(split)
        if dataset is not None and "*" in dataset and self.is_memoized(split):
            return self._get_builder(split).get_reference().tfds_name()
        return dataset

    def _split_info(self, split: str) -> Any:
        _, _, tfds_split = self._source(split)
        return self._get_builder(split).info.splits[tfds_split]

    def size(self, split: str) -> int:
        """Examples in ``split``."""
        return self._split_info(split).num_examples

    def files(self, split: str) -> list[Any]:
        """The file instructions of ``split``."""
        return list(self._split_info(split).file_instructions)

    def read_config(self, seed: int | None = None) -> Any:
        tfds = _tfds()
        config = copy.copy(_READ_CONFIG_OVERRIDE) if _READ_CONFIG_OVERRIDE is not None else tfds.ReadConfig()
        config.skip_prefetch = True
        config.shuffle_seed = seed
        return config

    def load(self, split: str, shuffle_files: bool, seed: int | None = None, shard_info: Any = None) -> Any:
        """The ``split`` as a ``tf.data.Dataset`` (sharded when ``shard_info`` has several shards)."""
        tfds = _tfds()
        dataset, data_dir, tfds_split = self._source(split)
        if shard_info is not None and getattr(shard_info, "num_shards", 1) > 1:
            tfds_split = tfds.even_splits(tfds_split, n=shard_info.num_shards)[shard_info.index]
        config = self.read_config(seed)
        if self._read_only:
            return self._get_builder(split).as_dataset(
                split=tfds_split, shuffle_files=shuffle_files, read_config=config, decoders=self._decoders
            )
        return tfds.load(
            dataset,
            split=tfds_split,
            data_dir=data_dir,
            shuffle_files=shuffle_files,
            download=True,
            try_gcs=True,
            read_config=config,
            decoders=self._decoders,
            builder_kwargs=self._builder_kwargs,
        )
