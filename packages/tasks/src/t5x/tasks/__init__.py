"""Data sources, Tasks, Mixtures, T5 preprocessors and deterministic resumable pipelines on tf.data.

No JAX, Flax or Optax is imported. Names and signatures follow seqio's, so a
task definition ports by changing imports. Importing this package registers
nothing and does not import TensorFlow (the first dataset built does); the
built-in demo tasks live in ``t5x.tasks.builtin`` and are registered by
``t5x.tasks.builtin.register_builtin_tasks()``.
"""

from typing import Any

from t5x.tasks._adhoc import ADHOC_SPLIT, adhoc_task
from t5x.tasks._evaluator import Evaluator
from t5x.tasks._example_batches import EXAMPLE_FIELD, ExampleBatches
from t5x.tasks._feature import Feature
from t5x.tasks._iterator import BatchIterator, get_input_iterator
from t5x.tasks._loggers import JSONLogger, Logger, PyLoggingLogger, TensorBoardLogger
from t5x.tasks._mixture import Mixture, MixtureRate, mixing_rate_num_examples, rate_num_examples
from t5x.tasks._noise import (
    drop_noise_tokens,
    drop_nonnoise_tokens,
    iid_noise_mask,
    noise_span_to_unique_sentinel,
    nonnoise_span_to_unique_sentinel,
    random_prefix_noise_mask,
    random_spans_helper,
    random_spans_noise_mask,
    sentinel_id,
)
from t5x.tasks._objectives import (
    denoise,
    full_lm,
    iid_denoising,
    prefix_lm,
    random_split_text,
    reduce_concat_tokens,
    select_random_chunk,
    span_corruption,
    split_tokens,
    split_tokens_to_inputs_length,
    split_tokens_to_targets_length,
)
from t5x.tasks._offline_cache import add_global_cache_dirs, get_global_cache_dirs, set_global_cache_dirs
from t5x.tasks._optional_sources import HuggingFaceDataSource, TfdsDataSource
from t5x.tasks._preprocessors import (
    append_eos,
    append_eos_after_trim,
    filter_by_string_length,
    rekey,
    summarize,
    tokenize,
    tokenize_and_append_eos,
    translate,
)
from t5x.tasks._rank_classification import rank_classification, rank_classification_postprocessor
from t5x.tasks._registry import (
    MixtureRegistry,
    TaskRegistry,
    UnknownNameError,
    get_mixture_or_task,
    get_subtasks,
)
from t5x.tasks._sources import (
    DataSource,
    DataSourceError,
    FileDataSource,
    FunctionDataSource,
    InMemoryDataSource,
    JsonLinesDataSource,
    TextLineDataSource,
    TFExampleDataSource,
)
from t5x.tasks._task import CacheDatasetPlaceholder, Task
from t5x.tasks._utils import map_over_dataset, stateless_shuffle

# Names that moved to t5x.tasks.builtin; still reachable here (gin files say
# `@tasks.builtin_vocabulary()`), loading that package on first use.
_BUILTIN_NAMES = frozenset(
    {
        "BUILTIN_MC_MIXTURES",
        "BUILTIN_MC_TASKS",
        "BUILTIN_MIXTURES",
        "BUILTIN_TASKS",
        "STUDY_OBJECTIVES",
        "builtin_corpus_source",
        "builtin_vocabulary",
        "exact_match",
        "generate_corpus",
        "make_mc_examples",
        "objective_task",
        "register_builtin_tasks",
        "register_prompted_mc_tasks",
        "token_accuracy",
    }
)


def __getattr__(name: str) -> Any:
    if name == "builtin" or name in _BUILTIN_NAMES:
        import importlib

        builtin = importlib.import_module("t5x.tasks.builtin")
        return builtin if name == "builtin" else getattr(builtin, name)
    raise AttributeError(f"module 't5x.tasks' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), "builtin", *_BUILTIN_NAMES})


__all__ = [
    "ADHOC_SPLIT",
    "adhoc_task",
    "EXAMPLE_FIELD",
    "ExampleBatches",
    "Evaluator",
    "JSONLogger",
    "Logger",
    "PyLoggingLogger",
    "TensorBoardLogger",
    "add_global_cache_dirs",
    "get_global_cache_dirs",
    "set_global_cache_dirs",
    "BUILTIN_MC_MIXTURES",
    "BUILTIN_MC_TASKS",
    "make_mc_examples",
    "register_prompted_mc_tasks",
    "rank_classification",
    "rank_classification_postprocessor",
    "BUILTIN_MIXTURES",
    "BUILTIN_TASKS",
    "builtin_vocabulary",
    "exact_match",
    "register_builtin_tasks",
    "token_accuracy",
    "STUDY_OBJECTIVES",
    "builtin_corpus_source",
    "objective_task",
    "generate_corpus",
    "BatchIterator",
    "CacheDatasetPlaceholder",
    "DataSource",
    "DataSourceError",
    "Feature",
    "FileDataSource",
    "FunctionDataSource",
    "HuggingFaceDataSource",
    "TfdsDataSource",
    "InMemoryDataSource",
    "JsonLinesDataSource",
    "Mixture",
    "MixtureRate",
    "MixtureRegistry",
    "TFExampleDataSource",
    "Task",
    "TaskRegistry",
    "TextLineDataSource",
    "UnknownNameError",
    "append_eos",
    "append_eos_after_trim",
    "denoise",
    "drop_noise_tokens",
    "drop_nonnoise_tokens",
    "filter_by_string_length",
    "full_lm",
    "get_input_iterator",
    "get_mixture_or_task",
    "get_subtasks",
    "iid_denoising",
    "iid_noise_mask",
    "map_over_dataset",
    "mixing_rate_num_examples",
    "noise_span_to_unique_sentinel",
    "nonnoise_span_to_unique_sentinel",
    "prefix_lm",
    "random_prefix_noise_mask",
    "random_split_text",
    "random_spans_helper",
    "random_spans_noise_mask",
    "rate_num_examples",
    "reduce_concat_tokens",
    "rekey",
    "select_random_chunk",
    "sentinel_id",
    "span_corruption",
    "split_tokens",
    "split_tokens_to_inputs_length",
    "split_tokens_to_targets_length",
    "stateless_shuffle",
    "summarize",
    "tokenize",
    "tokenize_and_append_eos",
    "translate",
]
