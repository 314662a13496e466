"""Mixture: tasks sampled with rates (seqio's Mixture)."""

from __future__ import annotations

import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from t5x.interfaces import ShardInfo
from t5x.tasks._feature import Feature
from t5x.tasks._lazy_tf import tf
from t5x.tasks._task import Task, check_name

# A callable rate receives the entry: a Task, or a nested Mixture.
MixtureRate = float | Callable[[Any], float]


def mixing_rate_num_examples(
    task: Task,
    maximum: int | None = None,
    scale: float = 1.0,
    temperature: float = 1.0,
    split: str = "train",
) -> float:
    """A rate proportional to the task's number of examples (seqio's rule).

    ``rate = (min(num_examples * scale, maximum)) ** (1 / temperature)``.

    Raises:
      ValueError: the task's source does not know its size for ``split``.
    """
    count = task.num_input_examples(split)
    if count is None:
        raise ValueError(
            f"mixing_rate_num_examples: task {task.name!r} does not know how many examples split "
            f"{split!r} has; give its source num_input_examples"
        )
    rate = count * scale
    if maximum:
        rate = min(rate, maximum)
    if temperature != 1.0:
        rate = rate ** (1.0 / temperature)
    return float(rate)


# The name the issue and T5 configs use.
rate_num_examples = mixing_rate_num_examples


class Mixture:
    """Tasks (or nested mixtures) mixed with rates.

    Rates are relative numbers of examples: a number, or ``fn(task) -> number``
    evaluated when a dataset is built. A nested mixture with rate r passes r on
    to its tasks in proportion to their own rates.

    Args:
      name: a unique name.
      tasks: Tasks, Mixtures or registered names, or (item, rate) pairs.
      default_rate: the rate of items given without one.
      resolve: name -> Task or Mixture (the registry lookup; given by the registry).
    """

    def __init__(
        self,
        name: str,
        tasks: Sequence[Any],
        default_rate: MixtureRate | None = None,
        resolve: Callable[[str], Task | Mixture] | None = None,
    ):
        self._name = check_name("Mixture", name)
        if not tasks:
            raise ValueError(f"Mixture {name!r} needs at least one task")
        self._entries: list[tuple[Task | Mixture, MixtureRate]] = []
        for entry in tasks:
            item, rate = entry if isinstance(entry, tuple) else (entry, default_rate)
            if rate is None:
                raise ValueError(f"Mixture {name!r}: {item!r} has no rate and no default_rate was given")
            if isinstance(item, str):
                if resolve is None:
                    raise ValueError(
                        f"Mixture {name!r}: give Task objects, or register the mixture to use names"
                    )
                item = resolve(item)
            if not isinstance(item, (Task, Mixture)):
                raise TypeError(f"Mixture {name!r}: expected a Task, Mixture or name, got {item!r}")
            if not (callable(rate) or (isinstance(rate, numbers.Real) and float(rate) >= 0)):
                raise ValueError(
                    f"Mixture {name!r}: the rate of {item.name!r} must be >= 0 or callable, got {rate!r}"
                )
            self._entries.append((item, rate))
        # A task may be reached through several nested mixtures (its rates add up, as in
        # seqio); listing the same entry twice is a mistake.
        names = [item.name for item, _ in self._entries]
        if len(set(names)) != len(names):
            raise ValueError(f"Mixture {name!r} contains a task more than once: {names}")
        self._check_compatible_features()

    @property
    def name(self) -> str:
        return self._name

    @property
    def tasks(self) -> list[Task]:
        """The leaf tasks, nested mixtures flattened, each once."""
        out: dict[str, Task] = {}
        for item, _ in self._entries:
            # A task entry is itself (not asked for its ``tasks``, so test doubles of Task work).
            for task in item.tasks if isinstance(item, Mixture) else [item]:
                out.setdefault(task.name, task)
        return list(out.values())

    def _entry_rate(self, item: Task | Mixture, rate: MixtureRate) -> float:
        value = rate(item) if callable(rate) else rate
        if not isinstance(value, numbers.Real) or value < 0:
            raise ValueError(f"Mixture {self._name!r}: the rate of {item.name!r} evaluated to {value!r}")
        return float(value)

    def get_rate(self, task: Task) -> float:
        """The (unnormalised) rate of a leaf task."""
        total = 0.0
        for item, rate in self._entries:
            if isinstance(item, Task):
                if item.name == task.name:
                    total += self._entry_rate(item, rate)
            elif task.name in {t.name for t in item.tasks}:
                sub_total = item.total_rate
                if sub_total > 0:
                    total += self._entry_rate(item, rate) * item.get_rate(task) / sub_total
        return total

    @property
    def total_rate(self) -> float:
        return sum(self.get_rate(t) for t in self.tasks)

    @property
    def output_features(self) -> dict[str, Feature]:
        return self.tasks[0].output_features

    @property
    def splits(self) -> tuple[str, ...]:
        return tuple(sorted(set().union(*(t.splits for t in self.tasks))))

    def num_input_examples(self, split: str) -> int | None:
        counts = [t.num_input_examples(split) for t in self.tasks if split in t.splits]
        return None if any(c is None for c in counts) else sum(c for c in counts if c is not None)

    def _check_compatible_features(self) -> None:
        first = self.tasks[0]
        for task in self.tasks[1:]:
            for key, feature in task.output_features.items():
                mine = first.output_features.get(key)
                if mine is None:
                    continue
                if mine.vocabulary != feature.vocabulary or mine.add_eos != feature.add_eos:
                    raise ValueError(
                        f"Mixture {self._name!r}: feature {key!r} of task {task.name!r} has a different "
                        f"vocabulary or add_eos than in task {first.name!r}"
                    )

    def __repr__(self) -> str:
        return f"Mixture({self._name!r}, tasks={[t.name for t in self.tasks]})"

    def get_dataset(
        self,
        sequence_length: Mapping[str, int | None] | None = None,
        split: str = "train",
        use_cached: bool = False,
        shuffle: bool = True,
        seed: int | None = None,
        shard_info: ShardInfo | None = None,
        num_epochs: int | None = None,
        copy_pretokenized: bool = False,
        passthrough_features: Sequence[str] | None = None,
        trim_output_features: bool = True,
    ) -> tf.data.Dataset:
        """Samples the tasks' datasets with the mixture rates (seqio semantics).

        Only the output features (and ``passthrough_features``, and
        ``*_pretokenized`` with ``copy_pretokenized``) are kept. Sampling stops
        when a task runs out (with ``num_epochs=None`` none does).

        Raises:
          ValueError: no task has ``split``, or all rates are zero.
        """
        tasks = [t for t in self.tasks if split in t.splits]
        if not tasks:
            raise ValueError(f"Mixture {self._name!r}: no task has a split {split!r}")
        rates = [self.get_rate(t) for t in tasks]
        if sum(rates) <= 0:
            raise ValueError(f"Mixture {self._name!r}: all rates are zero for split {split!r}")
        keep = set(self.output_features)
        if copy_pretokenized:
            keep |= {f"{k}_pretokenized" for k in keep}
        keep |= set(passthrough_features or ())
        datasets = []
        for index, task in enumerate(tasks):
            task_seed = None if seed is None else seed + index
            ds = task.get_dataset(
                sequence_length,
                split=split,
                use_cached=use_cached,
                shuffle=shuffle,
                seed=task_seed,
                shard_info=shard_info,
                num_epochs=num_epochs,
                trim_output_features=trim_output_features,
            )
            datasets.append(ds.map(lambda x: {k: v for k, v in x.items() if k in keep}))
        sample_seed = seed if seed is not None else (None if shuffle else 42)
        weights = [r / sum(rates) for r in rates]
        return tf.data.Dataset.sample_from_datasets(
            datasets, weights, seed=sample_seed, stop_on_empty_dataset=True
        )
