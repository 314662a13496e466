"""Task: a data source, preprocessors and output features (seqio's Task)."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from t5x.interfaces import ShardInfo
from t5x.tasks._feature import Feature
from t5x.tasks._lazy_tf import tf
from t5x.tasks._sources import DataSource
from t5x.tasks._utils import (
    AUTOTUNE,
    accepted_kwargs,
    as_seed_tensor,
    fold_seed,
    function_name,
    preprocessor_seed_scope,
)

_NAME_RE = re.compile(r"^[\w.:/#-]+$")
DEFAULT_SHUFFLE_BUFFER_SIZE = 1000


class CacheDatasetPlaceholder:
    """Marks where in a task's preprocessors an offline cache would be written.

    Preprocessors before it run when caching; the ones after it run every time
    the dataset is read. Without a cache all of them run on the fly.
    """

    def __init__(self, required: bool = False):
        self.required = required

    def __call__(self, dataset: tf.data.Dataset) -> tf.data.Dataset:
        return dataset


def check_name(kind: str, name: Any) -> str:
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ValueError(
            f"{kind} name must be a non-empty string of letters, digits and _ . : / - #, got {name!r}"
        )
    return name


class Task:
    """A dataset definition: source -> preprocessors -> output features.

    Constructing (or registering) a task does no I/O and builds no dataset.

    Args:
      name: a unique name (letters, digits and ``_ . : / - #``).
      source: the DataSource of raw examples.
      output_features: feature name -> Feature of the preprocessed examples.
      preprocessors: dataset transformations ``fn(ds, **kwargs) -> ds``, applied
        in order; each gets ``sequence_length``, ``output_features`` (and
        nothing else) when its signature names them. Random ones draw seeds
        through ``map_over_dataset(num_seeds=...)``.
      postprocess_fn: turns decoded model output (text) into what metrics take.
      metric_fns: ``fn(targets, predictions) -> dict`` (or ``fn(targets, scores)``).
      shuffle_buffer_size: examples in the shuffle buffer after preprocessing.
    """

    # seqio accepts a Task without output features (t5x.seqio's Task turns this off).
    _requires_output_features = True
    # seqio also takes a feature given as None (t5x.seqio's Task turns this off).
    _requires_feature_objects = True

    def __init__(
        self,
        name: str,
        source: DataSource,
        output_features: Mapping[str, Feature],
        preprocessors: Sequence[Callable[..., tf.data.Dataset]] = (),
        postprocess_fn: Callable[..., Any] | None = None,
        metric_fns: Sequence[Callable[..., Mapping[str, Any]]] = (),
        shuffle_buffer_size: int | None = DEFAULT_SHUFFLE_BUFFER_SIZE,
    ):
        self._name = check_name("Task", name)
        if not isinstance(source, DataSource):
            raise TypeError(
                f"Task {name!r}: source must be a t5x.tasks DataSource, got {type(source).__name__}"
            )
        if not output_features and self._requires_output_features:
            raise ValueError(f"Task {name!r}: output_features must name at least one feature")
        for key, feature in output_features.items():
            if feature is None and not self._requires_feature_objects:
                continue
            if not isinstance(feature, Feature):
                raise TypeError(
                    f"Task {name!r}: output feature {key!r} must be a Feature, got {type(feature).__name__}"
                )
        self._source = source
        self._output_features = dict(sorted(output_features.items()))
        self._preprocessors = tuple(preprocessors)
        for i, prep in enumerate(self._preprocessors):
            if not callable(prep):
                raise TypeError(f"Task {name!r}: preprocessor {i} is not callable: {prep!r}")
        if sum(isinstance(p, CacheDatasetPlaceholder) for p in self._preprocessors) > 1:
            raise ValueError(f"Task {name!r}: at most one CacheDatasetPlaceholder is allowed")
        self._postprocess_fn = postprocess_fn
        self._metric_fns = tuple(metric_fns)
        self._shuffle_buffer_size = shuffle_buffer_size

    # ---- descriptive members -------------------------------------------------
    @property
    def name(self) -> str:
        return self._name

    @property
    def source(self) -> DataSource:
        return self._source

    @property
    def output_features(self) -> dict[str, Feature]:
        return dict(self._output_features)

    @property
    def preprocessors(self) -> tuple[Callable[..., tf.data.Dataset], ...]:
        return self._preprocessors

    @property
    def splits(self) -> tuple[str, ...]:
        return self._source.splits

    @property
    def metric_fns(self) -> tuple[Callable[..., Mapping[str, Any]], ...]:
        return self._metric_fns

    @property
    def predict_metric_fns(self) -> tuple[Callable[..., Mapping[str, Any]], ...]:
        """Metric functions taking ``(targets, predictions)``."""
        return tuple(f for f in self._metric_fns if "scores" not in inspect.signature(f).parameters)

    @property
    def score_metric_fns(self) -> tuple[Callable[..., Mapping[str, Any]], ...]:
        """Metric functions taking ``(targets, scores)``."""
        return tuple(f for f in self._metric_fns if "scores" in inspect.signature(f).parameters)

    @property
    def shuffle_buffer_size(self) -> int | None:
        return self._shuffle_buffer_size

    @property
    def tasks(self) -> list[Task]:
        """A task is a mixture of itself alone (so code can treat both alike)."""
        return [self]

    def get_rate(self, task: Task) -> float:
        return 1.0 if task is self else 0.0

    def num_input_examples(self, split: str) -> int | None:
        return self._source.num_input_examples(split)

    def postprocess_fn(self, decoded_model_output: Any, **kwargs: Any) -> Any:
        """Applies the task's ``postprocess_fn`` (identity when none)."""
        if self._postprocess_fn is None:
            return decoded_model_output
        return self._postprocess_fn(decoded_model_output, **kwargs)

    def __repr__(self) -> str:
        return f"Task({self._name!r}, features={list(self._output_features)})"

    # ---- datasets -------------------------------------------------------------
    def source_dataset(
        self, split: str, shuffle: bool = True, seed: int | None = None, shard_info: ShardInfo | None = None
    ) -> tf.data.Dataset:
        """The raw examples of one shard of ``split``.

        Raises:
          ValueError: the split is unknown or known to be empty.
        """
        if split not in self.splits:
            raise ValueError(
                f"Task {self._name!r} has no split {split!r}; available splits: {', '.join(self.splits)}"
            )
        if self._source.num_input_examples(split) == 0:
            raise ValueError(f"Task {self._name!r}: split {split!r} is empty")
        return self._source.get_dataset(split=split, shuffle=shuffle, seed=seed, shard_info=shard_info)

    def _cache_index(self) -> int:
        for i, prep in enumerate(self._preprocessors):
            if isinstance(prep, CacheDatasetPlaceholder):
                return i
        return 0

    def preprocess_precache(self, dataset: tf.data.Dataset, seed: Any = None) -> tf.data.Dataset:
        """Runs the preprocessors before the CacheDatasetPlaceholder."""
        return self._run_preprocessors(dataset, 0, self._cache_index(), None, seed)

    def preprocess_postcache(
        self,
        dataset: tf.data.Dataset,
        sequence_length: Mapping[str, int | None] | None = None,
        seed: Any = None,
    ) -> tf.data.Dataset:
        """Runs the preprocessors after the CacheDatasetPlaceholder."""
        return self._run_preprocessors(
            dataset, self._cache_index(), len(self._preprocessors), sequence_length, seed
        )

    def preprocess(
        self,
        dataset: tf.data.Dataset,
        sequence_length: Mapping[str, int | None] | None = None,
        seed: Any = None,
        trim_output_features: bool = True,
    ) -> tf.data.Dataset:
        """Runs every preprocessor, validates and (optionally) trims the output features.

        Args:
          dataset: raw examples.
          sequence_length: feature name -> maximum length (None: no limit).
          seed: an int or an int64 [2] tensor; random preprocessors derive
            their seeds from it and the example position.
          trim_output_features: cut features longer than ``sequence_length``.
        """
        history: list[tuple[str, set[str]]] = [("the source", set(dataset.element_spec))]
        ds = self._run_preprocessors(dataset, 0, len(self._preprocessors), sequence_length, seed, history)
        ds = self._validate(ds, history)
        if trim_output_features:
            ds = self._trim(ds, sequence_length)
        return ds

    def _run_preprocessors(
        self,
        ds: tf.data.Dataset,
        start: int,
        stop: int,
        sequence_length: Mapping[str, int | None] | None,
        seed: Any,
        history: list[tuple[str, set[str]]] | None = None,
    ) -> tf.data.Dataset:
        base = as_seed_tensor(seed)
        for index in range(start, stop):
            prep = self._preprocessors[index]
            if isinstance(prep, CacheDatasetPlaceholder):
                continue
            name = function_name(prep)
            kwargs = accepted_kwargs(
                prep, sequence_length=sequence_length, output_features=self._output_features
            )
            if "sequence_length" in kwargs and sequence_length is None and _requires(prep, "sequence_length"):
                raise ValueError(f"Task {self._name!r}: preprocessor {name} needs sequence_length, got None")
            try:
                with preprocessor_seed_scope(fold_seed(base, index)):
                    ds = prep(ds, **kwargs)
            except Exception as e:
                e.add_note(f"raised by preprocessor {index} ({name}) of task {self._name!r}")
                raise
            if not isinstance(ds, tf.data.Dataset):
                raise TypeError(
                    f"Task {self._name!r}: preprocessor {index} ({name}) must return a tf.data.Dataset, "
                    f"got {type(ds).__name__}"
                )
            if history is not None:
                history.append((f"preprocessor {index} ({name})", set(ds.element_spec)))
        return ds

    def _validate(self, ds: tf.data.Dataset, history: list[tuple[str, set[str]]]) -> tf.data.Dataset:
        spec = ds.element_spec
        if not isinstance(spec, Mapping):
            raise TypeError(f"Task {self._name!r}: preprocessed examples must be dicts, got {spec}")
        for key, feature in self._output_features.items():
            if key not in spec:
                if not feature.required:
                    continue
                raise ValueError(
                    f"Task {self._name!r}: output feature {key!r} is missing; {_where_lost(key, history)}"
                )
            got = spec[key]
            if got.dtype != feature.dtype:
                raise ValueError(
                    f"Task {self._name!r}: feature {key!r} has dtype {got.dtype.name} after preprocessing, "
                    f"expected {feature.dtype.name} (did you forget to tokenize it?)"
                )
            if got.shape.rank is not None and got.shape.rank != feature.rank:
                raise ValueError(
                    f"Task {self._name!r}: feature {key!r} has rank {got.shape.rank} after preprocessing, "
                    f"expected {feature.rank}"
                )
        return ds

    def _trim(self, ds: tf.data.Dataset, sequence_length: Mapping[str, int | None] | None) -> tf.data.Dataset:
        if not sequence_length:
            return ds
        limits = {k: n for k, n in sequence_length.items() if k in self._output_features and n is not None}

        def trim(x: Mapping[str, Any]) -> dict[str, Any]:
            return {k: v[: limits[k]] if k in limits else v for k, v in x.items()}

        return ds.map(trim, num_parallel_calls=AUTOTUNE)

    def get_dataset(
        self,
        sequence_length: Mapping[str, int | None] | None = None,
        split: str = "train",
        use_cached: bool = False,
        shuffle: bool = True,
        shuffle_buffer_size: int | None = None,
        seed: int | None = None,
        shard_info: ShardInfo | None = None,
        num_epochs: int | None = 1,
        trim_output_features: bool = True,
    ) -> tf.data.Dataset:
        """Returns the preprocessed examples of one shard of ``split`` (seqio semantics).

        Args:
          sequence_length: feature name -> maximum length; passed to
            preprocessors that ask and used to trim the output features.
          split: the split name.
          use_cached: read the offline cache written by ``t5x-tasks cache`` from the
            global cache dirs (``add_global_cache_dirs``) instead of the source.
          shuffle: shuffle files and, after preprocessing, examples.
          shuffle_buffer_size: overrides the task's buffer size.
          seed: makes file order, shuffling and random preprocessors reproducible.
          shard_info: which shard of the split to read.
          num_epochs: passes over the data, None for forever.
          trim_output_features: cut features longer than ``sequence_length``.

        Returns:
          a ``tf.data.Dataset`` of dicts with each output feature (int32 ``[length]``).

        Raises:
          ValueError: unknown or empty split, a missing or mistyped feature.
        """
        base = as_seed_tensor(seed)
        cache_at = self._cache_index()
        if use_cached:
            from t5x.tasks._offline_cache import read_cached_split

            ds = read_cached_split(self._name, split, shard_info=shard_info, shuffle=shuffle, seed=seed)
            history: list[tuple[str, set[str]]] = [("the offline cache", set(ds.element_spec))]
        else:
            ds = self.source_dataset(split, shuffle=shuffle, seed=seed, shard_info=shard_info)
            history = [("the source", set(ds.element_spec))]
            ds = self._run_preprocessors(ds, 0, cache_at, None, base, history)
        if num_epochs != 1:
            ds = ds.repeat(num_epochs)
        ds = self._run_preprocessors(ds, cache_at, len(self._preprocessors), sequence_length, base, history)
        ds = self._validate(ds, history)
        if trim_output_features:
            ds = self._trim(ds, sequence_length)
        if shuffle:
            buffer = shuffle_buffer_size or self._shuffle_buffer_size
            if buffer:
                ds = ds.shuffle(buffer, seed=seed)
        return ds.prefetch(AUTOTUNE)


def _requires(fn: Callable[..., Any], param: str) -> bool:
    try:
        p = inspect.signature(fn).parameters[param]
    except (TypeError, ValueError, KeyError):
        return False
    return p.default is inspect.Parameter.empty


def _where_lost(key: str, history: list[tuple[str, set[str]]]) -> str:
    last_seen = None
    for i, (_, keys) in enumerate(history):
        if key in keys:
            last_seen = i
    if last_seen is None:
        return "the source does not provide it and no preprocessor creates it"
    if last_seen + 1 < len(history):
        return (
            f"it disappeared after {history[last_seen + 1][0]} (it was present after {history[last_seen][0]})"
        )
    return "it is present in the data but was filtered out"
