"""``seqio.experimental``: fully-cached tasks and mixtures, few-shot sources, sentinel tasks.

* ``add_fully_cached_task(name, sequence_length)`` registers a copy of a task
  whose whole pipeline runs at cache time with those lengths; it must be read
  from a cache and with exactly those lengths (or none).
* ``add_fully_cached_mixture`` does the same for every task of a mixture.
* ``FewshotDataSource`` zips each example of a split with a batch of
  ``num_shots`` examples of the train split; ``fewshot_preprocessor`` turns such
  pairs into prompt strings.
* ``add_task_with_sentinels`` registers a copy of a task with sentinel ids at
  the end of ``inputs`` and the start of ``targets``.
* ``disable_registry()`` makes registering a no-op and ``get`` an error (for
  binaries that must not depend on global registration).
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import tensorflow as tf

from t5x import tasks as _core
from t5x.seqio import dataset_providers, preprocessors, utils
from t5x.seqio.dataset_providers import (
    CacheDatasetPlaceholder,
    DataSource,
    Feature,
    MixtureRegistry,
    ShardInfo,
    TaskRegistry,
)

_log = logging.getLogger("t5x.seqio")

__all__ = [
    "FewshotDataSource",
    "add_fully_cached_mixture",
    "add_fully_cached_task",
    "add_task_with_sentinels",
    "disable_registry",
    "fewshot_preprocessor",
]


# ---------------------------------------------------------------- registries


def _name_arg(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
    return kwargs["name"] if "name" in kwargs else (args[0] if args else "")


def _ignore_task_add(*args: Any, **kwargs: Any) -> None:
    _log.info("Registry disabled: not registering task %s", _name_arg(args, kwargs))


def _ignore_mixture_add(*args: Any, **kwargs: Any) -> None:
    _log.info("Registry disabled: not registering mixture %s", _name_arg(args, kwargs))


def _refuse_task_get(*args: Any, **kwargs: Any) -> Any:
    raise ValueError(f"Disabled TaskRegistry.get call: {_name_arg(args, kwargs)}")


def _refuse_mixture_get(*args: Any, **kwargs: Any) -> Any:
    raise ValueError(f"Disabled MixtureRegistry.get call: {_name_arg(args, kwargs)}")


def disable_registry() -> None:
    """Turns ``TaskRegistry``/``MixtureRegistry`` ``add``/``add_provider`` into no-ops and ``get`` into errors.

    Raises:
      ValueError: something is registered already (it would be silently visible).
    """
    non_empty = [r.__name__ for r in (TaskRegistry, MixtureRegistry) if r.names()]
    if non_empty:
        raise ValueError(
            f"The {', '.join(non_empty)} is non-empty. Please invoke `disable_registry()` before any "
            "Task/Mixtures are registered."
        )
    # Plain functions on the class: called as TaskRegistry.add(...) they get no cls.
    TaskRegistry.add = _ignore_task_add  # type: ignore[method-assign,assignment]
    TaskRegistry.add_provider = _ignore_task_add  # type: ignore[method-assign,assignment]
    TaskRegistry.get = _refuse_task_get  # type: ignore[method-assign,assignment]
    MixtureRegistry.add = _ignore_mixture_add  # type: ignore[method-assign,assignment]
    MixtureRegistry.add_provider = _ignore_mixture_add  # type: ignore[method-assign,assignment]
    MixtureRegistry.get = _refuse_mixture_get  # type: ignore[method-assign,assignment]


# ------------------------------------------------------------- fully cached


def _fully_cached_name(name: str, sequence_length: Mapping[str, int]) -> str:
    """``name`` + ``_`` + each feature's shortest distinguishing prefix and length, e.g. ``t_i5_t3``."""
    features = list(sequence_length)
    width = 0
    while len({f[:width] for f in features}) != len(features):
        width += 1
    return f"{name}_" + "_".join(f"{f[:width]}{sequence_length[f]}" for f in features)


def _with_fixed_lengths(prep: Callable[..., Any], lengths: Mapping[str, int]) -> Callable[..., Any]:
    """``prep`` called with the fixed lengths, whatever lengths the pipeline is run with."""
    wanted = inspect.signature(prep).parameters

    def run(ds: tf.data.Dataset, output_features: Mapping[str, Feature]) -> tf.data.Dataset:
        kwargs: dict[str, Any] = {}
        if "sequence_length" in wanted:
            kwargs["sequence_length"] = lengths
        if "output_features" in wanted:
            kwargs["output_features"] = output_features
        return prep(ds, **kwargs)

    return run


def add_fully_cached_task(
    task_name: str, sequence_length: Mapping[str, int], disallow_shuffling: bool = False
) -> _core.Task:
    """Registers (once) a copy of ``task_name`` cached after its last preprocessor, at ``sequence_length``.

    The copy is named ``<task>_<feature prefix><length>_...``; it requires
    ``use_cached=True`` and accepts only ``sequence_length`` itself or None.
    """
    task: Any = TaskRegistry.get(task_name)  # a seqio-style Task (has .postprocessor)
    new_name = _fully_cached_name(task_name, sequence_length)
    if new_name in TaskRegistry.names():
        return TaskRegistry.get(new_name)
    fixed = dict(sequence_length)

    steps: list[Callable[..., Any]] = [
        _with_fixed_lengths(p, fixed)
        for p in task.preprocessors
        if not isinstance(p, CacheDatasetPlaceholder)
    ]
    steps.append(CacheDatasetPlaceholder(required=True))

    def check_lengths(ds: tf.data.Dataset, sequence_length: Mapping[str, int] | None) -> tf.data.Dataset:
        # The cache holds examples built with `fixed`; other lengths would be silently wrong.
        if sequence_length is not None and dict(sequence_length) != fixed:
            raise ValueError(
                f"Fully-cached task '{new_name}' can only be loaded with `sequence_length={fixed}` or "
                f"`None`. Given sequence_length={sequence_length}."
            )
        return ds

    steps.append(check_lengths)
    _log.info("Registering fully cached task %r with sequence lengths %s", new_name, fixed)
    return TaskRegistry.add(
        new_name,
        source=task.source,
        preprocessors=steps,
        output_features=task.output_features,
        metric_fns=list(task.metric_fns),
        postprocess_fn=task.postprocessor,
        shuffle_buffer_size=None if disallow_shuffling else dataset_providers.SHUFFLE_BUFFER_SIZE,
    )


def add_fully_cached_mixture(
    mixture_name: str, sequence_length: Mapping[str, int], disallow_shuffling: bool = False
) -> _core.Mixture:
    """Registers a mixture of the fully-cached copies of ``mixture_name``'s tasks, at the same rates."""
    mixture = MixtureRegistry.get(mixture_name)
    rates = mixture._task_to_rate  # type: ignore[attr-defined]
    entries = []
    for task in mixture.tasks:
        cached = add_fully_cached_task(task.name, sequence_length, disallow_shuffling)
        entries.append((cached.name, rates[task.name]))
    new_name = _fully_cached_name(mixture_name, sequence_length)
    _log.info("Registering fully cached mixture %r with sequence lengths %s", new_name, sequence_length)
    return MixtureRegistry.add(new_name, entries)


# ------------------------------------------------------------------ few-shot


class FewshotDataSource(DataSource):
    """Each example of a split as ``{"eval": example, "train": {key: [num_shots] batch}}``.

    The train examples come from ``train_split`` of ``original_source``, always
    shuffled (with seed 0 when ``shuffle=False``, so the result is still
    deterministic); the eval side uses ``seed + 1`` so one-shot pairs never
    pair an example with itself. With ``num_shots=0`` there is no "train" key.

    Args:
      original_source: the source both sides read.
      num_shots: train examples per eval example.
      train_preprocessors / eval_preprocessors: ``ds -> ds`` functions run on
        each side before zipping.
      train_split: the split the shots come from.
      train_feature_keys: the train features kept (variable-length ones that
        cannot be batched must be dropped).
      shuffle_buffer_size: of each side's example-level shuffle.
      eval_on_fixed_exemplars: outside ``train_split``, every eval example gets
        the same first batch of shots.
    """

    def __init__(
        self,
        original_source: Any,
        num_shots: int,
        train_preprocessors: Iterable[Callable[[tf.data.Dataset], tf.data.Dataset]] = (),
        eval_preprocessors: Iterable[Callable[[tf.data.Dataset], tf.data.Dataset]] = (),
        train_split: str = "train",
        train_feature_keys: Iterable[str] = ("inputs", "targets"),
        shuffle_buffer_size: int = dataset_providers.SHUFFLE_BUFFER_SIZE,
        eval_on_fixed_exemplars: bool = False,
    ):
        self._original_source = original_source
        self._num_shots = num_shots
        self._train_preprocessors = list(train_preprocessors)
        self._eval_preprocessors = list(eval_preprocessors)
        self._train_split = train_split
        self._train_feature_keys = list(train_feature_keys)
        self._shuffle_buffer_size = shuffle_buffer_size
        self._eval_on_fixed_exemplars = eval_on_fixed_exemplars
        super().__init__(splits=())

    @property
    def splits(self) -> Sequence[str]:  # type: ignore[override]
        return self._original_source.splits

    @property
    def supports_arbitrary_sharding(self) -> bool:  # type: ignore[override]
        return False

    def list_shards(self, split: str) -> list[str]:
        return list(self._original_source.list_shards(split))

    def _side(self, split: str, shuffle: bool, seed: int | None, shard_info: ShardInfo) -> tf.data.Dataset:
        source = self._original_source
        if len(source.list_shards(split)) >= shard_info.num_shards:
            ds = source.get_dataset(split=split, shuffle=shuffle, seed=seed, shard_info=shard_info)
        else:  # too few shards to split by shard: split by example
            ds = source.get_dataset(split=split, shuffle=shuffle, seed=seed)
            ds = ds.shard(shard_info.num_shards, shard_info.index)
        if shuffle:
            # Sources may shuffle only their files; shuffle the examples too.
            ds = ds.shuffle(self._shuffle_buffer_size, seed=seed, reshuffle_each_iteration=True)
        return ds

    def get_dataset(  # type: ignore[override]
        self,
        split: str = "train",
        shuffle: bool = True,
        seed: int | None = None,
        shard_info: ShardInfo | None = None,
        *,
        sequence_length: Mapping[str, int] | None = None,
        use_cached: bool = False,
        num_epochs: int | None = 1,
    ) -> tf.data.Dataset:
        del sequence_length, use_cached, num_epochs
        shard_info = shard_info or ShardInfo(0, 1)
        if self._train_split not in self._original_source.splits:
            raise ValueError(
                f"FewshotDataSource: Train split '{self._train_split}' is not one of the original source "
                f"splits: {self._original_source.splits}"
            )
        train_seed, eval_seed = (None, None) if seed is None else (seed, seed + 1)
        parts: dict[str, tf.data.Dataset] = {}
        if self._num_shots:
            train = self._side(self._train_split, True, train_seed if shuffle else 0, shard_info)
            for prep in self._train_preprocessors:
                train = prep(train)
            keys = self._train_feature_keys
            train = train.map(lambda ex: {k: ex[k] for k in keys}, num_parallel_calls=tf.data.AUTOTUNE)
            train = train.repeat().batch(self._num_shots)
            if self._eval_on_fixed_exemplars and split != self._train_split:
                train = train.take(1).cache().repeat()
            parts["train"] = train
        else:
            _log.warning("FewshotDataSource: num_shots is 0, so examples carry no train shots")
        evals = self._side(split, shuffle, eval_seed, shard_info)
        for prep in self._eval_preprocessors:
            evals = prep(evals)
        parts["eval"] = evals
        return tf.data.Dataset.zip(parts)


def fewshot_preprocessor(
    ds: tf.data.Dataset,
    inputs_prefix: str = "",
    targets_prefix: str = "",
    example_separator: str = "\n\n",
    prompt: str = "",
    reverse: bool = False,
) -> tf.data.Dataset:
    """Joins a ``FewshotDataSource`` pair into ``inputs`` (prompt, shots, eval input) and ``targets``.

    Each shot is ``inputs_prefix + inputs + targets_prefix + targets +
    example_separator``; then ``inputs_prefix + eval inputs`` and
    ``targets_prefix`` with trailing whitespace stripped. ``prompt``, when
    given, comes first, followed by ``example_separator``. ``reverse`` puts the
    shots in reverse order. The eval example's other features pass through.
    Batched examples are unbatched.
    """

    @utils.map_over_dataset
    def join(ex: Mapping[str, Any]) -> dict[str, Any]:
        if "train" in ex:
            shots = tf.stack(
                [
                    inputs_prefix + ex["train"]["inputs"],
                    targets_prefix + ex["train"]["targets"] + example_separator,
                ],
                axis=1,
            )
            if reverse:
                shots = tf.reverse(shots, [0])
            text = tf.strings.reduce_join(tf.reshape(shots, [-1]))
        else:
            text = tf.constant("")
        if prompt:
            text = tf.strings.join([prompt, text], separator=example_separator)
        evals = ex["eval"]
        out = {
            "inputs": text + inputs_prefix + evals["inputs"] + targets_prefix.rstrip(),
            "targets": evals["targets"],
        }
        out.update({k: v for k, v in evals.items() if k not in ("inputs", "targets")})
        return out

    ds = join(ds)
    if ds.element_spec["inputs"].shape.rank:
        ds = ds.unbatch()
    return ds


# ----------------------------------------------------------------- sentinels


def _sentinel_ids(vocabulary: Any, count: int) -> list[int]:
    # Sentinels are the last ids of the vocabulary, counting down.
    return [vocabulary.vocab_size - 1 - i for i in range(count)]


def _sentinel_task_name(task_name: str, count: int) -> str:
    """``_<count>_sentinel`` goes before a split-like suffix (``_train``, ``_dev``, ...) or a dot."""
    tag = f"_{count}_sentinel"
    for suffix in ("_train", "_dev", "_test", "_eval", "."):
        at = task_name.find(suffix)
        if at >= 0:
            return task_name[:at] + tag + task_name[at:]
    return task_name + tag


def _eos_after_trim_keeping_last(
    dataset: tf.data.Dataset,
    output_features: Mapping[str, Feature],
    sequence_length: Mapping[str, int] | None = None,
    keep_last: int = 0,
) -> tf.data.Dataset:
    """``append_eos_after_trim`` that, when trimming, keeps the last ``keep_last`` tokens (the sentinels)."""

    def one(key: str, value: tf.Tensor) -> tf.Tensor:
        feature = output_features.get(key)
        if feature is None or not feature.add_eos:
            return value
        eos = [feature.vocabulary.eos_id]
        limit = None if sequence_length is None else sequence_length.get(key)
        if limit is None:
            return tf.concat([value, eos], 0)
        if keep_last <= 0:
            return tf.concat([value[: limit - 1], eos], 0)
        size = tf.minimum(limit, tf.shape(value)[0] + 1)  # including the EOS
        kept = tf.minimum(keep_last, size - 1)
        return tf.concat([value[: size - 1 - kept], value[tf.shape(value)[0] - kept :], eos], 0)

    return dataset.map(lambda ex: {k: one(k, v) for k, v in ex.items()}, num_parallel_calls=tf.data.AUTOTUNE)


def add_task_with_sentinels(task_name: str, num_sentinels: int | None = 1) -> None:
    """Registers ``task_name`` with ``num_sentinels`` sentinel ids after ``inputs`` and before ``targets``.

    The sentinels are the vocabulary's last ids (``vocab_size - 1``, ``- 2``,
    ...). When the task ends with ``append_eos_after_trim``, the sentinels are
    added before it and survive trimming. The postprocessor strips the decoded
    sentinels from the front of a prediction first.
    """
    count = int(num_sentinels or 0)
    task: Any = TaskRegistry.get(task_name)  # a seqio-style Task (has .postprocessor)

    def add_sentinels(
        dataset: tf.data.Dataset, sequence_length: Any, output_features: Any
    ) -> tf.data.Dataset:
        del sequence_length
        inputs_ids = _sentinel_ids(output_features["inputs"].vocabulary, count)
        targets_ids = _sentinel_ids(output_features["targets"].vocabulary, count)

        @utils.map_over_dataset
        def put(ex: dict[str, Any]) -> dict[str, Any]:
            ex = dict(ex)
            ex["inputs"] = tf.concat([ex["inputs"], tf.cast(inputs_ids, ex["inputs"].dtype)], 0)
            ex["targets"] = tf.concat([tf.cast(targets_ids, ex["targets"].dtype), ex["targets"]], 0)
            return ex

        return put(dataset)

    steps = list(task.preprocessors)
    if steps and steps[-1] is preprocessors.append_eos_after_trim:
        steps[-1] = functools.partial(_eos_after_trim_keeping_last, keep_last=count)
        steps.insert(-1, add_sentinels)
    else:
        steps.append(add_sentinels)

    def strip_sentinels(label: str) -> str:
        vocab = task.output_features["targets"].vocabulary
        prefix = vocab.decode(_sentinel_ids(vocab, count))
        return label[len(prefix) :].strip() if label.startswith(prefix) else label

    original = task.postprocessor

    def postprocess(label: Any, *args: Any, **kwargs: Any) -> Any:
        label = strip_sentinels(label)
        return label if original is None else original(label, *args, **kwargs)

    TaskRegistry.add(
        _sentinel_task_name(task_name, count),
        source=task.source,
        preprocessors=steps,
        output_features=task.output_features,
        postprocess_fn=postprocess,
        metric_fns=list(task.metric_fns),
    )
