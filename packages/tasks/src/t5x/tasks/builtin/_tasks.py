"""Built-in tasks: synthetic text-to-text problems and a generated pretraining corpus.

Nothing is downloaded. All use a byte vocabulary (ByT5 layout) with 100
sentinel ids, so one small model can train on every one of them. Nothing is
registered until ``register_builtin_tasks()`` runs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

from t5x.tasks._feature import Feature
from t5x.tasks._lazy_tf import tf
from t5x.tasks._objectives import full_lm, prefix_lm, span_corruption
from t5x.tasks._preprocessors import append_eos_after_trim, rekey, tokenize
from t5x.tasks._registry import MixtureRegistry, TaskRegistry
from t5x.tasks._sources import FunctionDataSource
from t5x.tasks.builtin._prompted_mc import register_prompted_mc_tasks
from t5x.tasks.builtin._synthetic import PROBLEMS, SPLIT_SIZES, generate_corpus, make_examples

BUILTIN_EXTRA_IDS = 100
CORPUS_SIZES = {"train": 5_000, "validation": 200}
_VOCABULARY: Any = None


def builtin_vocabulary() -> Any:
    """The vocabulary of the built-in tasks: ``ByteVocabulary(extra_ids=100)``."""
    global _VOCABULARY
    if _VOCABULARY is None:
        from t5x.vocabularies import ByteVocabulary

        _VOCABULARY = ByteVocabulary(extra_ids=BUILTIN_EXTRA_IDS)
    return _VOCABULARY


def exact_match(targets: Sequence[str], predictions: Sequence[str]) -> dict[str, float]:
    """Percentage of predictions equal to their target."""
    if len(targets) != len(predictions):
        raise ValueError(f"exact_match: {len(targets)} targets but {len(predictions)} predictions")
    if not targets:
        return {"exact_match": 0.0}
    hits = sum(t == p for t, p in zip(targets, predictions, strict=True))
    return {"exact_match": 100.0 * hits / len(targets)}


def token_accuracy(targets: Sequence[str], predictions: Sequence[str]) -> dict[str, float]:
    """Percentage of whitespace tokens predicted right, position by position."""
    right = total = 0
    for t, p in zip(targets, predictions, strict=True):
        tw, pw = t.split(), p.split()
        total += len(tw)
        right += sum(a == b for a, b in zip(tw, pw))
    return {"token_accuracy": 100.0 * right / max(total, 1)}


def _strip(text: Any, **unused: Any) -> str:
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    return str(text).strip()


def _problem_dataset(problem: str, split: str, shuffle_files: bool) -> tf.data.Dataset:
    del shuffle_files  # one in-memory shard; examples are shuffled after preprocessing
    pairs = make_examples(problem, split)
    return tf.data.Dataset.from_tensor_slices(
        {"inputs": [p[0] for p in pairs], "targets": [p[1] for p in pairs]}
    )


def _corpus_dataset(split: str, shuffle_files: bool) -> tf.data.Dataset:
    del shuffle_files  # one in-memory shard
    docs = generate_corpus(CORPUS_SIZES[split], seed={"train": 11, "validation": 12}[split])
    return tf.data.Dataset.from_tensor_slices({"text": docs})


def builtin_corpus_source() -> FunctionDataSource:
    """The built-in generated English-like corpus (``text`` feature; train / validation)."""
    return FunctionDataSource(_corpus_dataset, splits=tuple(CORPUS_SIZES), num_input_examples=CORPUS_SIZES)


def _features(vocabulary: Any, inputs: bool = True) -> dict[str, Feature]:
    out = {"targets": Feature(vocabulary, add_eos=True)}
    if inputs:
        out["inputs"] = Feature(vocabulary, add_eos=True)
    return out


BUILTIN_TASKS = (
    *(f"synthetic_{p}" for p in PROBLEMS),
    "synthetic_corpus_span_corruption",
    "synthetic_corpus_prefix_lm",
    "synthetic_corpus_lm",
)
BUILTIN_MIXTURES = ("synthetic_text_to_text",)


def register_builtin_tasks() -> None:
    """Registers the built-in tasks and mixtures; calling it again does nothing.

    Names already registered (by an earlier call, or by the user) are skipped.

    Tasks: ``synthetic_copy``, ``synthetic_reverse``, ``synthetic_sort_digits``,
    ``synthetic_add`` (text to text, with ``exact_match`` / ``token_accuracy``),
    ``synthetic_corpus_span_corruption`` and ``synthetic_corpus_prefix_lm``
    (encoder-decoder pretraining), ``synthetic_corpus_lm`` (decoder-only, targets
    only). Mixture: ``synthetic_text_to_text`` (the four problems, equal rates).
    Also the prompted multiple-choice ``builtin_mc_*`` tasks and mixtures
    (``register_prompted_mc_tasks``).
    """
    vocabulary = builtin_vocabulary()
    known = set(TaskRegistry.names())
    for problem in PROBLEMS:
        name = f"synthetic_{problem}"
        if name in known:
            continue
        TaskRegistry.add(
            name,
            FunctionDataSource(
                functools.partial(_problem_dataset, problem),
                splits=tuple(SPLIT_SIZES),
                num_input_examples=SPLIT_SIZES,
            ),
            output_features=_features(vocabulary),
            preprocessors=[tokenize, append_eos_after_trim],
            postprocess_fn=_strip,
            metric_fns=[exact_match, token_accuracy],
        )
    corpus = builtin_corpus_source()
    to_targets = functools.partial(rekey, key_map={"inputs": None, "targets": "text"})
    objectives: dict[str, tuple[bool, list[Callable[..., Any]]]] = {
        "synthetic_corpus_span_corruption": (
            True,
            [to_targets, tokenize, span_corruption, append_eos_after_trim],
        ),
        "synthetic_corpus_prefix_lm": (True, [to_targets, tokenize, prefix_lm, append_eos_after_trim]),
        "synthetic_corpus_lm": (
            False,
            [functools.partial(rekey, key_map={"targets": "text"}), tokenize, full_lm],
        ),
    }
    for name, (with_inputs, preprocessors) in objectives.items():
        if name not in known:
            TaskRegistry.add(
                name, corpus, output_features=_features(vocabulary, with_inputs), preprocessors=preprocessors
            )
    if "synthetic_text_to_text" not in MixtureRegistry.names():
        MixtureRegistry.add("synthetic_text_to_text", [f"synthetic_{p}" for p in PROBLEMS], default_rate=1.0)
    register_prompted_mc_tasks(vocabulary)
