"""Offline caching of tasks' pre-cache preprocessing as an Apache Beam pipeline.

The files written are described in ``_offline_cache``, which reads them back.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from t5x.interfaces import ShardInfo
from t5x.tasks._lazy_tf import tf
from t5x.tasks._offline_cache import COMPLETED, shard_path, task_cache_dir
from t5x.tasks._registry import TaskRegistry, get_mixture_or_task, get_subtasks
from t5x.tasks._task import CacheDatasetPlaceholder, Task
from t5x.tasks._task_modules import import_task_modules

_log = logging.getLogger("t5x.tasks.cache")
DEFAULT_NUM_INPUT_SHARDS = 8


# ---- writing ------------------------------------------------------------------
def cache_cut(task: Task) -> int:
    """Index of the task's CacheDatasetPlaceholder.

    Raises:
      ValueError: the task has none (nothing marks what to cache).
    """
    for i, prep in enumerate(task.preprocessors):
        if isinstance(prep, CacheDatasetPlaceholder):
            return i
    raise ValueError(
        f"Task {task.name!r} has no CacheDatasetPlaceholder among its preprocessors, so there is nothing to "
        "cache offline; add CacheDatasetPlaceholder() where the cache should be cut"
    )


def num_source_shards(task: Task, split: str, requested: int | None = None) -> int:
    """How many pieces the source of ``split`` is read in (one Beam work item each)."""
    files = task.source.list_shards(split)
    if len(files) > 1:
        return len(files)
    if not task.source.supports_arbitrary_sharding:
        return 1
    n = requested or DEFAULT_NUM_INPUT_SHARDS
    known = task.num_input_examples(split)
    return max(1, min(n, known)) if known else n


def precache_dataset(task: Task, split: str, shard: int, num_shards: int, seed: int) -> tf.data.Dataset:
    """The examples of one source shard after the preprocessors before the placeholder.

    Each shard's random preprocessors are seeded with ``(seed, shard)``.
    """
    ds = task.source_dataset(split, shuffle=False, shard_info=ShardInfo(shard, num_shards))
    return task.preprocess_precache(ds, seed=tf.constant([seed, shard], tf.int64))


def feature_info(element_spec: Any, task_name: str) -> dict[str, dict[str, Any]]:
    """JSON description of each feature (dtype name and shape with None for varying sizes)."""
    if not isinstance(element_spec, dict):
        raise TypeError(
            f"Task {task_name!r}: pre-cache examples must be dicts of tensors, got {element_spec}"
        )
    return {k: {"dtype": s.dtype.name, "shape": s.shape.as_list()} for k, s in sorted(element_spec.items())}


def shuffle_key(seed: int, shard: int, position: int) -> bytes:
    """A 16-byte key that orders examples pseudo-randomly but reproducibly."""
    return hashlib.blake2b(f"{seed}:{shard}:{position}".encode(), digest_size=16).digest()


def serialize_example(example: dict[str, Any]) -> bytes:
    """A tf.train.Example holding each feature as a serialized TensorProto."""
    feature = {
        k: tf.train.Feature(
            bytes_list=tf.train.BytesList(value=[tf.make_tensor_proto(np.asarray(v)).SerializeToString()])
        )
        for k, v in example.items()
    }
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def example_stats(example: dict[str, Any]) -> dict[str, int]:
    """Counts for one example: 1 example, and the length of each 1-D numeric feature."""
    stats = {"examples": 1}
    for k, v in example.items():
        v = np.asarray(v)
        if v.ndim == 1 and v.dtype.kind in "iuf":
            stats[f"{k}_tokens"] = int(v.shape[0])
            stats[f"{k}_max_tokens"] = int(v.shape[0])
    return stats


def merge_stats(many: Iterable[dict[str, int]]) -> dict[str, int]:
    """Sums counts and takes the max of ``*_max_tokens`` entries."""
    out: dict[str, int] = {}
    for stats in many:
        for k, v in stats.items():
            out[k] = max(out.get(k, 0), v) if k.endswith("_max_tokens") else out.get(k, 0) + v
    return out


def read_source_shard(
    task_name: str,
    split: str,
    shard: int,
    num_shards: int,
    num_output_shards: int,
    seed: int,
    modules: Sequence[str],
) -> Iterator[tuple[int, tuple[bytes, bytes, dict[str, int]]]]:
    """Beam step: yields ``(output shard, (shuffle key, record, stats))`` for one source shard."""
    import_task_modules(modules)
    task = TaskRegistry.get(task_name)
    for position, example in enumerate(
        precache_dataset(task, split, shard, num_shards, seed).as_numpy_iterator()
    ):
        key = shuffle_key(seed, shard, position)
        yield (
            int.from_bytes(key[:8], "big") % num_output_shards,
            (key, serialize_example(example), example_stats(example)),
        )


def write_output_shard(
    item: tuple[int, Iterable[tuple[bytes, bytes, dict[str, int]]]],
    task_dir: str,
    split: str,
    num_shards: int,
) -> tuple[str, int, dict[str, int]]:
    """Beam step: writes one output shard, examples sorted by shuffle key, through a temp file + rename."""
    index, records = item
    records = sorted(records, key=lambda r: r[0])
    path = shard_path(task_dir, split, index, num_shards)
    tmp = f"{path}.incomplete"
    with tf.io.TFRecordWriter(tmp) as writer:
        for _, record, _ in records:
            writer.write(record)
    tf.io.gfile.rename(tmp, path, overwrite=True)
    return split, index, merge_stats(r[2] for r in records)


def finalize_task(
    task_name: str,
    task_dir: str,
    split_infos: dict[str, dict[str, Any]],
    written: Sequence[tuple[str, int, dict]],
) -> str:
    """Beam step, run after every shard is written: empty shards, info, stats, then the marker."""
    for split, info in split_infos.items():
        shards = {index: stats for s, index, stats in written if s == split}
        for index in range(info["num_shards"]):
            if index not in shards:  # no example hashed to it: still write it so the set is complete
                with tf.io.TFRecordWriter(shard_path(task_dir, split, index, info["num_shards"])):
                    pass
        stats = merge_stats(shards.values())
        stats.setdefault("examples", 0)
        _write_json(os.path.join(task_dir, f"stats.{split}.json"), stats)
        _write_json(os.path.join(task_dir, f"info.{split}.json"), {**info, "num_examples": stats["examples"]})
    _write_json(os.path.join(task_dir, COMPLETED), {"task": task_name, "splits": sorted(split_infos)})
    return task_name


def _write_json(path: str, value: Any) -> None:
    tmp = f"{path}.incomplete"
    with tf.io.gfile.GFile(tmp, "w") as f:
        f.write(json.dumps(value, indent=2, sort_keys=True))
    tf.io.gfile.rename(tmp, path, overwrite=True)


def tasks_to_cache(task_names: Sequence[str], excluded_tasks: Sequence[str] = ()) -> list[Task]:
    """The registered tasks ``task_names`` expand to (mixtures to their tasks), each once, in order.

    ``excluded_tasks`` are removed after that expansion, so excluding a task
    drops it from every mixture that holds it; excluding a mixture drops its tasks.

    Raises:
      UnknownNameError: (a KeyError) a name in either list is not registered.
    """
    excluded = {task.name for name in excluded_tasks for task in get_subtasks(get_mixture_or_task(name))}
    tasks: dict[str, Task] = {}
    for name in task_names:
        for task in get_subtasks(get_mixture_or_task(name)):
            if task.name not in excluded:
                tasks.setdefault(task.name, task)
    return list(tasks.values())


def add_cache_pipeline(
    pipeline: Any,
    task_names: Sequence[str],
    output_cache_dir: str,
    *,
    modules: Sequence[str] = (),
    excluded_tasks: Sequence[str] = (),
    splits: Sequence[str] | None = None,
    num_input_shards: int | None = None,
    num_output_shards: int | None = None,
    seed: int = 0,
    overwrite: bool = False,
) -> list[str]:
    """Adds the steps that cache each task to a ``beam.Pipeline`` (run it to write the caches).

    Per task and split: read the source in shards, run the pre-cache
    preprocessors, key every example by a hash of (seed, source shard,
    position), group by ``key % num_output_shards``, sort each group by key and
    write it as one TFRecord file. The order is therefore a global shuffle that
    depends only on the seed and the source, never on the runner or workers.
    ``COMPLETED`` is written by a final step that waits for all shards.

    Args:
      pipeline: an ``apache_beam.Pipeline``.
      task_names: registered tasks (mixtures expand to their tasks).
      output_cache_dir: the cache root; each task gets a folder in it.
      modules: modules to import on every worker (they register the tasks).
      excluded_tasks: tasks not to cache, applied after mixtures expand (a
        mixture here excludes each of its tasks).
      splits: splits to cache (default: all of each task's).
      num_input_shards: pieces to read a non-file source in (default 8).
      num_output_shards: files per split (default: as many as input pieces).
      seed: seeds the shuffle and the pre-cache random preprocessors.
      overwrite: rebuild caches that are already complete.

    Returns:
      the names of the tasks that will be cached (complete ones are skipped).

    Raises:
      ValueError: a task without a CacheDatasetPlaceholder or an unknown split.
      UnknownNameError: (a KeyError) an unknown task, mixture or excluded name.
    """
    import apache_beam as beam

    import_task_modules(modules)
    scheduled = []
    for task in tasks_to_cache(task_names, excluded_tasks):
        cache_cut(task)
        task_dir = task_cache_dir(output_cache_dir, task.name)
        if tf.io.gfile.exists(os.path.join(task_dir, COMPLETED)) and not overwrite:
            _log.info(
                "cache of %s in %s is complete; skipping (pass overwrite to rebuild)", task.name, task_dir
            )
            continue
        if tf.io.gfile.exists(task_dir):
            tf.io.gfile.rmtree(task_dir)  # leftovers of an interrupted or older job must not mix in
        tf.io.gfile.makedirs(task_dir)
        infos, written = {}, []
        for split in splits or task.splits:
            if split not in task.splits:
                raise ValueError(
                    f"Task {task.name!r} has no split {split!r}; available: {', '.join(task.splits)}"
                )
            n_in = num_source_shards(task, split, num_input_shards)
            n_out = num_output_shards or n_in
            spec = precache_dataset(task, split, 0, n_in, seed).element_spec
            infos[split] = {"features": feature_info(spec, task.name), "num_shards": n_out, "seed": seed}
            label = f"{task.name}/{split}"
            written.append(
                pipeline
                | f"{label}/source shards" >> beam.Create(list(range(n_in)))
                | f"{label}/spread" >> beam.Reshuffle()
                | f"{label}/preprocess"
                >> beam.FlatMap(
                    lambda s, t=task.name, sp=split, k=n_in, n=n_out: read_source_shard(
                        t, sp, s, k, n, seed, modules
                    )
                )
                | f"{label}/group" >> beam.GroupByKey()
                | f"{label}/write"
                >> beam.Map(write_output_shard, task_dir=task_dir, split=split, num_shards=n_out)
            )
        all_written = tuple(written) | f"{task.name}/all shards" >> beam.Flatten()
        _ = (
            pipeline
            | f"{task.name}/finalize start" >> beam.Create([task.name])
            | f"{task.name}/finalize"
            >> beam.Map(
                finalize_task, task_dir=task_dir, split_infos=infos, written=beam.pvalue.AsList(all_written)
            )
        )
        scheduled.append(task.name)
    return scheduled
