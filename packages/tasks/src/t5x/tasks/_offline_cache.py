"""Where offline caches (written by ``t5x-tasks cache``) live, and reading them back.

Layout of one task's cache, ``{cache_dir}/{task_dir}/``:
  ``{split}.tfrecord-{i:05d}-of-{n:05d}``  examples, each a tf.train.Example whose
      features hold serialized TensorProtos (any dtype and rank round-trips);
  ``info.{split}.json``   feature dtypes/shapes, shard count, seed;
  ``stats.{split}.json``  example count and token totals per feature;
  ``COMPLETED``           written last, only after every file above exists.

Writing is ``_beam_cache``'s job; this module knows nothing of tasks, so
``Task.get_dataset(use_cached=True)`` can read without importing the writer.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence

import numpy as np

from t5x.interfaces import ShardInfo
from t5x.tasks._lazy_tf import tf
from t5x.tasks._shard import shard_examples, shard_files

COMPLETED = "COMPLETED"
_GLOBAL_CACHE_DIRS: list[str] = []


def add_global_cache_dirs(cache_dirs: Iterable[str]) -> None:
    """Adds folders where ``get_dataset(use_cached=True)`` looks for caches (searched in order)."""
    if isinstance(cache_dirs, str):
        raise TypeError(f"add_global_cache_dirs takes a list of folders, got the string {cache_dirs!r}")
    for d in cache_dirs:
        if d not in _GLOBAL_CACHE_DIRS:
            _GLOBAL_CACHE_DIRS.append(d)


def set_global_cache_dirs(cache_dirs: Iterable[str]) -> None:
    """Replaces the folders searched for caches."""
    _GLOBAL_CACHE_DIRS.clear()
    add_global_cache_dirs(cache_dirs)


def get_global_cache_dirs() -> list[str]:
    """The folders searched for caches, in order."""
    return list(_GLOBAL_CACHE_DIRS)


def task_cache_dir(cache_dir: str, task_name: str) -> str:
    """The folder holding ``task_name``'s cache inside ``cache_dir``."""
    return os.path.join(cache_dir, task_name.replace("/", "__"))


def shard_path(task_dir: str, split: str, index: int, num_shards: int) -> str:
    return os.path.join(task_dir, f"{split}.tfrecord-{index:05d}-of-{num_shards:05d}")


def how_to_build(task_name: str, cache_dir: str) -> str:
    return (
        f"build it with `t5x-tasks cache --module_import=<module registering the task> --tasks={task_name} "
        f"--output_cache_dir={cache_dir}`"
    )


def find_task_cache(task_name: str, cache_dirs: Sequence[str] | None = None) -> str:
    """The folder of ``task_name``'s complete cache.

    Raises:
      ValueError: no cache dirs are set, the cache is missing, or it is
        incomplete (no COMPLETED marker); the message says how to build it.
    """
    dirs = list(cache_dirs) if cache_dirs is not None else get_global_cache_dirs()
    if not dirs:
        raise ValueError(
            f"Task {task_name!r}: use_cached=True but no cache folders are set; call "
            "t5x.tasks.add_global_cache_dirs([...]) with the folder the cache job wrote to, or "
            + how_to_build(task_name, "CACHE_DIR")
        )
    incomplete = []
    for d in dirs:
        task_dir = task_cache_dir(d, task_name)
        if tf.io.gfile.exists(os.path.join(task_dir, COMPLETED)):
            return task_dir
        if tf.io.gfile.exists(task_dir):
            incomplete.append(task_dir)
    if incomplete:
        raise ValueError(
            f"Task {task_name!r}: the cache in {incomplete[0]} is incomplete (no {COMPLETED} marker: the cache "
            f"job was interrupted or is still running); rebuild it: " + how_to_build(task_name, dirs[0])
        )
    raise ValueError(f"Task {task_name!r}: no cache found in {dirs}; " + how_to_build(task_name, dirs[0]))


def read_cached_split(
    task_name: str,
    split: str,
    shard_info: ShardInfo | None = None,
    shuffle: bool = False,
    seed: int | None = None,
    cache_dirs: Sequence[str] | None = None,
) -> tf.data.Dataset:
    """The cached (pre-cache-preprocessed) examples of one shard of ``split``, in a fixed order.

    Files are read one after another, so the order is the same every time
    (for ``shuffle``, the file order is permuted with ``seed``) and a reader
    can resume by position. With at least as many files as shards each shard
    reads whole files; otherwise each keeps every ``num_shards``-th example.

    Raises:
      ValueError: missing or incomplete cache, or a split the cache lacks.
    """
    from t5x.tasks._seqio_cache import find_seqio_cache, read_seqio_cache

    # A cache written by seqio's cache_tasks_main is read as it is on disk.
    searched = list(cache_dirs) if cache_dirs is not None else get_global_cache_dirs()
    seqio_dir = find_seqio_cache(task_name, searched)
    if seqio_dir is not None:
        return read_seqio_cache(seqio_dir, split, shard_info, shuffle, seed)
    task_dir = find_task_cache(task_name, cache_dirs)
    info_path = os.path.join(task_dir, f"info.{split}.json")
    if not tf.io.gfile.exists(info_path):
        with tf.io.gfile.GFile(os.path.join(task_dir, COMPLETED)) as f:
            cached = json.load(f)["splits"]
        raise ValueError(
            f"Task {task_name!r}: the cache in {task_dir} has no split {split!r}; it has {cached}"
        )
    with tf.io.gfile.GFile(info_path) as f:
        info = json.load(f)
    files = [shard_path(task_dir, split, i, info["num_shards"]) for i in range(info["num_shards"])]
    if shuffle:
        files = [files[i] for i in np.random.default_rng(seed).permutation(len(files))]
    files, per_example = shard_files(files, shard_info)
    features = info["features"]
    ds = tf.data.TFRecordDataset(files)
    if per_example:
        ds = shard_examples(ds, shard_info)
    description = {k: tf.io.FixedLenFeature([], tf.string) for k in features}

    def parse(record: tf.Tensor) -> dict[str, tf.Tensor]:
        raw = tf.io.parse_single_example(record, description)
        return {
            k: tf.ensure_shape(tf.io.parse_tensor(raw[k], tf.as_dtype(f["dtype"])), f["shape"])
            for k, f in features.items()
        }

    return ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
