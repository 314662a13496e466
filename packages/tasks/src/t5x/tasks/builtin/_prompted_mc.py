"""Built-in prompted multiple-choice tasks for zero-shot rank classification.

Three small datasets are generated in code, always the same for a split:

* ``sentence_completion``: the start of a sentence in the style of the built-in
  corpus; the right ending is the place phrase that closes it, the wrong ones
  are other place phrases with their words shuffled (so a model trained on the
  corpus can tell them apart).
* ``addition``: two numbers below 100 and four candidate sums.
* ``copy``: a few words; one candidate repeats them, the others change one word.

Each dataset is rendered with several prompt templates, and each
(dataset, template) pair is its own task ``builtin_mc_<dataset>_<prompt>``, so
accuracy can be reported per prompt and as a median across prompts (as in
Wang et al., 2022 and T0). Every task expands an example into one row per
option with :func:`t5x.tasks.rank_classification`; its metric is
:func:`t5x.tasks.metrics.rank_classification` (``accuracy``, percent).
Neither feature gets EOS: an option is scored as the plain continuation of its
prompt, as lm-evaluation-harness does.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from t5x.tasks._feature import Feature
from t5x.tasks._lazy_tf import tf
from t5x.tasks._preprocessors import tokenize
from t5x.tasks._rank_classification import rank_classification, rank_classification_postprocessor
from t5x.tasks._registry import MixtureRegistry, TaskRegistry
from t5x.tasks._sources import FunctionDataSource
from t5x.tasks.builtin._synthetic import _ADJECTIVES, _PLACES, _SUBJECTS, _VERBS, WORDS

NUM_CHOICES = 4
MC_SPLIT_SIZES = {"validation": 100, "test": 100}
_SPLIT_SEEDS = {"validation": 21, "test": 22}
# Between a prompt and an option: the option is scored as the prompt's continuation.
TARGET_DELIMITER = " "

Example = dict[str, Any]


def _pick(rng: np.random.Generator, options: Any) -> Any:
    return options[int(rng.integers(0, len(options)))]


def _shuffled_words(rng: np.random.Generator, phrase: str) -> str:
    words = phrase.split()
    while True:
        order = rng.permutation(len(words))
        if list(order) != list(range(len(words))):
            return " ".join(words[i] for i in order)


def _with_options(rng: np.random.Generator, right: str, wrong: list[str], fields: Example) -> Example:
    options = [right, *wrong]
    order = rng.permutation(len(options))
    return {
        **fields,
        "choices": [options[i] for i in order],
        "label": int(np.argmin(order)),  # where option 0 (the right one) landed
    }


def sentence_completion_example(rng: np.random.Generator) -> Example:
    """A corpus-style sentence start, its place-phrase ending and three shuffled wrong endings."""
    words = " ".join(_pick(rng, WORDS) for _ in range(int(rng.integers(1, 3))))
    subject = _pick(rng, _SUBJECTS)
    context = f"{subject[0].upper()}{subject[1:]} {_pick(rng, _VERBS)} a {_pick(rng, _ADJECTIVES)} {words}"
    place = _pick(rng, _PLACES)
    others = [p for p in _PLACES if p != place]
    wrong = [_shuffled_words(rng, others[i]) + "." for i in rng.choice(len(others), 3, replace=False)]
    return _with_options(rng, place + ".", wrong, {"context": context})


def addition_example(rng: np.random.Generator) -> Example:
    """``a + b`` with the right sum and three near misses."""
    a, b = (int(x) for x in rng.integers(0, 100, size=2))
    total = a + b
    offsets = [o for o in (-10, -2, -1, 1, 2, 10) if total + o >= 0]
    wrong = [str(total + int(o)) for o in rng.choice(offsets, 3, replace=False)]
    return _with_options(rng, str(total), wrong, {"a": str(a), "b": str(b)})


def copy_example(rng: np.random.Generator) -> Example:
    """A few words, their exact copy and three copies with one word replaced."""
    words = [_pick(rng, WORDS) for _ in range(int(rng.integers(3, 7)))]
    wrong: list[str] = []
    while len(wrong) < 3:
        changed = list(words)
        changed[int(rng.integers(0, len(words)))] = _pick(rng, WORDS)
        text = " ".join(changed)
        if text != " ".join(words) and text not in wrong:
            wrong.append(text)
    return _with_options(rng, " ".join(words), wrong, {"words": " ".join(words)})


MC_DATASETS: dict[str, Callable[[np.random.Generator], Example]] = {
    "sentence_completion": sentence_completion_example,
    "addition": addition_example,
    "copy": copy_example,
}

# Prompt templates: ``{field}`` is replaced by the example's field. The option
# follows the prompt after TARGET_DELIMITER.
MC_PROMPTS: dict[str, dict[str, str]] = {
    "sentence_completion": {
        "plain": "{context}",
        "complete": "Complete the sentence: {context}",
        "how_does_it_end": "How does this sentence end? {context}",
    },
    "addition": {
        "equation": "{a} + {b} =",
        "question": "What is {a} plus {b}? Answer:",
        "add": "add: {a} + {b}",
    },
    "copy": {
        "copy": "copy: {words}",
        "repeat": "Repeat after me: {words}. Repeated:",
        "arrow": "{words} ->",
    },
}

BUILTIN_MC_TASKS = tuple(f"builtin_mc_{d}_{p}" for d, prompts in MC_PROMPTS.items() for p in prompts)
BUILTIN_MC_MIXTURES = ("builtin_mc", *(f"builtin_mc_{d}" for d in MC_PROMPTS))


def make_mc_examples(dataset: str, split: str, num_examples: int | None = None) -> list[Example]:
    """The raw examples (fields, ``choices`` and ``label``) of a built-in multiple-choice split.

    Raises:
      ValueError: an unknown dataset or split.
    """
    if dataset not in MC_DATASETS:
        raise ValueError(
            f"unknown multiple-choice dataset {dataset!r}; expected one of {sorted(MC_DATASETS)}"
        )
    if split not in MC_SPLIT_SIZES:
        raise ValueError(f"unknown split {split!r} of {dataset!r}; expected one of {sorted(MC_SPLIT_SIZES)}")
    digest = sum((i + 1) * ord(c) for i, c in enumerate(dataset))
    rng = np.random.default_rng([digest, _SPLIT_SEEDS[split]])
    count = MC_SPLIT_SIZES[split] if num_examples is None else num_examples
    return [MC_DATASETS[dataset](rng) for _ in range(count)]


def _mc_dataset(dataset: str, split: str, shuffle_files: bool) -> tf.data.Dataset:
    del shuffle_files  # one in-memory shard
    examples = make_mc_examples(dataset, split)
    columns = {k: [ex[k] for ex in examples] for k in examples[0]}
    return tf.data.Dataset.from_tensor_slices(columns)


def render_prompt(template: str, example: Mapping[str, Any]) -> tf.Tensor:
    """Fills a ``{field}`` template from an example's string tensors (scalar result).

    Raises:
      KeyError: the template names a field the example lacks.
    """
    pieces: list[Any] = []
    for i, part in enumerate(re.split(r"\{(\w+)\}", template)):
        if i % 2:
            if part not in example:
                raise KeyError(
                    f"prompt template {template!r} needs field {part!r}; example has {sorted(example)}"
                )
            pieces.append(example[part])
        elif part:
            pieces.append(tf.constant(part))
    return tf.strings.join(pieces)


def _prompt_inputs(template: str, ex: Mapping[str, tf.Tensor]) -> tf.Tensor:
    return tf.fill(tf.shape(ex["choices"]), render_prompt(template, ex))


def _prompt_targets(ex: Mapping[str, tf.Tensor]) -> tf.Tensor:
    return tf.strings.join([TARGET_DELIMITER, ex["choices"]])


def _is_correct(ex: Mapping[str, tf.Tensor]) -> tf.Tensor:
    return tf.equal(tf.range(tf.size(ex["choices"])), tf.cast(ex["label"], tf.int32))


def register_prompted_mc_tasks(vocabulary: Any) -> None:
    """Registers the ``builtin_mc_*`` tasks and mixtures (skipping names already registered).

    Mixtures: ``builtin_mc`` (every task) and ``builtin_mc_<dataset>`` (the
    prompts of one dataset).

    Args:
      vocabulary: the vocabulary of both features (the built-in byte vocabulary).
    """
    from t5x.tasks.metrics import rank_classification as rank_classification_metric

    known = set(TaskRegistry.names())
    features = {
        "inputs": Feature(vocabulary, add_eos=False),
        "targets": Feature(vocabulary, add_eos=False),
    }
    metric = functools.partial(rank_classification_metric, num_classes=NUM_CHOICES)
    functools.update_wrapper(metric, rank_classification_metric)
    for dataset, prompts in MC_PROMPTS.items():
        source = FunctionDataSource(
            functools.partial(_mc_dataset, dataset),
            splits=tuple(MC_SPLIT_SIZES),
            num_input_examples=MC_SPLIT_SIZES,
        )
        for prompt, template in prompts.items():
            name = f"builtin_mc_{dataset}_{prompt}"
            if name in known:
                continue
            expand = functools.partial(
                rank_classification,
                inputs_fn=functools.partial(_prompt_inputs, template),
                targets_fn=_prompt_targets,
                is_correct_fn=_is_correct,
                mode="eval",
            )
            TaskRegistry.add(
                name,
                source,
                output_features=features,
                preprocessors=[expand, tokenize],
                postprocess_fn=rank_classification_postprocessor,
                metric_fns=[metric],
            )
    mixtures = {"builtin_mc": list(BUILTIN_MC_TASKS)}
    mixtures.update({f"builtin_mc_{d}": [f"builtin_mc_{d}_{p}" for p in MC_PROMPTS[d]] for d in MC_PROMPTS})
    for name, tasks in mixtures.items():
        if name not in MixtureRegistry.names():
            MixtureRegistry.add(name, tasks, default_rate=1.0)
