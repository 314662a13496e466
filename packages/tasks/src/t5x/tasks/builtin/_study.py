"""Pretraining tasks of the architecture / objective study (Wang et al., 2022).

One corpus, three objectives: full language modelling, prefix language
modelling and span corruption (masked LM). ``objective_task`` registers the
task for a corpus, a vocabulary and an objective and returns its name, so a gin
file can write ``MIXTURE_OR_TASK_NAME = @tasks.objective_task()``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

from t5x.tasks._feature import Feature
from t5x.tasks._lazy_tf import tf
from t5x.tasks._objectives import full_lm, prefix_lm, span_corruption
from t5x.tasks._preprocessors import append_eos_after_trim, rekey, tokenize
from t5x.tasks._registry import TaskRegistry
from t5x.tasks._sources import DataSource
from t5x.tasks._utils import AUTOTUNE
from t5x.tasks.builtin._tasks import builtin_corpus_source, builtin_vocabulary

STUDY_OBJECTIVES = ("full_lm", "prefix_lm", "span_corruption")
BUILTIN_CORPUS_NAME = "study_corpus"


def _add_eos_inputs(dataset: tf.data.Dataset, output_features: Mapping[str, Feature]) -> tf.data.Dataset:
    """Gives every example an ``inputs`` of just EOS: a full-LM example for models that need inputs."""
    eos = tf.constant([output_features["inputs"].vocabulary.eos_id], tf.int32)

    def add(x: Mapping[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        return {"inputs": eos, "targets": x["targets"]}

    return dataset.map(add, num_parallel_calls=AUTOTUNE)


def _preprocessors(objective: str, text_key: str, eos_inputs: bool) -> list[Callable[..., Any]]:
    with_inputs = functools.partial(rekey, key_map={"inputs": None, "targets": text_key})
    if objective == "full_lm":
        if eos_inputs:
            return [with_inputs, tokenize, full_lm, _add_eos_inputs]
        return [functools.partial(rekey, key_map={"targets": text_key}), tokenize, full_lm]
    objective_fn = prefix_lm if objective == "prefix_lm" else span_corruption
    return [with_inputs, tokenize, objective_fn, append_eos_after_trim]


def objective_task(
    objective: str,
    *,
    source: DataSource | None = None,
    vocabulary: Any = None,
    corpus_name: str = BUILTIN_CORPUS_NAME,
    text_key: str = "text",
    eos_inputs: bool = False,
) -> str:
    """Registers (once) the pretraining task of ``objective`` on a corpus; returns its name.

    The task is named ``<corpus_name>_<objective>`` (plus ``_eos_inputs``).
    Objectives, all on raw text under ``text_key``:

    - ``full_lm``: documents concatenated with EOS between them, cut into
      ``targets``-length pieces; targets only, or with ``eos_inputs`` an
      ``inputs`` of one EOS token (for encoder-decoders, and for non-causal
      decoders whose prefix is then empty).
    - ``prefix_lm``: pieces of ``inputs`` length less one split at a random
      point into ``inputs`` (the prefix) and ``targets`` (the rest), each + EOS.
    - ``span_corruption``: T5's objective (15% noise, mean span 3), + EOS.

    Args:
      objective: one of ``STUDY_OBJECTIVES``.
      source: the corpus (default: ``builtin_corpus_source()``).
      vocabulary: the vocabulary of inputs and targets (default: the built-in
        byte vocabulary); it must have sentinel ids for span corruption.
      corpus_name: the prefix of the task name.
      text_key: the source's text feature.
      eos_inputs: see ``full_lm`` (ignored by the other objectives, which
        always have inputs).

    Returns:
      The registered task's name.

    Raises:
      ValueError: an unknown objective, or a task of that name registered with
        another vocabulary.
    """
    if objective not in STUDY_OBJECTIVES:
        raise ValueError(f"objective_task: objective must be one of {STUDY_OBJECTIVES}, got {objective!r}")
    vocabulary = builtin_vocabulary() if vocabulary is None else vocabulary
    eos_inputs = eos_inputs and objective == "full_lm"
    name = f"{corpus_name}_{objective}{'_eos_inputs' if eos_inputs else ''}"
    if name in TaskRegistry.names():
        existing = TaskRegistry.get(name).output_features["targets"].vocabulary
        if existing != vocabulary:
            raise ValueError(
                f"objective_task: {name!r} is already registered with vocabulary {existing!r}, not "
                f"{vocabulary!r}; pass another corpus_name"
            )
        return name
    features = {"targets": Feature(vocabulary, add_eos=True)}
    if objective != "full_lm" or eos_inputs:
        features["inputs"] = Feature(vocabulary, add_eos=True)
    TaskRegistry.add(
        name,
        builtin_corpus_source() if source is None else source,
        output_features=features,
        preprocessors=_preprocessors(objective, text_key, eos_inputs),
    )
    return name
