"""Deriving tasks and mixtures from registered ones: a new vocabulary, or fewer examples."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import tensorflow as tf

from t5x import tasks as _core
from t5x.seqio import dataset_providers as dp

_KEPT_FIELDS = ("dtype", "rank")  # the Feature fields a new vocabulary may not change


def _task_args(task: _core.Task) -> dict[str, Any]:
    return {
        "source": task.source,
        "output_features": task.output_features,
        "preprocessors": task.preprocessors,
        "postprocess_fn": task._postprocess_fn,
        "metric_fns": task._metric_fns,
        "shuffle_buffer_size": task.shuffle_buffer_size,
        "source_info": getattr(task, "source_info", None),
    }


def _derive(name: str, new_name: str, make_task: Any, register: bool) -> Any:
    provider = dp.get_mixture_or_task(name)
    if isinstance(provider, _core.Task):
        task = make_task(provider, new_name)
        if register:
            dp.TaskRegistry.add_provider(new_name, task)
        return task
    entries = []
    for item, rate in provider._entries:
        sub_name = f"{new_name}.{item.name}"
        # Registered copies are referred to by name; unregistered ones are held as objects.
        sub = _derive(item.name, sub_name, make_task, register=register)
        entries.append((sub_name if register else sub, rate))
    mixture = dp.Mixture(
        new_name,
        entries,
        sample_fn=getattr(provider, "_sample_fn", None),
        source_info=getattr(provider, "source_info", None),
    )
    if register:
        dp.MixtureRegistry.add_provider(new_name, mixture)
    return mixture


def mixture_or_task_with_new_vocab(
    mixture_or_task_name: str,
    new_mixture_or_task_name: str,
    *,
    new_vocab: Any = None,
    new_output_features: Mapping[str, Any] | None = None,
    add_to_seqio_registry: bool = True,
    validate_features: bool = True,
) -> Any:
    """A copy of a registered Task/Mixture whose features use ``new_vocab`` (or ``new_output_features``).

    A mixture's tasks are copied and registered as ``<new name>.<task name>``.
    ``validate_features=False`` lets ``new_output_features`` change dtype and rank.

    Raises:
      ValueError: both or neither of ``new_vocab`` / ``new_output_features``; or
        new features with other names, or (when validating) dtype or rank than the original's.
    """
    if (new_vocab is None) == (new_output_features is None):
        raise ValueError(
            "mixture_or_task_with_new_vocab: give exactly one of new_vocab and new_output_features"
        )

    def make_task(task: _core.Task, new_name: str) -> dp.Task:
        old = task.output_features
        if new_vocab is not None:
            features = {k: dataclasses.replace(f, vocabulary=new_vocab) for k, f in old.items()}
        else:
            features = dict(new_output_features or {})
            if set(features) != set(old):
                raise ValueError(
                    f"new_output_features names {sorted(features)}, the original task {task.name!r} has {sorted(old)}"
                )
            for k, f in features.items() if validate_features else ():
                for field in _KEPT_FIELDS:
                    if getattr(f, field) != getattr(old[k], field):
                        raise ValueError(
                            f"new_output_features[{k!r}].{field} is {getattr(f, field)!r}; "
                            f"the original task {task.name!r} has {getattr(old[k], field)!r}"
                        )
        return dp.Task(new_name, **{**_task_args(task), "output_features": features})

    return _derive(mixture_or_task_name, new_mixture_or_task_name, make_task, add_to_seqio_registry)


class TruncatedDatasetProvider(dp.DataSource):
    """A source that keeps the first ``split_sizes[split]`` examples of each listed split."""

    def __init__(self, child: Any, split_sizes: Mapping[str, int], shuffle_buffer_size: int | None = None):
        super().__init__(child.splits, caching_permitted=getattr(child, "caching_permitted", True))
        self.child = child
        self.split_sizes = dict(split_sizes)
        self.shuffle_buffer_size = shuffle_buffer_size or dp.SHUFFLE_BUFFER_SIZE

    @property
    def supports_arbitrary_sharding(self) -> bool:  # type: ignore[override]
        return bool(getattr(self.child, "supports_arbitrary_sharding", False))

    def list_shards(self, split: str) -> list[str]:
        return list(self.child.list_shards(split))

    def get_dataset(self, split="train", shuffle=True, seed=None, shard_info=None) -> tf.data.Dataset:
        if split not in self.split_sizes:
            return self.child.get_dataset(split=split, shuffle=shuffle, seed=seed, shard_info=shard_info)
        ds = self.child.get_dataset(split=split, shuffle=False, seed=seed, shard_info=shard_info)
        ds = ds.take(self.split_sizes[split])
        return ds.shuffle(self.shuffle_buffer_size, seed=seed) if shuffle else ds

    def num_input_examples(self, split: str) -> int | None:
        count = self.child.num_input_examples(split)
        if split not in self.split_sizes or count is None:
            return count
        return min(count, self.split_sizes[split])


def mixture_or_task_with_truncated_data(
    mixture_or_task_name: str,
    new_mixture_or_task_name: str,
    *,
    split_sizes: Mapping[str, int],
    add_to_seqio_registry: bool = True,
) -> Any:
    """A copy of a registered Task/Mixture that reads at most ``split_sizes[split]`` examples per task."""

    def make_task(task: _core.Task, new_name: str) -> dp.Task:
        source = TruncatedDatasetProvider(task.source, split_sizes, task.shuffle_buffer_size)
        return dp.Task(new_name, **{**_task_args(task), "source": source})

    return _derive(mixture_or_task_name, new_mixture_or_task_name, make_task, add_to_seqio_registry)


def mixture_with_missing_task_splits_removed(
    mixture_name: str,
    split: str,
    new_mixture_name: str,
    *,
    add_to_seqio_registry: bool = True,
) -> Any:
    """A copy of a registered mixture keeping only the (leaf) tasks that have ``split``, at their rates.

    Raises:
      ValueError: none of the mixture's tasks has ``split``.
    """
    mixture = dp.get_mixture_or_task(mixture_name)
    entries = [(t.name, mixture.get_rate(t)) for t in mixture.tasks if split in t.splits]
    if not entries:
        raise ValueError(
            f"mixture_with_missing_task_splits_removed: no task of {mixture_name!r} has split {split!r}"
        )
    new = dp.Mixture(
        new_mixture_name,
        entries,
        sample_fn=getattr(mixture, "_sample_fn", None),
        source_info=getattr(mixture, "source_info", None),
    )
    if add_to_seqio_registry:
        dp.MixtureRegistry.add_provider(new_mixture_name, new)
    return new
