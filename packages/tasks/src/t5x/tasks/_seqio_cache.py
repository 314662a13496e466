"""Reading a task cache written by seqio's ``cache_tasks_main``, as it is on disk.

seqio's layout of one task, ``{cache_dir}/{name with ':' as '/'}/``:
  ``COMPLETED``                               marker written when the job is done;
  ``info.{split}.json``                       ``{"features": {name: {"dtype", "shape"}},
                                               "num_shards": n, "seqio_version": v}``;
  ``stats.{split}.json``                      ``{"examples": n, "<feature>_tokens": ..., ...}``;
  ``{split}.tfrecord-{i:05d}-of-{n:05d}``     tf.train.Example records: each feature's
      flattened values (ints and bools as int64, floats as float32, strings as
      bytes) and, for a shape with ``None`` past its first axis, one row-lengths
      feature per ragged axis under ``_rl:<k>:<feature>``.

Caches written before seqio kept true dtypes (no ``seqio_version``, or one
below 0.0.0) store int32 features as int64; they are read back as int32, as
seqio does. Legacy ``*_plaintext`` features come back as ``*_pretokenized``.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from t5x.interfaces import ShardInfo
from t5x.tasks._shard import shard_examples, shard_files
from t5x.tasks._tfexample import tfexample_ragged_length_key

COMPLETED = "COMPLETED"
_INFO = "info.{split}.json"
_STATS = "stats.{split}.json"
_PREFIX = "{split}.tfrecord"


def get_task_dir_from_name(task_name: str) -> str:
    """seqio's folder for a task inside a cache dir: ``a:b`` -> ``a/b``."""
    return os.path.join(*task_name.split(":"))


def get_cached_info_path(data_dir: str, split: str) -> str:
    return os.path.join(data_dir, _INFO.format(split=split))


def get_cached_stats_path(data_dir: str, split: str) -> str:
    return os.path.join(data_dir, _STATS.format(split=split))


def get_cached_tfrecord_prefix(data_dir: str, split: str) -> str:
    return os.path.join(data_dir, _PREFIX.format(split=split))


def _info_path(task_dir: str, split: str) -> str:
    direct = get_cached_info_path(task_dir, split)
    nested = get_cached_info_path(os.path.join(task_dir, "info"), split)
    return nested if not tf.io.gfile.exists(direct) and tf.io.gfile.exists(nested) else direct


def _read_json(path: str, what: str) -> Any:
    try:
        with tf.io.gfile.GFile(path) as f:
            return json.load(f)
    except tf.errors.NotFoundError:
        raise ValueError(f"seqio cache: {what} {path} does not exist") from None
    except json.JSONDecodeError as error:
        raise ValueError(f"seqio cache: {path}:{error.lineno}: not valid JSON ({error.msg})") from None


def is_seqio_cache(task_dir: str) -> bool:
    """True when ``task_dir`` holds a finished seqio cache (its info JSON stores plain features)."""
    if not tf.io.gfile.exists(os.path.join(task_dir, COMPLETED)):
        return False
    infos = tf.io.gfile.glob(os.path.join(task_dir, "info.*.json")) + tf.io.gfile.glob(
        os.path.join(task_dir, "info", "info.*.json")
    )
    if not infos:
        return False
    info = _read_json(infos[0], "info file")
    # Our own caches record a seed and store serialized TensorProtos; seqio's do neither.
    return "seed" not in info


def find_seqio_cache(task_name: str, cache_dirs: Sequence[str]) -> str | None:
    """The folder of ``task_name``'s finished seqio cache in the first dir that has one, else None."""
    for d in cache_dirs:
        task_dir = os.path.join(d, get_task_dir_from_name(task_name))
        if is_seqio_cache(task_dir):
            return task_dir
    return None


def read_stats(task_dir: str, split: str) -> dict[str, Any]:
    """``stats.{split}.json`` of a seqio (or our) cache.

    Raises:
      ValueError: the file is missing or not JSON (names it).
    """
    return dict(_read_json(get_cached_stats_path(task_dir, split), f"stats for split {split!r}"))


def _version(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split("."):
        parts.append(int(piece) if piece.isdigit() else -1)
    return tuple(parts)


def _parse_spec(key: str, dtype: str, shape: Sequence[int | None] | None) -> Any:
    stored = "int64" if dtype in ("int32", "bool") else dtype
    shape = list(shape or [])
    if any(d is None for d in shape[1:]):
        partitions = []
        ragged_axis = 0
        for d in shape[1:]:
            if d is None:
                partitions.append(
                    tf.io.RaggedFeature.RowLengths(tfexample_ragged_length_key(key, ragged_axis))
                )
                ragged_axis += 1
            else:
                partitions.append(tf.io.RaggedFeature.UniformRowLength(d))
        return tf.io.RaggedFeature(value_key=key, partitions=partitions, dtype=tf.as_dtype(stored))
    if shape and shape[0] is None:
        return tf.io.FixedLenSequenceFeature(shape[1:], tf.as_dtype(stored), allow_missing=True)
    return tf.io.FixedLenFeature(shape, tf.as_dtype(stored))


def split_features(task_dir: str, split: str) -> dict[str, dict[str, Any]]:
    """``{feature: {"dtype", "shape"}}`` of a cached split, dtypes corrected for old caches."""
    info = _read_json(_info_path(task_dir, split), f"info for split {split!r}")
    if "features" not in info or "num_shards" not in info:
        raise ValueError(
            f"seqio cache: {_info_path(task_dir, split)} lacks 'features' or 'num_shards' "
            f"(it has {sorted(info)})"
        )
    features = {k: dict(v) for k, v in info["features"].items()}
    if _version(str(info.get("seqio_version", "0.pre"))) < (0, 0, 0):
        for desc in features.values():
            if desc["dtype"] == "int64":
                desc["dtype"] = "int32"
    return features


def shard_files_of(task_dir: str, split: str) -> list[str]:
    """The TFRecord shards of a cached split, in index order.

    Raises:
      ValueError: the info file is missing, or the shards are not all there.
    """
    info = _read_json(_info_path(task_dir, split), f"info for split {split!r}")
    n = int(info["num_shards"])
    prefix = get_cached_tfrecord_prefix(task_dir, split)
    files = sorted(tf.io.gfile.glob(f"{prefix}-*-of-*{n}"))
    pattern = re.compile(re.escape(os.path.basename(prefix)) + r"-\d+-of-0*" + str(n) + "$")
    files = [f for f in files if pattern.match(os.path.basename(f))]
    if len(files) != n:
        raise ValueError(
            f"seqio cache: {task_dir} split {split!r} should have {n} shards, found {len(files)}"
        )
    return files


def read_seqio_cache(
    task_dir: str,
    split: str,
    shard_info: ShardInfo | None = None,
    shuffle: bool = False,
    seed: int | None = None,
) -> tf.data.Dataset:
    """The examples of one shard of a cached split, with the dtypes and shapes its info JSON gives.

    With at least as many files as shards each shard reads whole files;
    otherwise each keeps every ``num_shards``-th example. ``shuffle`` permutes
    the file order with ``seed``; files are read one after another.
    """
    features = split_features(task_dir, split)
    files = shard_files_of(task_dir, split)
    if shuffle:
        files = [files[i] for i in np.random.default_rng(seed).permutation(len(files))]
    files, per_example = shard_files(files, shard_info)
    description = {k: _parse_spec(k, **desc) for k, desc in features.items()}

    def parse(record: tf.Tensor) -> dict[str, Any]:
        parsed = tf.io.parse_single_example(record, description)
        out = {}
        for k, v in parsed.items():
            name = k[: -len("plaintext")] + "pretokenized" if k.endswith("_plaintext") else k
            out[name] = tf.cast(v, features[k]["dtype"])
        return out

    ds = tf.data.TFRecordDataset(files)
    if per_example:
        ds = shard_examples(ds, shard_info)
    return ds.map(parse, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def write_info(task_dir: str, split: str, features: Mapping[str, Any], num_shards: int) -> None:
    """Writes ``info.{split}.json`` in seqio's format (for tests and converters)."""
    tf.io.gfile.makedirs(task_dir)
    with tf.io.gfile.GFile(get_cached_info_path(task_dir, split), "w") as f:
        json.dump({"features": dict(features), "num_shards": num_shards, "seqio_version": "0.0.0"}, f)
