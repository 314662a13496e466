"""Registries of tasks and mixtures, looked up by name."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

from t5x.tasks._feature import Feature
from t5x.tasks._mixture import Mixture, MixtureRate
from t5x.tasks._sources import DataSource
from t5x.tasks._task import Task


class UnknownNameError(KeyError):
    """No task or mixture has this name; the message lists the closest ones."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def _unknown(kind: str, name: str, known: list[str]) -> UnknownNameError:
    close = difflib.get_close_matches(name, sorted(known), n=5, cutoff=0.4)
    if close:
        hint = f" Closest registered names: {', '.join(close)}."
    elif known:
        hint = f" {len(known)} names are registered; `t5x-tasks list` shows them."
    else:
        hint = f" No {kind}s are registered (import the module that registers them first)."
    return UnknownNameError(f"No {kind} named {name!r} is registered.{hint}")


class TaskRegistry:
    """The global registry of Tasks (class methods only, like seqio's)."""

    _REGISTRY: ClassVar[dict[str, Task]] = {}

    @classmethod
    def add_provider(cls, name: str, provider: Task) -> Task:
        """Registers an existing Task under its name.

        Raises:
          ValueError: the name is taken (by a task or a mixture) or differs from the task's.
        """
        if not isinstance(provider, Task):
            raise TypeError(f"TaskRegistry.add_provider: expected a Task, got {type(provider).__name__}")
        if name != provider.name:
            raise ValueError(f"TaskRegistry: name {name!r} differs from the task's name {provider.name!r}")
        if name in cls._REGISTRY or name in MixtureRegistry._REGISTRY:
            raise ValueError(f"TaskRegistry: {name!r} is already registered; remove it first to replace it")
        cls._REGISTRY[name] = provider
        return provider

    @classmethod
    def add(
        cls,
        name: str,
        source: DataSource,
        output_features: Mapping[str, Feature],
        preprocessors: Sequence[Callable[..., Any]] = (),
        postprocess_fn: Callable[..., Any] | None = None,
        metric_fns: Sequence[Callable[..., Any]] = (),
        task_cls: type[Task] = Task,
        **kwargs: Any,
    ) -> Task:
        """Builds a Task and registers it (no I/O happens)."""
        task = task_cls(
            name,
            source=source,
            output_features=output_features,
            preprocessors=preprocessors,
            postprocess_fn=postprocess_fn,
            metric_fns=metric_fns,
            **kwargs,
        )
        return cls.add_provider(name, task)

    @classmethod
    def get(cls, name: str) -> Task:
        """Returns the registered Task.

        Raises:
          UnknownNameError: (a KeyError) listing the closest registered names.
        """
        if name not in cls._REGISTRY:
            raise _unknown("task", name, list(cls._REGISTRY))
        return cls._REGISTRY[name]

    @classmethod
    def remove(cls, name: str) -> None:
        """Unregisters ``name`` (no error when absent)."""
        cls._REGISTRY.pop(name, None)

    @classmethod
    def names(cls) -> list[str]:
        return sorted(cls._REGISTRY)

    @classmethod
    def reset(cls) -> None:
        """Removes every task (for tests)."""
        cls._REGISTRY.clear()


class MixtureRegistry:
    """The global registry of Mixtures."""

    _REGISTRY: ClassVar[dict[str, Mixture]] = {}

    @classmethod
    def add_provider(cls, name: str, provider: Mixture) -> Mixture:
        if not isinstance(provider, Mixture):
            raise TypeError(
                f"MixtureRegistry.add_provider: expected a Mixture, got {type(provider).__name__}"
            )
        if name != provider.name:
            raise ValueError(
                f"MixtureRegistry: name {name!r} differs from the mixture's name {provider.name!r}"
            )
        if name in cls._REGISTRY or name in TaskRegistry._REGISTRY:
            raise ValueError(
                f"MixtureRegistry: {name!r} is already registered; remove it first to replace it"
            )
        cls._REGISTRY[name] = provider
        return provider

    @classmethod
    def add(
        cls,
        name: str,
        tasks: Sequence[Any],
        default_rate: MixtureRate | None = None,
        mixture_cls: type[Mixture] = Mixture,
        **kwargs: Any,
    ) -> Mixture:
        """Builds a Mixture of registered tasks / mixtures (by name or object) and registers it."""
        mixture = mixture_cls(name, tasks, default_rate=default_rate, resolve=get_mixture_or_task, **kwargs)
        return cls.add_provider(name, mixture)

    @classmethod
    def get(cls, name: str) -> Mixture:
        if name not in cls._REGISTRY:
            raise _unknown("mixture", name, list(cls._REGISTRY))
        return cls._REGISTRY[name]

    @classmethod
    def remove(cls, name: str) -> None:
        cls._REGISTRY.pop(name, None)

    @classmethod
    def names(cls) -> list[str]:
        return sorted(cls._REGISTRY)

    @classmethod
    def reset(cls) -> None:
        cls._REGISTRY.clear()


def get_mixture_or_task(name: str) -> Task | Mixture:
    """Returns the registered Task or Mixture called ``name``.

    Raises:
      UnknownNameError: (a KeyError) listing the closest task and mixture names.
    """
    if name in TaskRegistry._REGISTRY:
        return TaskRegistry._REGISTRY[name]
    if name in MixtureRegistry._REGISTRY:
        return MixtureRegistry._REGISTRY[name]
    raise _unknown("task or mixture", name, [*TaskRegistry._REGISTRY, *MixtureRegistry._REGISTRY])


def get_subtasks(task_or_mixture: Task | Mixture) -> list[Task]:
    """The leaf tasks of a task (itself) or mixture."""
    return list(task_or_mixture.tasks)
