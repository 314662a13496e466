"""Building a job's components from its configuration, and checking each one."""

from __future__ import annotations

import importlib
from typing import Any

from t5x.interfaces import Checkpointer, FeatureConverter, InputIterator, Model, Partitioner, check_contract
from t5x.launch._configs import DatasetConfig
from t5x.launch._errors import ConfigurationError


def check_components(**components: Any) -> None:
    """Checks each named component against its contract (by the name's suffix).

    Raises:
      TypeError: naming the component and the members it lacks.
    """
    contracts = {
        "model": Model,
        "partitioner": Partitioner,
        "checkpointer": Checkpointer,
        "feature_converter": FeatureConverter,
        "iterator": InputIterator,
    }
    for name, component in components.items():
        if component is None:
            continue
        contract = next(c for suffix, c in contracts.items() if name.endswith(suffix))
        check_contract(component, contract, component=f"{name} ({type(component).__name__})")


def get_provider(cfg: DatasetConfig) -> Any:
    """The Task or Mixture ``cfg`` names (importing ``cfg.module`` first)."""
    import t5x.tasks
    from t5x.tasks.builtin import register_builtin_tasks

    register_builtin_tasks()
    if cfg.module:
        try:
            importlib.import_module(cfg.module)
        except ModuleNotFoundError as error:
            if error.name is None or not (cfg.module + ".").startswith(error.name + "."):
                raise  # the module exists but one of its own imports is missing
            raise ConfigurationError(
                f"cannot import the task module {cfg.module!r} (MIXTURE_OR_TASK_MODULE): {error}"
            ) from error
    return t5x.tasks.get_mixture_or_task(cfg.mixture_or_task_name)


def feature_converter_for(model: Any, *, pack: bool) -> Any:
    """An instance of the model's feature converter class."""
    cls = model.feature_converter_cls
    cls = cls.resolve() if hasattr(cls, "resolve") else cls
    return cls(pack=pack)


def check_vocabularies(model: Any, provider: Any) -> None:
    """Checks that the task encodes text with the vocabularies the model was built for.

    Raises:
      ConfigurationError: (a ValueError) naming both vocabularies.
    """
    pairs = {
        "inputs": getattr(model, "input_vocabulary", None) or getattr(model, "vocabulary", None),
        "targets": getattr(model, "output_vocabulary", None),
    }
    for name, feature in provider.output_features.items():
        expected = pairs.get(name)
        if expected is None or feature.vocabulary == expected:
            continue
        raise ConfigurationError(
            f"the model's {name} vocabulary {expected!r} differs from the vocabulary of "
            f"{provider.name}'s feature {name!r}, {feature.vocabulary!r}; configure the model "
            "with the task's vocabulary (or pick a task that uses the model's)"
        )


def check_prompts(model: Any, provider: Any, why: str) -> None:
    """Checks that a decoder-only model has prompts to continue: the task's ``inputs`` feature.

    Decoding a decoder-only model continues each example's ``inputs``; a task
    with targets only (a language-modelling task) has none, and the model
    refuses the batch deep inside decoding.

    Raises:
      ConfigurationError: naming the task, its features and what to do instead.
    """
    from t5x.models import DecoderOnlyModel

    if not isinstance(model, DecoderOnlyModel) or "inputs" in provider.output_features:
        return
    raise ConfigurationError(
        f"{why}: the decoder-only model decodes a continuation of each example's 'inputs', but "
        f"{provider.name} has only the features {sorted(provider.output_features)}; use a task with an "
        "'inputs' feature (the prompt), or score the targets instead (infer mode 'score', score metrics)"
    )
