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
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import tensorflow as tf

from t5x.feature_converters import make_autoregressive_inputs, trim_and_pack_dataset
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
    list_files,
    mixing_rate_num_characters,
    mixing_rate_num_examples,
    tfexample_ragged_length_key,
    tfexample_sparse_indices_key,
    tfexample_to_dict,
    trim_and_pad_dataset,
    trim_dataset,
    unflatten_dict,
)

_NEXT_MAP_SEED: int | None = None
_TFDS_DATA_DIR_OVERRIDE: str | None = None


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


def set_tfds_data_dir_override(tfds_data_dir: str | None) -> None:
    """Makes TfdsDataSource read (and download) TFDS data under ``tfds_data_dir``."""
    global _TFDS_DATA_DIR_OVERRIDE
    _TFDS_DATA_DIR_OVERRIDE = tfds_data_dir


def get_tfds_data_dir_override() -> str | None:
    return _TFDS_DATA_DIR_OVERRIDE


__all__ = [
    "Feature",
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
    "set_tfds_data_dir_override",
    "stateless_shuffle",
    "tfexample_ragged_length_key",
    "tfexample_sparse_indices_key",
    "tfexample_to_dict",
    "trim_and_pack_dataset",
    "trim_and_pad_dataset",
    "trim_dataset",
    "unflatten_dict",
]
