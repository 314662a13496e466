"""seqio names the core lacked: per-axis trimming, proto sources, rates from cached stats, get_dataset.

These follow seqio's documented behaviour; ``t5x.seqio`` re-exports them.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import tensorflow as tf

from t5x.interfaces import ShardInfo, Vocabulary
from t5x.tasks._feature import Feature
from t5x.tasks._sources import FileDataSource
from t5x.tasks._utils import map_over_dataset

_log = logging.getLogger("t5x.tasks")


def list_files(pattern: str | Iterable[str]) -> list[str]:
    """The files matching a glob pattern (or any of several), sorted, without duplicates."""
    patterns = [pattern] if isinstance(pattern, str) else list(pattern)
    found: set[str] = set()
    for p in patterns:
        found.update(tf.io.gfile.glob(p))
    return sorted(found)


@dataclasses.dataclass(frozen=True)
class ContinuousFeature(Feature):
    """An output feature of real values (images, embeddings): no EOS, a pass-through vocabulary."""

    vocabulary: Vocabulary = dataclasses.field(default_factory=lambda: _passthrough(0))
    add_eos: bool = False


def _passthrough(size: int) -> Any:
    from t5x.vocabularies import PassThroughVocabulary

    return PassThroughVocabulary(max(size, 1), eos_id=None)


class ProtoDataSource(FileDataSource):
    """Records of any serialized proto, decoded by ``decode_proto_fn(record) -> dict of tensors``.

    Args:
      split_to_filepattern: split name -> glob pattern or list of patterns.
      decode_proto_fn: turns one serialized record into a dict of tensors.
      reader_cls: the dataset class reading one file (``tf.data.TFRecordDataset``).
      num_input_examples: split name -> number of records, when known.
    """

    def __init__(
        self,
        split_to_filepattern: Mapping[str, str | Sequence[str]],
        decode_proto_fn: Callable[..., Mapping[str, Any]],
        reader_cls: Callable[[Any], tf.data.Dataset] = tf.data.TFRecordDataset,
        num_input_examples: Mapping[str, int] | None = None,
        caching_permitted: bool = True,
        file_shuffle_buffer_size: int | None = None,
    ):
        del file_shuffle_buffer_size  # files are always shuffled completely
        self._caching_permitted = caching_permitted

        def read(path: tf.Tensor) -> tf.data.Dataset:
            return reader_cls(path).map(decode_proto_fn, num_parallel_calls=tf.data.AUTOTUNE)

        super().__init__(read, split_to_filepattern, num_input_examples)

    @property
    def caching_permitted(self) -> bool:
        return self._caching_permitted


def _trim_and_pad(value: Any, length: int | Sequence[int]) -> tf.Tensor:
    if isinstance(value, tf.RaggedTensor):
        value = value.to_tensor()
    lengths = [length] if isinstance(length, int) else list(length)
    rank = value.shape.rank
    if rank is not None and len(lengths) > rank:
        raise ValueError(f"trim_and_pad_dataset: {len(lengths)} lengths for a rank-{rank} feature")
    value = value[tuple(slice(0, n) for n in lengths)]
    shape = tf.shape(value)
    pads = [[0, n - shape[i]] for i, n in enumerate(lengths)]
    pads += [[0, 0]] * ((rank or len(lengths)) - len(lengths))
    padded = tf.pad(value, pads)
    padded.set_shape(lengths + value.shape.as_list()[len(lengths) :])
    return padded


def trim_and_pad_dataset(
    dataset: tf.data.Dataset, feature_lengths: Mapping[str, int | Sequence[int]]
) -> tf.data.Dataset:
    """Trims and zero-pads the listed features to their lengths; other features pass unchanged.

    A length is an int (the first axis) or a list with one length per leading
    axis (seqio's per-dimension lengths). Ragged features are made dense first.
    """
    return dataset.map(
        lambda x: {
            k: _trim_and_pad(v, feature_lengths[k]) if k in feature_lengths else v for k, v in x.items()
        },
        num_parallel_calls=tf.data.AUTOTUNE,
    )


def trim_dataset(
    dataset: tf.data.Dataset,
    sequence_length: Mapping[str, int | Sequence[int] | None] | None,
    output_features: Mapping[str, Any],
) -> tf.data.Dataset:
    """Cuts each output feature to its length (an int, or one per leading axis); no padding."""

    def trim(k: str, v: Any) -> Any:
        if k not in output_features or not sequence_length or sequence_length.get(k) is None:
            return v
        lengths = sequence_length[k]
        lengths = [lengths] if isinstance(lengths, int) else list(lengths)  # type: ignore[arg-type]
        return v[tuple(slice(0, n) for n in lengths)]

    return dataset.map(lambda x: {k: trim(k, v) for k, v in x.items()}, num_parallel_calls=tf.data.AUTOTUNE)


def _cached_stats(task: Any, split: str) -> Mapping[str, Any] | None:
    """The task's cached ``stats.<split>.json`` (seqio's cache layout or ours), or None when uncached."""
    getter = getattr(task, "get_cached_stats", None)
    if getter is not None:
        return getter(split) if getattr(task, "cache_dir", None) else None
    import os

    from t5x.tasks._offline_cache import COMPLETED, get_global_cache_dirs, task_cache_dir
    from t5x.tasks._seqio_cache import find_seqio_cache, get_cached_stats_path, read_stats

    dirs = get_global_cache_dirs()
    found = find_seqio_cache(task.name, dirs)
    if found is None:
        ours = (task_cache_dir(d, task.name) for d in dirs)
        found = next((t for t in ours if tf.io.gfile.exists(os.path.join(t, COMPLETED))), None)
    if found is None or not tf.io.gfile.exists(get_cached_stats_path(found, split)):
        return None
    return read_stats(found, split)


def mixing_rate_num_examples(
    task: Any,
    maximum: int | None = None,
    scale: float = 1.0,
    temperature: float = 1.0,
    fallback_to_num_input_examples: bool = True,
    split: str = "train",
) -> float:
    """seqio's rate: the cached example count when the task is cached, else the source's count.

    ``rate = min(count * scale, maximum) ** (1 / temperature)``.

    Raises:
      ValueError: no cached stats and (``fallback_to_num_input_examples`` False, or
        the source does not know its size).
    """
    stats = _cached_stats(task, split)
    if stats is not None:
        count = stats["examples"]
    elif not fallback_to_num_input_examples:
        raise ValueError(
            f"mixing_rate_num_examples: task {task.name!r} has no cache (with stats for split {split!r}) "
            "and fallback_to_num_input_examples=False"
        )
    else:
        count = task.num_input_examples(split)
        if count is None:
            raise ValueError(
                f"mixing_rate_num_examples: task {task.name!r} is not cached and its source does not know "
                f"how many examples split {split!r} has; give the source num_input_examples"
            )
        _log.info("task %r is not cached: its rate uses the number of input examples", task.name)
    rate = count * scale
    if maximum:
        rate = min(rate, maximum)
    if temperature != 1.0:
        rate = rate ** (1.0 / temperature)
    return float(rate)


def mixing_rate_num_characters(
    task: Any, temperature: float = 1.0, char_count_name: str = "text_chars"
) -> float:
    """A rate from the character count in the task's cached ``train`` stats.

    Raises:
      ValueError: the task is not cached, or its stats lack ``char_count_name``.
    """
    stats = _cached_stats(task, "train")
    if stats is None:
        raise ValueError(
            f"mixing_rate_num_characters: task {getattr(task, 'name', task)!r} is not cached; the rate "
            f"needs the {char_count_name!r} count of its cached stats"
        )
    if char_count_name not in stats:
        raise ValueError(
            f"mixing_rate_num_characters: the cached stats of {task.name!r} have no {char_count_name!r} "
            f"(they have {sorted(stats)})"
        )
    rate = stats[char_count_name]
    if temperature != 1.0:
        rate = rate ** (1.0 / temperature)
    return float(rate)


@map_over_dataset
def truncate_inputs_left(example: Mapping[str, Any], sequence_length: Mapping[str, int] | None) -> dict:
    """Keeps the last ``sequence_length["inputs"]`` tokens of ``inputs`` (the start is cut)."""
    example = dict(example)
    if sequence_length is None or "inputs" not in sequence_length:
        return example
    example["inputs"] = example["inputs"][-sequence_length["inputs"] :]
    return example


def apply_feature_converter(
    dataset: tf.data.Dataset, sequence_length: Mapping[str, int], feature_converter: Any
) -> tf.data.Dataset:
    """A preprocessor running ``feature_converter(dataset, sequence_length)`` (e.g. to pack inside a task)."""
    return feature_converter(dataset, sequence_length)


_FIELD = re.compile(r"\{(\w+)\}")


@map_over_dataset
def preprocess_tensorflow_examples(
    example: Mapping[str, Any], inputs_format: str, targets_format: str
) -> dict[str, tf.Tensor]:
    """Builds ``inputs``/``targets`` strings from templates like ``"question: {q}"`` over the features.

    A ``{name}`` that is not a feature of the example stays as written.
    """

    def fill(template: str) -> tf.Tensor:
        parts: list[Any] = []
        last = 0
        for match in _FIELD.finditer(template):
            if match.group(1) not in example:
                continue
            parts.append(template[last : match.start()])
            parts.append(example[match.group(1)])
            last = match.end()
        parts.append(template[last:])
        return tf.strings.join([p for p in parts if not isinstance(p, str) or p])

    return {"inputs": fill(inputs_format), "targets": fill(targets_format)}


def maybe_get_mixture_or_task(task: Any) -> Any:
    """A registered Task/Mixture by name, or the Task/Mixture given."""
    if isinstance(task, str):
        from t5x.tasks._registry import get_mixture_or_task

        return get_mixture_or_task(task)
    return task


def get_dataset(
    mixture_or_task_name: Any,
    task_feature_lengths: Mapping[str, int | Sequence[int]] | None,
    feature_converter: Any = None,
    dataset_split: str = "train",
    use_cached: bool = False,
    shuffle: bool = False,
    num_epochs: int | None = 1,
    shard_info: ShardInfo | None = None,
    verbose: bool = True,
    seed: int | None = None,
    batch_size: int | None = None,
    trim_output_features: bool = True,
) -> tf.data.Dataset:
    """seqio's ``get_dataset``: a task's (or mixture's) examples through a feature converter.

    Args:
      mixture_or_task_name: a registered name, or a Task/Mixture.
      task_feature_lengths: task feature -> length (an int, or one per axis).
      feature_converter: called as ``converter(ds, task_feature_lengths)``;
        None passes examples through unchanged.
      dataset_split, use_cached, shuffle, num_epochs, shard_info, seed,
        trim_output_features: passed to the provider's ``get_dataset``.
      verbose: unused (seqio logs the examples' spec).
      batch_size: batch the converted examples (the last partial batch is dropped).
    """
    del verbose
    provider = maybe_get_mixture_or_task(mixture_or_task_name)
    kwargs: dict[str, Any] = {
        "split": dataset_split,
        "use_cached": use_cached,
        "shuffle": shuffle,
        "seed": seed,
        "shard_info": shard_info,
        "num_epochs": num_epochs,
    }
    if not trim_output_features:
        kwargs["trim_output_features"] = False
    ds = provider.get_dataset(task_feature_lengths, **kwargs)
    if feature_converter is not None:
        ds = feature_converter(ds, task_feature_lengths=task_feature_lengths)
    if batch_size is not None:
        ds = ds.batch(batch_size, drop_remainder=True)
    return ds
