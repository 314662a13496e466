"""seqio's data sources on the core's: what ``seqio.dataset_providers`` re-exports."""

from __future__ import annotations

import inspect
import os
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import tensorflow as tf

from t5x import tasks as _core
from t5x.interfaces import ShardInfo
from t5x.tasks import Feature
from t5x.tasks import FunctionDataSource as _CoreFunctionDataSource
from t5x.tasks.seqio_extras import ProtoDataSource as _CoreProtoDataSource
from t5x.tasks.seqio_extras import (
    read_seqio_cache,
    read_stats,
    shard_files_of,
)

_BARE = "__seqio_bare_element__"


def task_cache_dir(cache_dir: str, task_name: str) -> str:
    """Where ``t5x-tasks cache`` puts a task inside a cache dir (``/`` in names as ``__``)."""
    return os.path.join(cache_dir, task_name.replace("/", "__"))


def _read_our_cache(
    task_name: str, split: str, shard_info: Any, shuffle: bool, seed: Any, cache_dir: str
) -> Any:
    from t5x.tasks.seqio_extras import read_cached_split

    return read_cached_split(task_name, split, shard_info, shuffle, seed, cache_dirs=[cache_dir])


@typing.runtime_checkable
class DataSourceInterface(typing.Protocol):
    """What a Task needs of a source (seqio's protocol)."""

    @property
    def splits(self) -> Sequence[str]: ...

    def num_input_examples(self, split: str) -> int | None: ...

    def list_shards(self, split: str) -> Sequence[str]: ...

    def get_dataset(
        self, split: str, shuffle: bool = True, seed: int | None = None, shard_info: ShardInfo | None = None
    ) -> tf.data.Dataset: ...


class DataSource(_core.DataSource):
    """Base of seqio-style sources: ``DataSource(splits, num_input_examples, caching_permitted)``."""

    def __init__(
        self,
        splits: Iterable[str],
        num_input_examples: Mapping[str, int] | None = None,
        caching_permitted: bool = True,
    ):
        self._splits = tuple(splits)
        self._num_input_examples = dict(num_input_examples) if num_input_examples is not None else None
        self._caching_permitted = caching_permitted

    @property
    def caching_permitted(self) -> bool:
        return self._caching_permitted

    @property
    def splits(self) -> tuple[str, ...]:
        return self._splits

    @property
    def supports_arbitrary_sharding(self) -> bool:  # type: ignore[override]
        return False

    @property
    def output_features(self) -> Mapping[str, Feature]:
        raise NotImplementedError

    def list_shards(self, split: str) -> list[str]:
        return [split]

    def num_input_examples(self, split: str) -> int | None:
        if self._num_input_examples is None:
            return None
        return self._num_input_examples.get(split)


class DatasetFnCallable(typing.Protocol):
    """What FunctionDataSource calls: ``fn(split, shuffle_files, seed=None) -> tf.data.Dataset``."""

    def __call__(self, split: str, shuffle_files: bool, seed: int | None = None) -> tf.data.Dataset: ...


_REQUIRED_ARGS = ("split", "shuffle_files")


def _check_dataset_fn(fn: Callable[..., Any]) -> None:
    """seqio's rule: the positional arguments start with ``(split, shuffle_files)``; others have defaults."""
    name = getattr(fn, "__name__", type(fn).__name__)
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    positional = [p for p in inspect.signature(fn).parameters.values() if p.kind in kinds]
    names = tuple(p.name for p in positional)
    if names[:2] != _REQUIRED_ARGS:
        raise ValueError(f"'{name}' must have initial args {_REQUIRED_ARGS}, got: {names}")
    if any(p.default is inspect.Parameter.empty for p in positional[2:]):
        required = tuple(p.name for p in positional if p.default is inspect.Parameter.empty)
        raise ValueError(f"'{name}' may only have positional args {_REQUIRED_ARGS}, got: {required}")


class FunctionDataSource(_CoreFunctionDataSource):
    """Examples from ``dataset_fn(split=..., shuffle_files=...[, seed=...])``, as seqio calls it."""

    def __init__(
        self,
        dataset_fn: Callable[..., tf.data.Dataset],
        splits: Iterable[str],
        num_input_examples: Mapping[str, int] | None = None,
        caching_permitted: bool = True,
    ):
        _check_dataset_fn(dataset_fn)
        # seqio code passes one split as a bare string (splits="validation").
        super().__init__(
            dataset_fn, [splits] if isinstance(splits, str) else list(splits), num_input_examples
        )
        self._caching_permitted = caching_permitted

    @property
    def caching_permitted(self) -> bool:
        return self._caching_permitted

    def get_dataset(
        self,
        split: str = "train",
        shuffle: bool = True,
        seed: int | None = None,
        shard_info: ShardInfo | None = None,
    ) -> tf.data.Dataset:
        if shard_info and shard_info.num_shards > 1:
            raise ValueError(
                "FunctionDataSource cannot shard by itself; shard the dataset it returns instead"
            )
        if seed is None:
            return self._fn(split=split, shuffle_files=shuffle)
        return self._fn(split=split, shuffle_files=shuffle, seed=seed)


class _SeqioFileRepr:
    """seqio's ``str`` (the patterns) and ``repr`` (every constructor argument) of file sources."""

    def __str__(self) -> str:
        return f"{type(self).__name__}({self._split_to_filepattern})"  # type: ignore[attr-defined]

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(split_to_filepattern={self._split_to_filepattern},"  # type: ignore[attr-defined]
            f" num_input_examples={self._num_input_examples or None},"  # type: ignore[attr-defined]
            f" caching_permitted={self.caching_permitted},"  # type: ignore[attr-defined]
            f" file_shuffle_buffer_size={getattr(self, '_file_shuffle_buffer_size', None)},"
            f" cycle_length={self._cycle_length}, block_length={self._block_length})"  # type: ignore[attr-defined]
        )


class FileDataSource(_SeqioFileRepr, _core.FileDataSource):
    """Examples read by ``read_file_fn(path)`` from the files each split's pattern matches.

    Shards by files only (seqio's rule): fewer files than shards is an error
    here; ``Task.get_dataset`` shards such sources by example instead.
    """

    _allow_no_splits = True  # seqio builds sources without splits, e.g. TextLineDataSource({})

    def __init__(
        self,
        read_file_fn: Callable[[tf.Tensor], tf.data.Dataset],
        split_to_filepattern: Mapping[str, str | Iterable[str]],
        num_input_examples: Mapping[str, int] | None = None,
        caching_permitted: bool = True,
        file_shuffle_buffer_size: int | None = None,
        cycle_length: int = 16,
        block_length: int = 16,
    ):
        patterns = {k: v if isinstance(v, str) else list(v) for k, v in split_to_filepattern.items()}
        super().__init__(read_file_fn, patterns, num_input_examples, cycle_length, block_length)
        self._split_to_filepattern = patterns
        self._caching_permitted = caching_permitted
        self._file_shuffle_buffer_size = file_shuffle_buffer_size

    @property
    def caching_permitted(self) -> bool:
        return self._caching_permitted

    def list_shards(self, split: str) -> list[str]:
        """The split's files through ``seqio.utils.list_files`` (seqio lists them there, once per pattern)."""
        from t5x.seqio import utils  # late: utils is the module seqio code patches

        self._check_split(split)
        return utils.list_files(self._split_to_filepattern[split])

    def get_dataset(
        self,
        split: str = "train",
        shuffle: bool = True,
        seed: int | None = None,
        shard_info: ShardInfo | None = None,
    ) -> tf.data.Dataset:
        files = self.list_shards(split)
        if not files:
            raise ValueError(
                f"{type(self).__name__}: No file is found for the file pattern: "
                f"{self._split_to_filepattern[split]}."
            )
        files_ds = tf.data.Dataset.from_tensor_slices(files)
        if shard_info:
            if len(files) < shard_info.num_shards:
                raise ValueError(
                    f"{type(self).__name__}: split {split!r} has {len(files)} files, too few for "
                    f"{shard_info.num_shards} shards"
                )
            files_ds = files_ds.shard(shard_info.num_shards, shard_info.index)
        if shuffle:
            files_ds = files_ds.shuffle(self._file_shuffle_buffer_size or len(files), seed=seed)
        return files_ds.interleave(
            self._read_file_fn,
            cycle_length=self._cycle_length,
            block_length=self._block_length,
            num_parallel_calls=tf.data.AUTOTUNE,
        )


class TextLineDataSource(FileDataSource):
    """Lines of text files; each example is the line itself (a string scalar), as in seqio."""

    def __init__(
        self,
        split_to_filepattern: Mapping[str, str | Iterable[str]],
        skip_header_lines: int = 0,
        num_input_examples: Mapping[str, int] | None = None,
        caching_permitted: bool = True,
        file_shuffle_buffer_size: int | None = None,
    ):
        self._skip_header_lines = skip_header_lines

        def read(path: tf.Tensor) -> tf.data.Dataset:
            return tf.data.TextLineDataset(path).skip(skip_header_lines)

        super().__init__(
            read, split_to_filepattern, num_input_examples, caching_permitted, file_shuffle_buffer_size
        )


class TFExampleDataSource(FileDataSource):
    """``tf.train.Example`` records parsed with ``feature_description`` (VarLen features stay sparse)."""

    def __init__(
        self,
        split_to_filepattern: Mapping[str, str | Iterable[str]],
        feature_description: Mapping[str, Any],
        reader_cls: Callable[[Any], tf.data.Dataset] = tf.data.TFRecordDataset,
        num_input_examples: Mapping[str, int] | None = None,
        caching_permitted: bool = True,
        file_shuffle_buffer_size: int | None = None,
    ):
        description = dict(feature_description)

        def parse(*args: Any) -> Any:
            return tf.io.parse_single_example(args[-1], description)  # some readers yield (key, value)

        def read(path: tf.Tensor) -> tf.data.Dataset:
            return reader_cls(path).map(parse, num_parallel_calls=tf.data.AUTOTUNE)

        super().__init__(
            read, split_to_filepattern, num_input_examples, caching_permitted, file_shuffle_buffer_size
        )
        self._feature_description = description

    def __str__(self) -> str:
        return (
            f"{type(self).__name__}(split_to_filepattern={self._split_to_filepattern},"
            f" feature_description={self._feature_description})"
        )


class ProtoDataSource(_SeqioFileRepr, _CoreProtoDataSource):
    """Records of any proto, decoded by ``decode_proto_fn``."""

    def __init__(
        self,
        split_to_filepattern: Mapping[str, str | Iterable[str]],
        decode_proto_fn: Callable[..., Mapping[str, Any]],
        reader_cls: Callable[[Any], tf.data.Dataset] = tf.data.TFRecordDataset,
        num_input_examples: Mapping[str, int] | None = None,
        caching_permitted: bool = True,
        file_shuffle_buffer_size: int | None = None,
    ):
        patterns = {k: v if isinstance(v, str) else list(v) for k, v in split_to_filepattern.items()}
        super().__init__(patterns, decode_proto_fn, reader_cls, num_input_examples, caching_permitted)
        self._split_to_filepattern = dict(split_to_filepattern)
        self._file_shuffle_buffer_size = file_shuffle_buffer_size


class TfdsDataSource(DataSource):
    """A TFDS dataset (``"name/config:version"``), read through ``seqio.utils.LazyTfdsLoader``.

    As seqio's: the loader is looked up in ``seqio.utils`` when the source is
    made (tests patch it there), ``splits`` may map our split names to TFDS
    splits (or to ``TfdsSplit`` values naming other datasets), and TFDS may
    download what is not prepared. The core's ``t5x.tasks.TfdsDataSource``
    never downloads.
    """

    def __init__(
        self,
        tfds_name: str | None = None,
        tfds_data_dir: str | None = None,
        splits: Iterable[str] | Mapping[str, Any] | None = None,
        caching_permitted: bool = True,
        decoders: Any = None,
        builder_kwargs: Mapping[str, Any] | None = None,
    ):
        from t5x.seqio import utils

        split_map = dict(splits) if isinstance(splits, Mapping) else None
        if split_map is None and splits is not None:
            split_map = {s: s for s in splits}
        self._tfds_dataset = utils.LazyTfdsLoader(
            tfds_name,
            data_dir=tfds_data_dir,  # the loader applies set_tfds_data_dir_override itself
            split_map=split_map,
            decoders=decoders,
            builder_kwargs=builder_kwargs,
        )
        # Without a split list the splits are the dataset's own, known once TFDS is asked.
        super().__init__(splits=tuple(split_map) if split_map else (), caching_permitted=caching_permitted)
        self._splits_given = split_map is not None

    @property
    def splits(self) -> tuple[str, ...]:
        if self._splits_given:
            return self._splits
        return tuple(self._tfds_dataset.info.splits)

    @property
    def tfds_dataset(self) -> Any:
        return self._tfds_dataset

    @property
    def builder(self) -> Any:
        return self._tfds_dataset.builder

    def list_shards(self, split: str) -> list[str]:
        def name(instruction: Any) -> str:
            return instruction["filename"] if isinstance(instruction, Mapping) else str(instruction)

        return [name(i) for i in self._tfds_dataset.files(split)]

    def num_input_examples(self, split: str) -> int | None:
        return self._tfds_dataset.size(split)

    def get_dataset(self, split="train", shuffle=True, seed=None, shard_info=None) -> tf.data.Dataset:
        return self._tfds_dataset.load(split, shuffle_files=shuffle, seed=seed, shard_info=shard_info)


class _CachedDataSource(_core.DataSource):
    """A task's offline cache (seqio's layout or ours), sharded by files or examples."""

    supports_arbitrary_sharding = True

    def __init__(self, task_name: str, task_dir: str, split: str, seqio_layout: bool):
        self._task_name, self._task_dir, self._split, self._seqio = task_name, task_dir, split, seqio_layout

    @property
    def splits(self) -> tuple[str, ...]:
        return (self._split,)

    def list_shards(self, split: str) -> list[str]:
        return shard_files_of(self._task_dir, split) if self._seqio else [split]

    def num_input_examples(self, split: str) -> int | None:
        return read_stats(self._task_dir, split).get("examples")

    def get_dataset(self, split="train", shuffle=True, seed=None, shard_info=None) -> tf.data.Dataset:
        if self._seqio:
            return read_seqio_cache(self._task_dir, split, shard_info, shuffle, seed)
        parent = os.path.dirname(self._task_dir)
        return _read_our_cache(self._task_name, split, shard_info, shuffle, seed, parent)


class CacheDatasetPlaceholder(_core.CacheDatasetPlaceholder):
    """Marks where offline caching happens; never called (seqio raises if it is)."""

    def __init__(self, required: bool = False, file_shuffle_buffer_size: int | None = None):
        super().__init__(required)
        self._file_shuffle_buffer_size = file_shuffle_buffer_size

    # seqio keeps the flag in ``_required`` (code flips it there); ``required`` reads it.
    @property  # type: ignore[override]
    def required(self) -> bool:
        return self._required

    @required.setter
    def required(self, value: bool) -> None:
        self._required = bool(value)

    @property
    def file_shuffle_buffer_size(self) -> int | None:
        return self._file_shuffle_buffer_size

    def __call__(self, dataset: tf.data.Dataset) -> tf.data.Dataset:
        raise RuntimeError("CacheDatasetPlaceholder should never be called")
