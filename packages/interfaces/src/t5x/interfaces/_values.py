"""Small value types shared across package boundaries."""

from __future__ import annotations

import dataclasses
from typing import Any, TypeAlias

JSONValue: TypeAlias = None | bool | int | float | str | list["JSONValue"] | dict[str, "JSONValue"]
"""A value that `json.dumps` accepts and `json.loads` gives back unchanged."""

PyTree: TypeAlias = Any
"""A nested structure of dicts, lists and tuples with arrays at its leaves."""


@dataclasses.dataclass(frozen=True)
class ShardInfo:
    """Which part of a dataset one reader takes.

    Attributes:
      index: this reader's shard, in ``[0, num_shards)``.
      num_shards: how many disjoint shards the data is split into; their union is
        the whole dataset.
    """

    index: int
    num_shards: int

    def __post_init__(self) -> None:
        if not isinstance(self.num_shards, int) or self.num_shards < 1:
            raise ValueError(f"ShardInfo.num_shards must be an int >= 1, got {self.num_shards!r}")
        if not isinstance(self.index, int) or not 0 <= self.index < self.num_shards:
            raise ValueError(f"ShardInfo.index must be an int in [0, {self.num_shards}), got {self.index!r}")


@dataclasses.dataclass(frozen=True)
class ArraySpec:
    """Shape and dtype of one array feature, without its data.

    Attributes:
      shape: the full shape, e.g. ``(batch, length)``; ``None`` marks a dimension
        whose size varies between elements.
      dtype: a numpy dtype name, e.g. ``"int32"``.
    """

    shape: tuple[int | None, ...]
    dtype: str


@dataclasses.dataclass(frozen=True)
class DataLayout:
    """How the global batch is split over the processes that feed it.

    A Partitioner returns this so that the data pipeline of each process reads
    only its part of the data.

    Attributes:
      batch_size: the global batch size (all processes together).
      shard_id: the data shard this process reads, in ``[0, num_shards)``.
      num_shards: how many distinct data shards exist; processes holding the same
        model-parallel slice of a batch read the same shard.
      is_first_host_in_replica_set: True on exactly one process per shard; that
        process writes outputs (e.g. inference results) for the shard.
    """

    batch_size: int
    shard_id: int
    num_shards: int
    is_first_host_in_replica_set: bool = True

    def __post_init__(self) -> None:
        if self.num_shards < 1 or not 0 <= self.shard_id < self.num_shards:
            raise ValueError(
                f"DataLayout.shard_id must be in [0, num_shards={self.num_shards}), got {self.shard_id}"
            )
        if self.batch_size % self.num_shards:
            raise ValueError(
                f"DataLayout.batch_size={self.batch_size} is not divisible by num_shards={self.num_shards}"
            )

    @property
    def per_shard_batch_size(self) -> int:
        """The number of examples one shard contributes to each global batch."""
        return self.batch_size // self.num_shards

    @property
    def shard_info(self) -> ShardInfo:
        """This process's shard, as the data pipeline takes it."""
        return ShardInfo(index=self.shard_id, num_shards=self.num_shards)


@dataclasses.dataclass(frozen=True)
class RestoredCheckpoint:
    """What a Checkpointer gives back from ``restore``.

    Attributes:
      step: the training step the checkpoint was saved at.
      state: the train state as a T5X state dict,
        ``{"target": params, "state": {"step": ..., "param_states": ...}}``, with
        leaves as arrays (placed on devices when shardings were given).
      input_state: the input iterator's state saved with it, or None.
    """

    step: int
    state: dict[str, Any]
    input_state: dict[str, JSONValue] | None = None
