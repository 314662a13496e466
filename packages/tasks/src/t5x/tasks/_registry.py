"""Registries of tasks and mixtures, looked up by name."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

from t5x.tasks._feature import Feature
from t5x.tasks._mixture import Mixture, MixtureRate
from t5x.tasks._sources import DataSource
from t5x.tasks._task import Task

# Names of t5x.tasks.builtin's tasks start so (the core does not import it to check).
_BUILTIN_PREFIXES = ("synthetic_", "builtin_mc", "study_corpus_")


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
    if name.startswith(_BUILTIN_PREFIXES):
        hint += " Built-in tasks are registered by t5x.tasks.builtin.register_builtin_tasks()."
    return UnknownNameError(f"No {kind} named {name!r} is registered.{hint}")


class _ProviderRegistry[Provider: (Task, Mixture)]:
    """What the task and mixture registries share; each subclass keeps its own ``_REGISTRY``."""

    _REGISTRY: ClassVar[dict[str, Any]]  # each subclass's own dict
    _KIND: ClassVar[str]
    _TYPE: ClassVar[type]

    @classmethod
    def add_provider(cls, name: str, provider: Provider) -> Provider:
        """Registers an existing provider under its name.

        Raises:
          TypeError: the provider is not of the registry's type.
          ValueError: the name is taken (by a task or a mixture) or differs from the provider's.
        """
        registry, kind = cls.__name__, cls._KIND
        if not isinstance(provider, cls._TYPE):
            raise TypeError(
                f"{registry}.add_provider: expected a {cls._TYPE.__name__}, got {type(provider).__name__}"
            )
        if name != provider.name:
            raise ValueError(f"{registry}: name {name!r} differs from the {kind}'s name {provider.name!r}")
        if name in TaskRegistry._REGISTRY or name in MixtureRegistry._REGISTRY:
            raise ValueError(f"{registry}: {name!r} is already registered; remove it first to replace it")
        cls._REGISTRY[name] = provider
        return provider

    @classmethod
    def get(cls, name: str) -> Provider:
        """Returns the registered provider.

        Raises:
          UnknownNameError: (a KeyError) listing the closest registered names.
        """
        if name not in cls._REGISTRY:
            raise _unknown(cls._KIND, name, list(cls._REGISTRY))
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
        """Removes every registered provider (for tests)."""
        cls._REGISTRY.clear()


class TaskRegistry(_ProviderRegistry[Task]):
    """The global registry of Tasks (class methods only, like seqio's)."""

    _REGISTRY: ClassVar[dict[str, Task]] = {}
    _KIND = "task"
    _TYPE = Task

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


class MixtureRegistry(_ProviderRegistry[Mixture]):
    """The global registry of Mixtures."""

    _REGISTRY: ClassVar[dict[str, Mixture]] = {}
    _KIND = "mixture"
    _TYPE = Mixture

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
