"""Data sources: where a task's raw examples come from (files, memory, functions)."""

from __future__ import annotations

import abc
import base64
import inspect
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from t5x.interfaces import ShardInfo
from t5x.tasks._lazy_tf import AUTOTUNE, tf
from t5x.tasks._shard import shard_examples, shard_files

# A record error found inside the tf.data graph travels to Python in an assertion message; the
# message is base64 between these marks so that TensorFlow's escaping cannot garble it.
_ERROR_MARK = re.compile(r"<<t5x-data-error:([A-Za-z0-9_=-]*)>>")
# When TensorFlow reports corrupt records, the files of a source are read one by one to find the
# bad one, as long as there is at most this much to read.
_LOCATE_BUDGET_BYTES = 256 << 20


class DataSourceError(ValueError):
    """A source's data cannot be read: the message names the file (and line or record where known)."""


def _encode_record_error(message: str) -> str:
    return f"<<t5x-data-error:{base64.urlsafe_b64encode(message.encode()).decode()}>>"


def _op_error_text(error: tf.errors.OpError) -> str:
    """TensorFlow's message without its function-node prefix and op suffix."""
    text = re.sub(r"^\{\{function_node [^}]*\}\}\s*", "", error.message)
    text = re.sub(r"\s*\[Op:\w+\].*$", "", text, flags=re.S)
    text = re.sub(r"\s*\[\[\{\{node [^}]*\}\}\]\].*$", "", text, flags=re.S)
    return text.strip()


def data_source_error(
    error: tf.errors.OpError, sources: Iterable[tuple[str, DataSource, str]]
) -> DataSourceError | None:
    """Turns an error TensorFlow raised while iterating data into a :class:`DataSourceError`.

    Args:
      error: what iterating a dataset raised.
      sources: ``(task name, source, split)`` of every source the dataset reads.

    Returns:
      A DataSourceError naming the file (a bad record of a JSON Lines file with its
      line; corrupt or truncated TFRecord or compressed data with the file, or the
      files it is in), or None when ``error`` is not about the data's files.
    """
    if match := _ERROR_MARK.search(error.message):
        return DataSourceError(base64.urlsafe_b64decode(match.group(1)).decode(errors="replace"))
    if not isinstance(error, tf.errors.DataLossError):
        return None
    reason = _op_error_text(error)
    candidates: list[str] = []
    for task, source, split in sources:
        if not isinstance(source, FileDataSource):
            continue
        try:
            files = source.list_shards(split)
        except (ValueError, FileNotFoundError):
            continue
        bad = source.find_unreadable_file(split)
        if bad is not None:
            path, detail = bad
            return DataSourceError(
                f"{path}: corrupt or truncated data ({detail}); the file belongs to split {split!r} of "
                f"{task!r}: replace or remove it"
            )
        candidates.extend(files)
    if not candidates:
        return DataSourceError(f"corrupt or truncated data: {reason}")
    shown = ", ".join(candidates[:5]) + (f" and {len(candidates) - 5} more" if len(candidates) > 5 else "")
    where = candidates[0] if len(candidates) == 1 else f"one of {len(candidates)} files ({shown})"
    return DataSourceError(f"{where}: corrupt or truncated data ({reason})")


class DataSource(abc.ABC):
    """A source of raw examples (dicts of tensors) for each split.

    Attributes:
      supports_arbitrary_sharding: True when ``get_dataset`` shards exactly for
        any number of shards by itself.
    """

    supports_arbitrary_sharding: bool = False

    @property
    @abc.abstractmethod
    def splits(self) -> tuple[str, ...]:
        """The names of the splits this source provides."""

    def list_shards(self, split: str) -> list[str]:
        """The files (or other shards) behind ``split``; one entry when not file based."""
        self._check_split(split)
        return [split]

    def num_input_examples(self, split: str) -> int | None:
        """The number of raw examples in ``split`` when known cheaply, else None."""
        self._check_split(split)
        return None

    @abc.abstractmethod
    def get_dataset(
        self,
        split: str = "train",
        shuffle: bool = True,
        seed: int | None = None,
        shard_info: ShardInfo | None = None,
    ) -> tf.data.Dataset:
        """Returns the raw examples of one shard of ``split``.

        Iterating the returned dataset again (e.g. under ``repeat``) visits the
        same examples; with ``shuffle`` and a ``seed`` each pass has its own,
        reproducible order.

        Raises:
          ValueError: ``split`` is not one of ``splits``.
        """

    def _check_split(self, split: str) -> None:
        if split not in self.splits:
            raise ValueError(
                f"{type(self).__name__} has no split {split!r}; available splits: {', '.join(self.splits)}"
            )


class FileDataSource(DataSource):
    """Examples read from files matched by one glob pattern (or list) per split.

    Shards by files when a split has at least as many files as shards, else by
    examples; the union of the shards is always the whole split.

    Args:
      read_file_fn: ``fn(files_dataset_element) -> tf.data.Dataset`` reading one file.
      split_to_filepattern: split name -> glob pattern or list of patterns.
      num_input_examples: split name -> number of examples, when known.
      cycle_length: how many files are read at once.
    """

    _allow_no_splits = False  # seqio's facade allows a source without splits (a placeholder)

    def __init__(
        self,
        read_file_fn: Callable[[tf.Tensor], tf.data.Dataset],
        split_to_filepattern: Mapping[str, str | Sequence[str]],
        num_input_examples: Mapping[str, int] | None = None,
        cycle_length: int = 16,
        block_length: int = 16,
    ):
        if not split_to_filepattern and not self._allow_no_splits:
            raise ValueError(f"{type(self).__name__} needs at least one split, got {split_to_filepattern!r}")
        self._read_file_fn = read_file_fn
        self._patterns = {k: [v] if isinstance(v, str) else list(v) for k, v in split_to_filepattern.items()}
        self._num_input_examples = dict(num_input_examples or {})
        self._cycle_length = cycle_length
        self._block_length = block_length
        self._files: dict[str, list[str]] = {}

    @property
    def splits(self) -> tuple[str, ...]:
        return tuple(self._patterns)

    def list_shards(self, split: str) -> list[str]:
        self._check_split(split)
        if split not in self._files:
            files: list[str] = []
            for pattern in self._patterns[split]:
                matched = sorted(tf.io.gfile.glob(pattern))
                if not matched:
                    raise FileNotFoundError(
                        f"{type(self).__name__}: split {split!r} pattern {pattern!r} matches no files"
                    )
                files.extend(matched)
            self._files[split] = files
        return list(self._files[split])

    def num_input_examples(self, split: str) -> int | None:
        self._check_split(split)
        return self._num_input_examples.get(split)

    def get_dataset(
        self,
        split: str = "train",
        shuffle: bool = True,
        seed: int | None = None,
        shard_info: ShardInfo | None = None,
    ) -> tf.data.Dataset:
        files, by_example = shard_files(self.list_shards(split), shard_info)
        files_ds = tf.data.Dataset.from_tensor_slices(files)
        if shuffle:
            files_ds = files_ds.shuffle(len(files), seed=seed, reshuffle_each_iteration=True)
        ds = files_ds.interleave(
            self._read_file_fn,
            cycle_length=min(self._cycle_length, len(files)),
            block_length=self._block_length,
            num_parallel_calls=AUTOTUNE,
            deterministic=True,
        )
        return shard_examples(ds, shard_info if by_example else None)

    def find_unreadable_file(self, split: str) -> tuple[str, str] | None:
        """The first file of ``split`` TensorFlow cannot read to the end, and why.

        Reads every file of the split in order, so it gives up (None) when the
        split holds more than a few hundred MiB; also None when every file reads.
        """
        files = self.list_shards(split)
        try:
            total = sum(tf.io.gfile.stat(f).length for f in files)
        except tf.errors.OpError:
            return None
        if total > _LOCATE_BUDGET_BYTES:
            return None
        for path in files:
            try:
                for _ in self._read_file_fn(tf.constant(path)):
                    pass
            except tf.errors.DataLossError as error:
                return path, _op_error_text(error)
            except tf.errors.OpError:
                continue
        return None


class TextLineDataSource(FileDataSource):
    """Lines of text files, as examples ``{text_key: line}``.

    Unlike seqio, whose text-line source yields bare strings, each example is a
    dict so that the usual preprocessors (``rekey``, ``tokenize``) apply directly.

    Args:
      split_to_filepattern: split name -> glob pattern or list of patterns.
      skip_header_lines: lines skipped at the top of every file.
      num_input_examples: split name -> number of lines, when known.
      text_key: the feature name of the line.
    """

    def __init__(
        self,
        split_to_filepattern: Mapping[str, str | Sequence[str]],
        skip_header_lines: int = 0,
        num_input_examples: Mapping[str, int] | None = None,
        text_key: str = "text",
    ):
        def read(path: tf.Tensor) -> tf.data.Dataset:
            lines = tf.data.TextLineDataset(path).skip(skip_header_lines)
            return lines.map(lambda line: {text_key: line})

        super().__init__(read, split_to_filepattern, num_input_examples)


class TFExampleDataSource(FileDataSource):
    """``tf.train.Example`` records from TFRecord files.

    Args:
      split_to_filepattern: split name -> glob pattern or list of patterns.
      feature_description: feature name -> ``tf.io.FixedLenFeature`` /
        ``VarLenFeature`` (var-len features come back dense).
      num_input_examples: split name -> number of records, when known.
      compression_type: "", "GZIP" or "ZLIB".
    """

    def __init__(
        self,
        split_to_filepattern: Mapping[str, str | Sequence[str]],
        feature_description: Mapping[str, Any],
        num_input_examples: Mapping[str, int] | None = None,
        compression_type: str = "",
    ):
        description = dict(feature_description)
        if not description:
            raise ValueError("TFExampleDataSource.feature_description must name at least one feature")

        def parse(record: tf.Tensor) -> dict[str, tf.Tensor]:
            parsed = tf.io.parse_single_example(record, description)
            return {
                k: tf.sparse.to_dense(v) if isinstance(v, tf.SparseTensor) else v for k, v in parsed.items()
            }

        def read(path: tf.Tensor) -> tf.data.Dataset:
            return tf.data.TFRecordDataset(path, compression_type=compression_type).map(parse)

        super().__init__(read, split_to_filepattern, num_input_examples)


_JSON_TYPES = {str: "string", int: "int64", float: "float32", bool: "bool"}  # names: no TensorFlow at import


def _json_field_spec(name: str, value: Any) -> tf.TensorSpec:
    if isinstance(value, list):
        kinds = {type(v) for v in value} or {int}
        if len(kinds) != 1 or next(iter(kinds)) not in _JSON_TYPES:
            raise ValueError(f"JSON Lines field {name!r}: lists must hold one scalar type, got {value!r}")
        return tf.TensorSpec([None], _JSON_TYPES[next(iter(kinds))])
    if type(value) not in _JSON_TYPES:
        raise ValueError(f"JSON Lines field {name!r} has unsupported value {value!r}")
    return tf.TensorSpec([], _JSON_TYPES[type(value)])


class JsonLinesDataSource(FileDataSource):
    """One JSON object per line; each object's fields become features.

    Args:
      split_to_filepattern: split name -> glob pattern or list of patterns.
      fields: feature name -> ``tf.TensorSpec`` (shape ``[]`` or ``[None]``).
        When None they are read from the first line of the first file.
      num_input_examples: split name -> number of lines, when known.
    """

    def __init__(
        self,
        split_to_filepattern: Mapping[str, str | Sequence[str]],
        fields: Mapping[str, tf.TensorSpec] | None = None,
        num_input_examples: Mapping[str, int] | None = None,
    ):
        self._fields = dict(fields) if fields is not None else None
        super().__init__(self._read, split_to_filepattern, num_input_examples)

    @property
    def fields(self) -> dict[str, tf.TensorSpec]:
        """The feature specs of each example.

        Raises:
          DataSourceError: the first line of the first file is not a JSON object
            of supported values (names the file).
        """
        if self._fields is None:
            first = self.list_shards(self.splits[0])[0]
            with tf.io.gfile.GFile(first, "rb") as f:
                line = f.readline()
            if not line.strip():
                raise DataSourceError(
                    f"JsonLinesDataSource: cannot infer fields, {first!r} starts with an empty line"
                )
            try:
                obj = _json_object(line)
                self._fields = {k: _json_field_spec(k, v) for k, v in obj.items()}
            except ValueError as error:
                raise DataSourceError(f"{first}:1: {error} (the first line gives the fields)") from None
        return self._fields

    def _read(self, path: tf.Tensor) -> tf.data.Dataset:
        fields = self.fields
        names = list(fields)
        dtypes = [fields[n].dtype for n in names]
        # Stand-ins returned with a bad record, which the assertion below stops before use.
        blanks = [
            np.full(
                [d or 0 for d in fields[n].shape.as_list()], b"" if t == tf.string else 0, t.as_numpy_dtype
            )
            for n, t in zip(names, dtypes, strict=True)
        ]

        def parse(line: bytes, number: np.int64, filename: bytes) -> list[Any]:
            try:
                obj = _json_object(line)
                values = [_json_value(obj, name, fields[name]) for name in names]
            except ValueError as error:
                where = f"{filename.decode(errors='replace')}:{int(number)}"
                return [*blanks, _encode_record_error(f"{where}: {error}").encode()]
            return [*values, b""]

        def parse_tf(number: tf.Tensor, line: tf.Tensor) -> dict[str, tf.Tensor]:
            *values, problem = tf.numpy_function(
                parse, [line, number, path], [*dtypes, tf.string], stateful=False
            )
            check = tf.debugging.Assert(tf.equal(problem, ""), [problem])
            with tf.control_dependencies([check]):
                values = [tf.identity(v) for v in values]
            return {n: tf.ensure_shape(v, fields[n].shape) for n, v in zip(names, values, strict=True)}

        lines = tf.data.TextLineDataset(path).enumerate(start=1)
        lines = lines.filter(lambda _, s: tf.strings.length(tf.strings.strip(s)) > 0)
        return lines.map(parse_tf)


def _json_object(line: bytes) -> dict[str, Any]:
    """One JSON Lines record; ValueError says what is wrong with it."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(f"not UTF-8 text ({error.reason} at byte {error.start})") from None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(f"invalid JSON ({error.msg} at column {error.colno}): {text[:120]!r}") from None
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}: {text[:120]!r}")
    return obj


def _fits(value: Any, dtype: tf.DType) -> bool:
    if dtype == tf.string:
        return isinstance(value, str)
    if dtype == tf.bool:
        return isinstance(value, bool)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return not dtype.is_integer or isinstance(value, int) or value.is_integer()


def _json_value(obj: Mapping[str, Any], name: str, spec: tf.TensorSpec) -> np.ndarray:
    """The value of field ``name`` as the numpy array ``spec`` describes; ValueError when it does not fit."""
    if name not in obj:
        raise ValueError(f"the record lacks field {name!r} (it has {', '.join(map(repr, obj)) or 'none'})")
    value = obj[name]
    rank = spec.shape.rank
    depth = 0 if not isinstance(value, list) else 2 if any(isinstance(v, list) for v in value) else 1
    if rank is not None and depth != rank:
        raise ValueError(f"field {name!r} is {value!r}, expected {'a list' if rank else 'a single value'}")
    items = value if isinstance(value, list) else [value]
    if not all(_fits(v, spec.dtype) for v in items):
        raise ValueError(f"field {name!r} is {value!r}, expected {spec.dtype.name} values")
    if spec.dtype == tf.string:
        encoded = [v.encode() for v in items]
        return np.array(encoded if isinstance(value, list) else encoded[0], dtype=object)
    try:
        return np.asarray(value, dtype=spec.dtype.as_numpy_dtype)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"field {name!r} is {value!r}, expected {spec.dtype.name} values") from None


class FunctionDataSource(DataSource):
    """Examples from a Python function returning a ``tf.data.Dataset``.

    Args:
      dataset_fn: ``fn(split, shuffle_files[, seed]) -> tf.data.Dataset`` of dicts
        (seqio's signature; ``seed`` is passed when the function accepts it).
      splits: the split names ``dataset_fn`` accepts.
      num_input_examples: split name -> number of examples, when known.
    """

    def __init__(
        self,
        dataset_fn: Callable[..., tf.data.Dataset],
        splits: Sequence[str],
        num_input_examples: Mapping[str, int] | None = None,
    ):
        if isinstance(splits, str) or not splits:
            raise ValueError(f"FunctionDataSource.splits must be a non-empty list of names, got {splits!r}")
        self._fn = dataset_fn
        self._splits = tuple(splits)
        self._num_input_examples = dict(num_input_examples or {})

    @property
    def splits(self) -> tuple[str, ...]:
        return self._splits

    def num_input_examples(self, split: str) -> int | None:
        self._check_split(split)
        return self._num_input_examples.get(split)

    def get_dataset(
        self,
        split: str = "train",
        shuffle: bool = True,
        seed: int | None = None,
        shard_info: ShardInfo | None = None,
    ) -> tf.data.Dataset:
        self._check_split(split)
        kwargs: dict[str, Any] = {}
        if "seed" in inspect.signature(self._fn).parameters:
            kwargs["seed"] = seed
        ds = self._fn(split, shuffle, **kwargs)
        return shard_examples(ds, shard_info)


class InMemoryDataSource(DataSource):
    """Examples held in Python lists: ``{split: [{"feature": value, ...}, ...]}``.

    Values may be strings, numbers or (ragged) lists of them. Shards by example
    index; shuffles all of a shard's examples (a fresh order each pass).
    """

    supports_arbitrary_sharding = True

    def __init__(self, examples: Mapping[str, Sequence[Mapping[str, Any]]]):
        if not examples:
            raise ValueError("InMemoryDataSource needs at least one split")
        self._examples = {k: list(v) for k, v in examples.items()}

    @property
    def splits(self) -> tuple[str, ...]:
        return tuple(self._examples)

    def num_input_examples(self, split: str) -> int | None:
        self._check_split(split)
        return len(self._examples[split])

    def get_dataset(
        self,
        split: str = "train",
        shuffle: bool = True,
        seed: int | None = None,
        shard_info: ShardInfo | None = None,
    ) -> tf.data.Dataset:
        self._check_split(split)
        rows = self._examples[split]
        if shard_info is not None:
            rows = rows[shard_info.index :: shard_info.num_shards]
        if not rows:
            where = f" shard {shard_info.index} of {shard_info.num_shards}" if shard_info else ""
            raise ValueError(f"InMemoryDataSource: split {split!r}{where} has no examples")
        keys = list(rows[0])
        columns = {}
        for key in keys:
            values = [row[key] for row in rows]
            if values and isinstance(values[0], (list, tuple)):
                columns[key] = tf.ragged.constant(values)
            else:
                columns[key] = tf.constant(values)
        ds = tf.data.Dataset.from_tensor_slices(columns)
        ds = ds.map(
            lambda x: {k: v.to_tensor() if isinstance(v, tf.RaggedTensor) else v for k, v in x.items()}
        )
        if shuffle:
            ds = ds.shuffle(len(rows), seed=seed, reshuffle_each_iteration=True)
        return ds
