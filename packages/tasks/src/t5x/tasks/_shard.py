"""Splitting file lists and example streams into disjoint shards."""

from __future__ import annotations

from collections.abc import Sequence

from t5x.interfaces import ShardInfo
from t5x.tasks._lazy_tf import tf


def shard_files(files: Sequence[str], shard_info: ShardInfo | None) -> tuple[list[str], bool]:
    """Assigns files to shards when there are at least as many files as shards.

    Returns:
      (files this shard reads, whether examples still have to be sharded): with
      fewer files than shards every shard reads all files and keeps every
      ``num_shards``-th example instead.
    """
    files = list(files)
    if shard_info is None or shard_info.num_shards == 1:
        return files, False
    if len(files) >= shard_info.num_shards:
        return files[shard_info.index :: shard_info.num_shards], False
    return files, True


def shard_examples(ds: tf.data.Dataset, shard_info: ShardInfo | None) -> tf.data.Dataset:
    """Keeps every ``num_shards``-th example, starting at ``index``."""
    if shard_info is None or shard_info.num_shards == 1:
        return ds
    return ds.shard(shard_info.num_shards, shard_info.index)
