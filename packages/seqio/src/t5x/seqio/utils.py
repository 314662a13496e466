"""``seqio.utils``: map_over_dataset with seqio's seeding, trimming/packing, tf.Example codecs, rates.

Seeding follows seqio, not ``t5x.tasks``: ``map_seed_manager(seed)`` sets a
counter; every ``map_over_dataset(num_seeds=n)`` call made inside takes the next
``2 * n`` integers from it, each seeding a ``tf.data`` random stream that gives
every example its seeds. (The core instead derives each example's seeds from
the task seed, the preprocessor's position and the example's index; see
docs/differences.md.)
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import glob as _glob
import inspect
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import numpy as np
import tensorflow as tf

from t5x.feature_converters import make_autoregressive_inputs as _core_make_autoregressive_inputs
from t5x.feature_converters import trim_and_pack_dataset
from t5x.seqio._tfds_loader import (
    LazyTfdsLoader,
    TfdsSplit,
    get_tfds_data_dir_override,
    set_tfds_data_dir_override,
    set_tfds_read_config_override,
)
from t5x.tasks import (
    Feature,
    add_global_cache_dirs,
    get_global_cache_dirs,
    seqio_extras,
    set_global_cache_dirs,
    stateless_shuffle,
)
from t5x.tasks import map_over_dataset as _core_map_over_dataset
from t5x.tasks.seqio_extras import (
    dict_to_tfexample,
    flatten_dict,
    get_cached_info_path,
    get_cached_stats_path,
    get_cached_tfrecord_prefix,
    get_task_dir_from_name,
    tfexample_ragged_length_key,
    tfexample_sparse_indices_key,
    tfexample_to_dict,
    trim_and_pad_dataset,
    trim_dataset,
    unflatten_dict,
)
from t5x.tasks.seqio_extras import (
    mixing_rate_num_characters as _core_mixing_rate_num_characters,
)
from t5x.tasks.seqio_extras import (
    mixing_rate_num_examples as _core_mixing_rate_num_examples,
)

# seqio's type names for (nested) dicts of tensors, used in annotations.
NestedTFDict = Mapping[str, Any]
NestedNPDict = Mapping[str, Any]

_NEXT_MAP_SEED: int | None = None


@contextlib.contextmanager
def map_seed_manager(initial_seed: int | None = None) -> Iterator[None]:
    """Sets the seed counter the ``map_over_dataset(num_seeds=...)`` calls inside draw from."""
    global _NEXT_MAP_SEED
    previous = _NEXT_MAP_SEED
    _NEXT_MAP_SEED = initial_seed
    try:
        yield
    finally:
        _NEXT_MAP_SEED = previous


def _take_seed_pairs(num_seeds: int) -> tuple[tuple[int | None, int | None], ...]:
    global _NEXT_MAP_SEED
    if _NEXT_MAP_SEED is None:
        return ((None, None),) * num_seeds
    start = int(_NEXT_MAP_SEED)
    _NEXT_MAP_SEED = start + 2 * num_seeds
    flat = np.arange(start, start + 2 * num_seeds).reshape(-1, 2)
    return tuple((int(a), int(b)) for a, b in flat)


def add_kwargs_to_transform(transform: Any, **kwargs: Any) -> Any:
    """Binds the ``kwargs`` that ``transform`` (a function or dataclass) accepts; others are dropped."""
    if dataclasses.is_dataclass(transform) and not isinstance(transform, type):
        names = {f.name for f in dataclasses.fields(transform)}
        chosen = {k: v for k, v in kwargs.items() if k in names}
        return dataclasses.replace(transform, **chosen) if chosen else transform
    names = set(inspect.signature(transform).parameters)
    if isinstance(transform, functools.partial):
        names -= set(transform.keywords)  # what the partial already binds stays bound
    chosen = {k: v for k, v in kwargs.items() if k in names}
    return functools.partial(transform, **chosen) if chosen else transform


def map_over_dataset(
    fn: Callable[..., Any] | None = None,
    *,
    num_seeds: int | None = None,
    num_parallel_calls: int = tf.data.AUTOTUNE,
) -> Any:
    """Turns ``fn(example, ...)`` into ``transform(dataset, ...)``, with seqio's seeding.

    With ``num_seeds=1`` ``fn`` gets ``seed=`` (a pair of int64 scalars); with
    more it gets ``seeds=`` (that many pairs). The seeds are reproducible inside
    ``map_seed_manager(seed)``, random otherwise.
    """

    def without_seeds(inner: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(inner)
        def transform(ds: tf.data.Dataset, *args: Any, **kwargs: Any) -> tf.data.Dataset:
            return ds.map(lambda x: inner(x, *args, **kwargs), num_parallel_calls=num_parallel_calls)

        return transform

    def with_seeds(inner: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(inner)
        def transform(ds: tf.data.Dataset, *args: Any, **kwargs: Any) -> tf.data.Dataset:
            if _NEXT_MAP_SEED is None and seqio_extras.in_preprocessor_seed_scope():
                # Inside a core pipeline (t5x-launch's iterator, the Beam cache): use the core's
                # position-derived seeds, so that resumed and re-sharded runs repeat their draws.
                core_fn = _core_map_over_dataset(
                    inner, num_seeds=num_seeds, num_parallel_calls=num_parallel_calls
                )
                return core_fn(ds, *args, **kwargs)
            pairs = _take_seed_pairs(int(num_seeds or 0))
            streams = tuple(
                (tf.data.Dataset.random(seed=a), tf.data.Dataset.random(seed=b)) for a, b in pairs
            )

            def call(x: Any, seeds: Any) -> Any:
                if num_seeds == 1:
                    return inner(x, *args, seed=seeds[0], **kwargs)
                return inner(x, *args, seeds=seeds, **kwargs)

            return tf.data.Dataset.zip((ds, streams)).map(call, num_parallel_calls=num_parallel_calls)

        return transform

    wrap = without_seeds if num_seeds is None else with_seeds
    return wrap if fn is None else wrap(fn)


def make_autoregressive_inputs(
    targets: tf.Tensor,
    sequence_id: tf.Tensor | None = None,
    output_dtype: tf.DType | None = None,
    bos_id: int = 0,
) -> tf.Tensor:
    """seqio's decoder inputs: ``targets`` shifted right by one along the FIRST axis, ``bos_id`` first.

    As in seqio, a rank-2 ``targets`` is shifted along axis 0 (rows move down),
    and packing (``sequence_id``) needs rank-1 targets. The core's function
    shifts the last axis of a batch instead (docs/differences.md).

    Raises:
      ValueError: ``sequence_id`` given with targets of rank other than 1.
    """
    targets = tf.convert_to_tensor(targets)
    rank = targets.shape.rank
    if sequence_id is not None and rank != 1:
        raise ValueError(f"Only 1-D sequences are supported with packing. Got a packed {rank}-D sequence.")
    if rank is None or rank <= 1:
        return _core_make_autoregressive_inputs(targets, sequence_id, output_dtype, bos_id)
    output_dtype = output_dtype or targets.dtype
    shifted = tf.cast(targets[:-1], output_dtype)
    first = tf.fill(tf.concat([[1], tf.shape(targets)[1:]], 0), tf.constant(bos_id, output_dtype))
    return tf.concat([first, shifted], axis=0)


@functools.lru_cache(maxsize=1024)
def _list_files_for_glob(pattern: str) -> list[str]:
    # seqio's name (its tests patch it). Each pattern is globbed once per
    # process: listing a remote folder is slow and its files do not change
    # while a job runs. Through tf.compat.v2, the module seqio code patches.
    return sorted(set(tf.compat.v2.io.gfile.glob(pattern)))


def list_files(file_patterns: str | Iterable[str]) -> list[str]:
    """The files of the patterns, in pattern order; sharded names (``foo@2``) and plain paths pass as they are.

    Glob patterns expand to their sorted matches, each pattern listed once per
    process; a file named by two patterns appears once.
    """
    patterns = [file_patterns] if isinstance(file_patterns, str) else list(file_patterns)
    found: list[str] = []
    for pattern in patterns:
        found.extend(_list_files_for_glob(pattern) if _glob.has_magic(pattern) else (pattern,))
    return list(dict.fromkeys(found))


def _shift_right_by_one(tensor: tf.Tensor, bos_id: int = 0) -> tf.Tensor:
    """``tensor`` moved one place down its first axis: ``bos_id`` enters first, the last entry drops.

    seqio's private helper, kept under its name for code that calls it.
    """
    tensor = tf.convert_to_tensor(tensor)
    if not (tensor.dtype.is_integer or tensor.dtype.is_floating):
        raise ValueError(f"_shift_right_by_one: only numeric tensors can be shifted, got {tensor.dtype.name}")
    first = tf.fill(tf.concat([[1], tf.shape(tensor)[1:]], 0), tf.constant(bos_id, tensor.dtype))
    return tf.concat([first, tensor[:-1]], axis=0)


def mixing_rate_num_examples(
    task: Any,
    maximum: int | None = None,
    scale: float = 1.0,
    temperature: float = 1.0,
    fallback_to_num_input_examples: bool = True,
    split: str = "train",
) -> float:
    """seqio's rate from the task's example count: cached stats first, else (when allowed) the source's count.

    Raises:
      AssertionError: (seqio's) the task is not cached and the fallback is off.
    """
    if not fallback_to_num_input_examples and hasattr(task, "assert_cached"):
        task.assert_cached()
    return _core_mixing_rate_num_examples(
        task, maximum, scale, temperature, fallback_to_num_input_examples, split
    )


def mixing_rate_num_characters(
    task: Any, temperature: float = 1.0, char_count_name: str = "text_chars"
) -> float:
    """seqio's rate from the ``char_count_name`` count of the task's cached ``train`` stats.

    A task with ``get_cached_stats`` is asked directly (seqio's Task raises when
    it is not cached); other tasks go through the core's cache lookup.
    """
    getter = getattr(task, "get_cached_stats", None)
    if getter is None:
        return _core_mixing_rate_num_characters(task, temperature, char_count_name)
    stats = getter("train")
    if char_count_name not in stats:
        raise ValueError(
            f"mixing_rate_num_characters: the cached stats of {getattr(task, 'name', task)!r} have no "
            f"{char_count_name!r} (they have {sorted(stats)})"
        )
    return float(stats[char_count_name] ** (1.0 / temperature))


__all__ = [
    "Feature",
    "LazyTfdsLoader",
    "NestedNPDict",
    "NestedTFDict",
    "TfdsSplit",
    "add_global_cache_dirs",
    "add_kwargs_to_transform",
    "dict_to_tfexample",
    "flatten_dict",
    "get_cached_info_path",
    "get_cached_stats_path",
    "get_cached_tfrecord_prefix",
    "get_global_cache_dirs",
    "get_task_dir_from_name",
    "list_files",
    "make_autoregressive_inputs",
    "map_over_dataset",
    "map_seed_manager",
    "mixing_rate_num_characters",
    "mixing_rate_num_examples",
    "set_global_cache_dirs",
    "get_tfds_data_dir_override",
    "set_tfds_data_dir_override",
    "set_tfds_read_config_override",
    "stateless_shuffle",
    "tfexample_ragged_length_key",
    "tfexample_sparse_indices_key",
    "tfexample_to_dict",
    "trim_and_pack_dataset",
    "trim_and_pad_dataset",
    "trim_dataset",
    "unflatten_dict",
]
