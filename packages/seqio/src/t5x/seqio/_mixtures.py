"""seqio's ``Mixture``: tasks sampled in name order with one seed, ``sample_fn``, PyGlove rates.

Split from ``dataset_providers`` (which re-exports both classes, where seqio users import them).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import tensorflow as tf

from t5x import tasks as _core
from t5x.interfaces import ShardInfo

if TYPE_CHECKING:
    from t5x.seqio.dataset_providers import SourceInfo

_log = logging.getLogger("t5x.seqio")


class Mixture(_core.Mixture):
    """Tasks mixed by rate: ``Mixture(name, tasks, default_rate=None, sample_fn=..., source_info=None)``."""

    def __init__(
        self,
        name: str,
        tasks: Sequence[Any],
        default_rate: Any = None,
        sample_fn: Callable[..., tf.data.Dataset] | None = None,
        source_info: SourceInfo | None = None,
    ):
        # seqio takes any (task, rate) pair, lists included.
        entries = [t if isinstance(t, (str, _core.Task, _core.Mixture)) else tuple(t) for t in tasks]
        # dataset_providers imports this module; its lookup (seqio's registries) is imported here.
        from t5x.seqio.dataset_providers import get_mixture_or_task

        super().__init__(name, entries, default_rate=default_rate, resolve=get_mixture_or_task)
        self._sample_fn = sample_fn or functools.partial(
            tf.data.Dataset.sample_from_datasets, stop_on_empty_dataset=True
        )
        self._source_info = source_info

    def _check_compatible_features(self) -> None:
        """seqio's construction check: every task has the same output feature names.

        Vocabularies and dtypes are compared when a dataset is built
        (``_check_vocabularies_and_dtypes``), as seqio does; add_eos may differ.
        """
        if len({tuple(t.output_features) for t in self.tasks}) != 1:
            listing = "\n".join(f"{t.name}: {tuple(t.output_features)}" for t in self.tasks)
            raise ValueError(
                f"Mixture, '{self.name}' contains Tasks with different output features:\n {listing}"
            )

    def _check_vocabularies_and_dtypes(self) -> None:
        first = self.tasks[0]
        for key, feature in first.output_features.items():
            for task in self.tasks[1:]:
                other = task.output_features[key]
                if getattr(feature, "vocabulary", None) != getattr(other, "vocabulary", None):
                    raise ValueError(
                        "Features across tasks in a mixture must use the same vocabulary.  Got "
                        f"{other.vocabulary} for feature '{key}' in task '{task.name}', expected "
                        f"{feature.vocabulary}."
                    )
                if getattr(feature, "dtype", None) != getattr(other, "dtype", None):
                    raise ValueError(
                        "Features across tasks in a mixture must use the same dtype.  Got "
                        f"{other.dtype} for feature '{key}' in task '{task.name}', expected {feature.dtype}."
                    )

    @property
    def source_info(self) -> SourceInfo | None:
        return self._source_info

    @property
    def _task_to_rate(self) -> dict[str, Any]:
        """Entry name -> its rate (a number or a callable), as seqio keeps them."""
        return {item.name: rate for item, rate in self._entries}

    @property
    def _tasks(self) -> list[_core.Task]:
        """The tasks listed directly (seqio's attribute; nested mixtures are in ``_sub_mixtures``)."""
        return [item for item, _ in self._entries if isinstance(item, _core.Task)]

    @property
    def _sub_mixtures(self) -> list[_core.Mixture]:
        return [item for item, _ in self._entries if isinstance(item, _core.Mixture)]

    @property
    def rate_per_task_name(self) -> dict[str, Any]:
        """Entry (task or sub-mixture) name -> its rate, as given."""
        return self._task_to_rate

    @property
    def total_rate(self) -> float:
        return sum(self.get_rate(t) for t in self.tasks)

    def get_dataset(  # type: ignore[override]
        self,
        sequence_length: Mapping[str, Any] | None = None,
        split: str = "train",
        use_cached: bool = False,
        shuffle: bool = True,
        seed: int | None = None,
        shard_info: ShardInfo | None = None,
        num_epochs: int | None = None,
        copy_pretokenized: bool = False,
        compute_stats_empirically: bool = False,
        log_mixing_proportions: bool = True,
        passthrough_features: Sequence[str] | None = None,
        trim_output_features: bool = True,
    ) -> tf.data.Dataset:
        """The tasks' examples sampled by rate, exactly as seqio samples them.

        Every task gets the same ``seed``; ``sample_fn(datasets, rates, seed)``
        (default: ``tf.data.Dataset.sample_from_datasets`` stopping at the
        first empty dataset) mixes them in task-name order, with seed ``seed``,
        else None when shuffling, else 42. The two logging arguments have no
        effect.
        """
        del compute_stats_empirically, log_mixing_proportions
        self._check_vocabularies_and_dtypes()
        tasks = []
        for task in self.tasks:
            if split in task.splits:
                tasks.append(task)
            else:
                _log.warning("Mixture %r: task %r has no %r split, skipping it", self.name, task.name, split)
        if not tasks:
            raise ValueError(f"Mixture {self.name!r}: No datasets have a '{split}' split")
        keep = set(self.output_features)
        if copy_pretokenized:
            keep |= {f"{k}_pretokenized" for k in keep}
        keep |= set(passthrough_features or ())
        datasets = []
        for task in tasks:
            ds = task.get_dataset(
                sequence_length,
                split=split,
                use_cached=use_cached,
                shuffle=shuffle,
                seed=seed,
                shard_info=shard_info,
                num_epochs=num_epochs,
                trim_output_features=trim_output_features,
            )
            datasets.append(
                ds.map(
                    lambda ex: {k: v for k, v in ex.items() if k in keep}, num_parallel_calls=tf.data.AUTOTUNE
                )
            )
        rates = [self.get_rate(task) for task in tasks]
        sample_seed = seed if seed is not None else (None if shuffle else 42)
        return self._sample_fn(datasets, rates, sample_seed)

    @property
    def tasks(self) -> list[_core.Task]:
        """The leaf tasks (nested mixtures flattened), sorted by name as seqio lists and samples them."""
        return sorted(super().tasks, key=lambda t: t.name)

    def get_rate(self, task: _core.Task) -> float:
        """The task's rate: its share of each sub-mixture containing it, then its own rate.

        seqio's order of evaluation, which matters to rates that are PyGlove
        hyper values (they are registered in the order they are read).
        """
        value = 0.0
        for mix in self._sub_mixtures:
            if task.name in {t.name for t in mix.tasks}:
                rate = self._get_submixture_rate(mix)
                value += rate * mix.get_rate(task) / mix.total_rate
        rates = self._task_to_rate
        if task.name in rates:
            rate = rates[task.name]
            value += float(rate(task) if callable(rate) else rate)
        return value

    def _get_submixture_rate(self, mix: _core.Mixture) -> float:
        rate = self._task_to_rate[mix.name]
        return float(rate(mix) if callable(rate) else rate)


def _is_pyglove_hyper(value: Any) -> bool:
    # Duck-typed, so pyglove stays optional: its hyper primitives (pg.oneof,
    # pg.floatv, ...) are symbolic objects from a pyglove module.
    return hasattr(value, "sym_init_args") and type(value).__module__.startswith("pyglove")


def _hyper_rate(entry_name: str, hyper: Any) -> Callable[[Any], Any]:
    """A rate function that re-creates ``hyper`` (named after the entry when unnamed) each time it is read.

    Inside a PyGlove ``DynamicEvaluationContext`` creating the primitive
    registers it (``collect``) or yields the value being tried (``apply``).
    """

    def rate(unused_item: Any) -> Any:
        kwargs = dict(hyper.sym_init_args)
        if kwargs.get("name") is None:
            kwargs["name"] = entry_name
        return type(hyper)(**kwargs)

    return rate


class PyGloveTunableMixture(Mixture):
    """A Mixture whose rates (of tasks and of sub-mixtures) may be PyGlove hyper values, for a rate search."""

    def __init__(
        self,
        name: str,
        tasks: Sequence[Any],
        default_rate: Any = None,
        sample_fn: Callable[..., tf.data.Dataset] | None = None,
        source_info: SourceInfo | None = None,
    ):
        entries = []
        for entry in tasks:
            if isinstance(entry, (list, tuple)) and len(entry) == 2 and _is_pyglove_hyper(entry[1]):
                item = entry[0]
                entry = (item, _hyper_rate(item if isinstance(item, str) else item.name, entry[1]))
            entries.append(entry)
        super().__init__(
            name, entries, default_rate=default_rate, sample_fn=sample_fn, source_info=source_info
        )
