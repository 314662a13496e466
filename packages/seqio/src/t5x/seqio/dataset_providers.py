"""``seqio.dataset_providers``: sources, Task, Mixture, registries and get_dataset, with seqio's semantics.

Every class subclasses its ``t5x.tasks`` counterpart, and the registries share
the core's, so a task registered through ``seqio.TaskRegistry.add`` is found by
``t5x.tasks.get_mixture_or_task`` and by ``t5x-launch``.

Where seqio and the core differ on purpose, this module does what seqio does
(docs/differences.md): ``TextLineDataSource`` yields bare strings,
``TFExampleDataSource`` leaves ``VarLenFeature`` values sparse, random
preprocessors are seeded through ``map_seed_manager`` (post-cache ones from
``seed + 42 * cache_index``), and unknown names raise an error that is both a
``ValueError`` (seqio) and a ``KeyError`` (the core).
"""

from __future__ import annotations

import abc
import dataclasses
import functools
import inspect
import logging
import os
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import tensorflow as tf

from t5x import tasks as _core
from t5x.interfaces import ShardInfo
from t5x.seqio import metrics, task_registry_provenance_tracking, utils
from t5x.seqio._mixtures import Mixture, PyGloveTunableMixture  # re-exported: seqio's home for them
from t5x.seqio._sources import (  # re-exported: seqio users import them from here
    _BARE,
    CacheDatasetPlaceholder,
    DatasetFnCallable,
    DataSource,
    DataSourceInterface,
    FileDataSource,
    FunctionDataSource,
    ProtoDataSource,
    TextLineDataSource,
    TfdsDataSource,
    TFExampleDataSource,
    _CachedDataSource,
    task_cache_dir,
)
from t5x.tasks import Feature, UnknownNameError
from t5x.tasks.seqio_extras import (
    COMPLETED as _OUR_COMPLETED,
)
from t5x.tasks.seqio_extras import (
    ContinuousFeature,
    as_seed_tensor,
    fold_seed,
    is_seqio_cache,
    preprocessor_seed_scope,
    read_stats,
    trim_dataset,
)

_log = logging.getLogger("t5x.seqio")
SHUFFLE_BUFFER_SIZE = 1000
# seqio's rule for task names ('#' allowed, '/' not; the core also takes '/' and '-').
_VALID_TASK_NAME = re.compile(r"^[\w\d\.\:_#]+$")
_MAX_EXAMPLES_TO_MEM_CACHE = 10000


class NotRegisteredError(UnknownNameError, ValueError):
    """No provider has this name (seqio raises ValueError, the core KeyError: this is both)."""


@dataclasses.dataclass(frozen=True)
class SourceInfo:
    """Where a Task was defined."""

    file_path: str
    line_number: int | None = None


class DatasetProviderBase(metaclass=abc.ABCMeta):
    """What Tasks and Mixtures provide."""

    @property
    @abc.abstractmethod
    def output_features(self) -> Mapping[str, Feature]: ...

    @property
    @abc.abstractmethod
    def splits(self) -> Sequence[str]: ...

    @abc.abstractmethod
    def get_dataset(self, sequence_length: Any, split: str, **kwargs: Any) -> tf.data.Dataset: ...

    @abc.abstractmethod
    def num_input_examples(self, split: str) -> int | None: ...


# ---- Task ----------------------------------------------------------------------------------

# Which of (predict, score, predict_with_aux) metric functions a function is.
_METRIC_GROUP = {
    metrics.ModelOutputType.PREDICTION: 0,
    metrics.ModelOutputType.SCORE: 1,
    metrics.ModelOutputType.PREDICTION_WITH_AUX: 2,
}


class Task(_core.Task):
    """seqio's Task on the core's: seqio's constructor, seeding, caching and validation messages.

    Args:
      name: a unique name.
      source: a DataSource (seqio-style or any ``t5x.tasks`` source).
      output_features: feature name -> Feature.
      preprocessors: dataset transformations, applied in order; each gets
        ``sequence_length`` / ``output_features`` when its signature names them.
      postprocess_fn: turns decoded model output into what metrics take.
      metric_fns: functions of ``(targets, predictions)``, ``(targets, scores)`` or
        ``(targets, predictions, aux_values)``.
      metric_objs: seqio metric objects (``t5x.seqio.metrics``), evaluated with the
        metric functions by ``t5x.seqio.Evaluator``.
      shuffle_buffer_size: examples in the shuffle buffer; None forbids shuffling.
      source_info: where the task was defined.
    """

    _requires_output_features = False  # seqio registers tasks without features (e.g. raw-data tasks)
    _requires_feature_objects = False  # and features given as None (its mixtures then refuse them)

    def __init__(
        self,
        name: str,
        source: _core.DataSource,
        output_features: Mapping[str, Feature],
        preprocessors: Sequence[Callable[..., tf.data.Dataset]] | None = None,
        postprocess_fn: Callable[..., Any] | None = None,
        metric_fns: Sequence[Callable[..., Any]] | None = None,
        metric_objs: Sequence[Any] | None = None,
        shuffle_buffer_size: int | None = SHUFFLE_BUFFER_SIZE,
        source_info: SourceInfo | None = None,
    ):
        preps = tuple(preprocessors or ())
        if not isinstance(name, str) or not _VALID_TASK_NAME.match(name):
            raise ValueError(
                f"Task name '{name}' contains invalid characters. Must match regex: {_VALID_TASK_NAME.pattern}"
            )
        if sum(isinstance(p, _core.CacheDatasetPlaceholder) for p in preps) > 1:
            raise ValueError(
                "`CacheDatasetPlaceholder` can appear at most once in the preprocessing pipeline. "
                f"Found multiple in '{name}'."
            )
        super().__init__(
            name,
            source=source,
            output_features=output_features,
            preprocessors=preps,
            postprocess_fn=postprocess_fn,
            metric_fns=tuple(metric_fns or ()),
            shuffle_buffer_size=shuffle_buffer_size,
        )
        self._metric_objs = list(metric_objs or ())
        self._source_info = source_info
        self._cache_step_idx = next(
            (i for i, p in enumerate(preps) if isinstance(p, _core.CacheDatasetPlaceholder)), None
        )
        if self._cache_step_idx is not None and not getattr(source, "caching_permitted", True):
            raise ValueError(
                f"Caching was requested for '{name}', but the underlying data source prohibits caching. "
                "Please remove `CacheDatasetPlaceholder` and try again."
            )
        self._seqio_cache_dir: str | None = None
        self._stats: dict[str, Mapping[str, Any]] = {}

    def __str__(self) -> str:
        return f"Task(name={self.name}, source={self.source})"

    def _validate_preprocessors(self) -> None:
        """Refuses a preprocessor taking ``sequence_length`` before the cache placeholder (seqio's rule).

        Lengths are given when the dataset is read, after the cache; seeded ones
        there only get a warning (each epoch then reads the same draws).
        """
        if self._cache_step_idx is None or getattr(self, "_preprocessors_checked", False):
            return
        for prep in self.preprocessors[: self._cache_step_idx]:
            try:
                args = inspect.signature(prep).parameters
            except (TypeError, ValueError):
                continue
            name = getattr(prep, "__name__", None) or getattr(
                getattr(prep, "func", None), "__name__", repr(prep)
            )
            if "sequence_length" in args:
                raise ValueError(
                    f"'{name}' has a `sequence_length` argument but occurs before `CacheDatasetPlaceholder` in "
                    f"'{self.name}'. This is not allowed since the sequence length is specified at run time."
                )
            if "seed" in args or "seeds" in args:
                _log.warning(
                    "%r has a seed(s) argument but comes before CacheDatasetPlaceholder in %r: every epoch "
                    "read from the cache sees the same draws",
                    name,
                    self.name,
                )
        self._preprocessors_checked = True

    # ---- metrics (validated lazily, like seqio) ----
    @functools.cached_property
    def _sorted_metric_fns(self) -> tuple[list[Callable[..., Any]], ...]:
        groups: tuple[list[Callable[..., Any]], ...] = ([], [], [])
        for fn in self._metric_fns:
            groups[_METRIC_GROUP[metrics.metric_fn_output_type(fn)]].append(fn)
        return groups

    @property
    def metric_fns(self) -> list[Callable[..., Any]]:  # type: ignore[override]
        a, b, c = self._sorted_metric_fns
        return a + b + c

    @property
    def predict_metric_fns(self) -> list[Callable[..., Any]]:  # type: ignore[override]
        return self._sorted_metric_fns[0]

    @property
    def score_metric_fns(self) -> list[Callable[..., Any]]:  # type: ignore[override]
        return self._sorted_metric_fns[1]

    @property
    def predict_with_aux_metric_fns(self) -> list[Callable[..., Any]]:
        return self._sorted_metric_fns[2]

    @functools.cached_property
    def _all_metric_objs(self) -> list[Any]:
        # seqio: the given metric objects, then one PassthroughLegacyMetric per metric function.
        wrapped = [
            metrics.PassthroughLegacyMetric.from_metric_fn(fn, self._postprocess_fn).empty()
            for fn in self.metric_fns
        ]
        return list(self._metric_objs) + wrapped

    @property
    def metric_objs(self) -> list[Any]:
        return list(self._all_metric_objs)

    @property
    def extra_metric_objs(self) -> list[Any]:
        """The metric objects given to the constructor (the core Evaluator runs them beside metric_fns)."""
        return list(self._metric_objs)

    @property
    def source_info(self) -> SourceInfo | None:
        return self._source_info

    @property
    def postprocessor(self) -> Callable[..., Any] | None:
        return self._postprocess_fn

    def replace(self, **kwargs: Any) -> Task:
        """A copy of this task with some constructor arguments replaced."""
        allowed = {
            "name", "source", "output_features", "preprocessors", "postprocess_fn",
            "metric_fns", "metric_objs", "shuffle_buffer_size",
        }  # fmt: skip
        unknown = set(kwargs) - allowed
        if unknown:
            raise ValueError(
                f"Expected keys of kwargs argument task.replace to be one of {sorted(allowed)}. However, "
                f"there were keys in kwargs that are not in this set: {unknown}"
            )
        current: dict[str, Any] = {
            "name": self.name,
            "source": self.source,
            "output_features": self.output_features,
            "preprocessors": self.preprocessors,
            "postprocess_fn": self._postprocess_fn,
            "metric_fns": self._metric_fns,
            "metric_objs": self._metric_objs,
            "shuffle_buffer_size": self._shuffle_buffer_size,
        }
        current.update(kwargs)
        return type(self)(**current, source_info=self._source_info)

    # ---- caching ----
    @property
    def supports_caching(self) -> bool:
        return self._cache_step_idx is not None

    @property
    def requires_caching(self) -> bool:
        return self._cache_step_idx is not None and bool(
            getattr(self.preprocessors[self._cache_step_idx], "required", False)
        )

    @property
    def cache_dir(self) -> str | None:
        """This task's cache folder in the global cache dirs (seqio's layout or ours), or None."""
        if not self._seqio_cache_dir:
            for d in utils.get_global_cache_dirs():
                seqio_dir = os.path.join(d, utils.get_task_dir_from_name(self.name))
                ours = task_cache_dir(d, self.name)
                if tf.io.gfile.exists(os.path.join(seqio_dir, _OUR_COMPLETED)):
                    self._seqio_cache_dir = seqio_dir
                    break
                if tf.io.gfile.exists(os.path.join(ours, _OUR_COMPLETED)):
                    self._seqio_cache_dir = ours
                    break
        return self._seqio_cache_dir

    def assert_cached(self) -> None:
        assert self.cache_dir, f"{self.name!r} does not exist in any of the task cache directories."

    def get_cached_stats(self, split: str = "train") -> Mapping[str, Any]:
        """The cached split's ``stats.<split>.json``.

        Raises:
          AssertionError: the task is not cached (as in seqio).
          ValueError: the split has no stats file.
        """
        self.assert_cached()
        if split not in self._stats:
            assert self.cache_dir is not None
            if not tf.io.gfile.exists(utils.get_cached_stats_path(self.cache_dir, split)):
                raise ValueError(f"Stats do not exist for {self.name!r} split: {split}")
            self._stats[split] = read_stats(self.cache_dir, split)
        return self._stats[split]

    def _get_cached_source(self, split: str) -> _CachedDataSource:
        self.assert_cached()
        assert self.cache_dir is not None
        return _CachedDataSource(self.name, self.cache_dir, split, is_seqio_cache(self.cache_dir))

    # ---- preprocessing ----
    # The core's input pipeline (t5x-launch's BatchIterator, the Beam cache) batches raw
    # examples as dicts. A seqio source may yield bare tensors (TextLineDataSource yields
    # lines), so ``source_dataset`` wraps them under _BARE and preprocessing unwraps them.
    def source_dataset(
        self, split: str, shuffle: bool = True, seed: Any = None, shard_info: Any = None
    ) -> Any:
        ds = super().source_dataset(split, shuffle=shuffle, seed=seed, shard_info=shard_info)
        if not isinstance(ds.element_spec, Mapping):
            ds = ds.map(lambda x: {_BARE: x})
        return ds

    @staticmethod
    def _unwrap(dataset: tf.data.Dataset) -> tf.data.Dataset:
        spec = dataset.element_spec
        if isinstance(spec, Mapping) and set(spec) == {_BARE}:
            return dataset.map(lambda x: x[_BARE])
        return dataset

    def _preprocess_dataset(
        self,
        dataset: tf.data.Dataset,
        start: int,
        stop: int,
        sequence_length: Mapping[str, Any] | None,
        seed: Any,
    ) -> tf.data.Dataset:
        dataset = self._unwrap(dataset)
        core_seed = None if seed is None else as_seed_tensor(seed)
        for index in range(start, stop):
            prep = self.preprocessors[index]
            if isinstance(prep, _core.CacheDatasetPlaceholder):
                continue
            bound = utils.add_kwargs_to_transform(
                prep, sequence_length=sequence_length, output_features=self.output_features
            )
            # Core preprocessors (t5x.tasks) draw their seeds from this scope; seqio-style ones from
            # map_seed_manager when the seed is an int, else from this scope too (see utils).
            if core_seed is None:
                dataset = bound(dataset)
            else:
                with preprocessor_seed_scope(fold_seed(core_seed, index)):
                    dataset = bound(dataset)
        return dataset

    @staticmethod
    def _seed_manager(seed: Any) -> Any:
        # seqio's counter takes Python ints; a seed tensor (from the core's pipelines) leaves it unset.
        return utils.map_seed_manager(int(seed) if isinstance(seed, int | np.integer) else None)

    def preprocess_precache(self, dataset: tf.data.Dataset, seed: Any = None) -> tf.data.Dataset:
        """Runs the preprocessors before the CacheDatasetPlaceholder (none when there is none)."""
        if not self.supports_caching:
            return self._unwrap(dataset)
        with self._seed_manager(seed):
            return self._preprocess_dataset(dataset, 0, self._cache_step_idx or 0, None, seed)

    def preprocess_postcache(  # type: ignore[override]
        self, dataset: tf.data.Dataset, sequence_length: Mapping[str, Any] | None = None, seed: Any = None
    ) -> tf.data.Dataset:
        """Runs the preprocessors after the CacheDatasetPlaceholder (all of them when there is none)."""
        start = 0
        if self.supports_caching:
            assert self._cache_step_idx is not None
            if isinstance(seed, int | np.integer):
                seed = int(seed) + 42 * self._cache_step_idx
            elif seed is not None:
                seed = fold_seed(as_seed_tensor(seed), 42 * self._cache_step_idx)
            start = self._cache_step_idx + 1
        with self._seed_manager(seed):
            return self._preprocess_dataset(dataset, start, len(self.preprocessors), sequence_length, seed)

    def preprocess(
        self,
        dataset: tf.data.Dataset,
        sequence_length: Mapping[str, Any] | None = None,
        seed: Any = None,
        trim_output_features: bool = True,
    ) -> tf.data.Dataset:
        """Every preprocessor, pre- and post-cache, then validation and (optionally) trimming."""
        ds = self.preprocess_postcache(self.preprocess_precache(dataset, seed), sequence_length, seed)
        ds = self._validate_preprocessing(ds)
        return trim_dataset(ds, sequence_length, self.output_features) if trim_output_features else ds

    def _validate_preprocessing(self, dataset: tf.data.Dataset) -> tf.data.Dataset:
        spec = dataset.element_spec
        if not isinstance(spec, Mapping):
            raise ValueError(
                f"Task {self.name!r}: preprocessed examples must be dicts of features, got {spec}"
            )
        for key, feature in self.output_features.items():
            if key not in spec:
                if feature.required:
                    raise ValueError(
                        f"Task dataset is missing expected output feature after preprocessing: {key}"
                    )
                continue
            got = spec[key]
            if feature.dtype != got.dtype:
                raise ValueError(
                    f"Task dataset has incorrect type for feature '{key}' after preprocessing: "
                    f"Got {got.dtype.name}, expected {feature.dtype.name}"
                )
            if feature.rank != got.shape.rank:
                raise ValueError(
                    f"Task dataset has incorrect rank for feature '{key}' after preprocessing: "
                    f"Got {got.shape.rank}, expected {feature.rank}"
                )
        return dataset

    def get_dataset(  # type: ignore[override]
        self,
        sequence_length: Mapping[str, Any] | None = None,
        split: str = "train",
        use_cached: bool = False,
        shuffle: bool = True,
        shuffle_buffer_size: int | None = None,
        seed: int | None = None,
        shard_info: ShardInfo | None = None,
        num_epochs: int | None = 1,
        trim_output_features: bool = True,
        try_in_mem_cache: bool = True,
    ) -> tf.data.Dataset:
        """The task's examples, from the offline cache or preprocessed on the fly (seqio's rules)."""
        self._validate_preprocessors()
        if use_cached and not self.supports_caching:
            _log.warning("Task %r does not support caching; preprocessing on the fly", self.name)
            use_cached = False
        elif self.requires_caching and not use_cached:
            raise ValueError(f"Task {self.name!r} requires caching, but was called with `use_cached=False`.")
        source: _core.DataSource = self._get_cached_source(split) if use_cached else self.source
        if split not in source.splits:
            raise ValueError(
                f"Task {self.name!r} has no split {split!r}; available splits: {', '.join(source.splits)}"
            )
        if getattr(source, "supports_arbitrary_sharding", False) or (
            shard_info and len(source.list_shards(split)) >= shard_info.num_shards
        ):
            ds = source.get_dataset(split=split, shuffle=shuffle, seed=seed, shard_info=shard_info)
        else:
            ds = source.get_dataset(split=split, shuffle=shuffle, seed=seed)
            if shard_info:
                ds = ds.shard(shard_info.num_shards, shard_info.index)
        count = source.num_input_examples(split)
        if try_in_mem_cache and count and count < _MAX_EXAMPLES_TO_MEM_CACHE:
            ds = ds.cache()
        if not use_cached:
            ds = self.preprocess_precache(ds, seed=seed)
        ds = ds.prefetch(tf.data.AUTOTUNE).repeat(num_epochs)
        ds = self.preprocess_postcache(ds, sequence_length=sequence_length, seed=seed)
        ds = self._validate_preprocessing(ds)
        if trim_output_features:
            ds = trim_dataset(ds, sequence_length, self.output_features)
        if shuffle:
            if getattr(source, "_performs_internal_shuffling", False):
                pass  # the source shuffles (as seqio lets a source say); no second buffer
            elif self._shuffle_buffer_size is None:
                raise ValueError(
                    f"Shuffling is disallowed for Task {self.name!r} since its `shuffle_buffer_size` was set "
                    "to `None` on construction."
                )
            else:
                ds = ds.shuffle(shuffle_buffer_size or self._shuffle_buffer_size, seed=seed)
        return ds.prefetch(tf.data.AUTOTUNE)


# ---- registries and Mixture ----------------------------------------------------------------


def _not_registered(error: UnknownNameError) -> NotRegisteredError:
    return NotRegisteredError(str(error))


class DatasetProviderRegistry:
    """Class-level registry helpers shared by TaskRegistry and MixtureRegistry."""

    _REGISTRY: ClassVar[dict[str, Any]]


class _SharedRegistryMeta(type):
    """Keeps a facade registry's ``_REGISTRY`` the core's dict, even when code assigns a new one.

    seqio's tests reset registries with ``TaskRegistry._REGISTRY = {}``; that replaces the
    contents of the shared dict instead of detaching the facade from the core.
    """

    def __setattr__(cls, name: str, value: Any) -> None:
        if name == "_REGISTRY":
            shared = cls._REGISTRY  # type: ignore[attr-defined]
            if value is not shared:
                shared.clear()
                shared.update(value)
            return
        super().__setattr__(name, value)


def _refuse_duplicate(registry: Any, name: str) -> None:
    if name in registry._REGISTRY:
        raise ValueError(f"Attempting to register duplicate provider: {name}")


class TaskRegistry(_core.TaskRegistry, metaclass=_SharedRegistryMeta):
    """The global task registry (the core's): ``add`` takes seqio's arguments."""

    @classmethod
    def add_provider(cls, name: str, provider: Any) -> Any:  # type: ignore[override]
        _refuse_duplicate(cls, name)
        added = super().add_provider(name, provider)
        task_registry_provenance_tracking.maybe_record_provenance(inspect.currentframe(), name, provider)
        return added

    @classmethod
    def add(  # type: ignore[override]
        cls,
        name: str,
        source: Any = None,
        output_features: Mapping[str, Feature] | None = None,
        preprocessors: Sequence[Callable[..., Any]] | None = None,
        postprocess_fn: Callable[..., Any] | None = None,
        metric_fns: Sequence[Callable[..., Any]] | None = None,
        task_cls: type[_core.Task] = Task,
        **kwargs: Any,
    ) -> _core.Task:
        """Builds a Task (a seqio-style one unless ``task_cls`` says otherwise) and registers it."""
        if output_features is None:
            raise TypeError(f"TaskRegistry.add({name!r}): output_features is required")
        task = task_cls(
            name,
            source=source,
            output_features=output_features,
            preprocessors=preprocessors or (),
            postprocess_fn=postprocess_fn,
            metric_fns=metric_fns or (),
            **kwargs,
        )
        return cls.add_provider(name, task)

    @classmethod
    def get(cls, name: str) -> _core.Task:
        try:
            return super().get(name)
        except UnknownNameError as error:
            raise _not_registered(error) from None

    @classmethod
    def get_dataset(cls, name: str, sequence_length: Any, split: str, **kwargs: Any) -> tf.data.Dataset:
        return cls.get(name).get_dataset(sequence_length=sequence_length, split=split, **kwargs)


class MixtureRegistry(_core.MixtureRegistry, metaclass=_SharedRegistryMeta):
    """The global mixture registry (the core's), building seqio-style Mixtures."""

    @classmethod
    def add_provider(cls, name: str, provider: Any) -> Any:  # type: ignore[override]
        _refuse_duplicate(cls, name)
        added = super().add_provider(name, provider)
        task_registry_provenance_tracking.maybe_record_provenance(inspect.currentframe(), name, provider)
        return added

    @classmethod
    def add(  # type: ignore[override]
        cls,
        name: str,
        tasks: Sequence[Any],
        default_rate: Any = None,
        mixture_cls: type[_core.Mixture] = Mixture,
        **kwargs: Any,
    ) -> _core.Mixture:
        mixture: _core.Mixture
        if mixture_cls is Mixture or (isinstance(mixture_cls, type) and issubclass(mixture_cls, Mixture)):
            mixture = mixture_cls(name, tasks, default_rate=default_rate, **kwargs)
        else:
            mixture = mixture_cls(
                name, tasks, default_rate=default_rate, resolve=get_mixture_or_task, **kwargs
            )
        return cls.add_provider(name, mixture)

    @classmethod
    def get(cls, name: str) -> _core.Mixture:
        try:
            return super().get(name)
        except UnknownNameError as error:
            raise _not_registered(error) from None


def get_mixture_or_task(task_or_mixture_name: str) -> Any:
    """The registered Task or Mixture of that name.

    Raises:
      NotRegisteredError: (a ValueError and a KeyError) listing the closest names.
    """
    try:
        return _core.get_mixture_or_task(task_or_mixture_name)
    except UnknownNameError as error:
        raise _not_registered(error) from None


def maybe_get_mixture_or_task(task: Any) -> Any:
    """A provider by name, or the provider given."""
    return get_mixture_or_task(task) if isinstance(task, str) else task


def get_subtasks(task_or_mixture: Any) -> list[_core.Task]:
    """The leaf tasks of a task (itself) or a mixture."""
    return list(task_or_mixture.tasks)


def get_dataset(
    mixture_or_task_name: Any,
    task_feature_lengths: Mapping[str, Any] | None,
    feature_converter: Any = None,
    dataset_split: str = "train",
    use_cached: bool = False,
    shuffle: bool = False,
    num_epochs: int | None = 1,
    shard_info: ShardInfo | None = None,
    verbose: bool = True,
    seed: int | None = None,
    batch_size: int | None = None,
    trim_output_features: bool = True,
) -> tf.data.Dataset:
    """A task's (or mixture's) examples through a feature converter, optionally batched.

    ``feature_converter=None`` uses a PassThroughFeatureConverter (examples unchanged).
    """
    from t5x.tasks.seqio_extras import get_dataset as _get_dataset

    return _get_dataset(
        maybe_get_mixture_or_task(mixture_or_task_name),
        task_feature_lengths,
        feature_converter=feature_converter,
        dataset_split=dataset_split,
        use_cached=use_cached,
        shuffle=shuffle,
        num_epochs=num_epochs,
        shard_info=shard_info,
        verbose=verbose,
        seed=seed,
        batch_size=batch_size,
        trim_output_features=trim_output_features,
    )


__all__ = [
    "CacheDatasetPlaceholder",
    "ContinuousFeature",
    "DataSource",
    "DatasetFnCallable",
    "DataSourceInterface",
    "DatasetProviderBase",
    "DatasetProviderRegistry",
    "Feature",
    "FileDataSource",
    "FunctionDataSource",
    "Mixture",
    "MixtureRegistry",
    "NotRegisteredError",
    "ProtoDataSource",
    "PyGloveTunableMixture",
    "ShardInfo",
    "SourceInfo",
    "TFExampleDataSource",
    "Task",
    "TaskRegistry",
    "TextLineDataSource",
    "TfdsDataSource",
    "get_dataset",
    "get_mixture_or_task",
    "get_subtasks",
    "maybe_get_mixture_or_task",
]
