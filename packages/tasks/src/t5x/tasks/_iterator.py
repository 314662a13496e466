"""Deterministic, sharded, resumable numpy batches from a task or mixture.

The stream is cut into *blocks*: block j holds, for each task t, source examples
``[j * n_t, (j + 1) * n_t)`` of that task's (repeated, shuffled) source shard.
Each block is preprocessed, mixed, shuffled and feature-converted (packed) on
its own, with seeds derived from (seed, task, block). A position in the stream
is therefore just (block, index of the next converted example in the block):
resuming re-reads the raw source up to the block (no preprocessing) and
recomputes at most that one block.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from t5x.interfaces import ArraySpec, FeatureConverter, JSONValue, ShardInfo, check_contract
from t5x.tasks._lazy_tf import tf
from t5x.tasks._mixture import Mixture
from t5x.tasks._registry import get_mixture_or_task
from t5x.tasks._sources import data_source_error
from t5x.tasks._task import Task
from t5x.tasks._utils import AUTOTUNE, fold_seed

_BLOCK_KEY = "_t5x_block"
_INDEX_KEY = "_t5x_index"
_STATE_VERSION = 1
_NO_LIMIT = 2**62
_MAX_BLOCK_OUTPUTS = 1 << 24


def _task_source_seed(seed: int, task_index: int) -> int:
    # Distinct, reproducible file/example orders per task of a mixture.
    return (seed * 1_000_003 + task_index * 7_919) % (2**31 - 1)


class BatchIterator:
    """Numpy batches for one shard, implementing ``t5x.interfaces.InputIterator``.

    Args:
      provider: a Task, a Mixture, or a registered name.
      feature_converter: a ``FeatureConverter`` (e.g. ``EncDecFeatureConverter``).
      task_feature_lengths: task feature name -> length (e.g. inputs 512, targets 114).
      batch_size: examples per batch on this shard (the per-host batch size).
      split: the split to read.
      shard_info: which shard this process reads (default: the whole split).
      seed: fixes source order, random preprocessing, mixing and shuffling.
      shuffle: shuffle files and the examples within each block.
      num_epochs: passes over each task's source, None for forever.
      block_size: source examples per block (split between a mixture's tasks by
        rate). Larger blocks shuffle and pack more globally; resuming recomputes
        one block.
      drop_remainder: drop a final partial batch (only reachable with epochs).
      num_parallel_blocks: blocks prepared concurrently.
      trim_output_features: cut task features longer than ``task_feature_lengths``.

    Raises:
      ValueError: bad arguments, an unknown split, or a shard that yields nothing.
    """

    def __init__(
        self,
        provider: Task | Mixture | str,
        feature_converter: FeatureConverter,
        task_feature_lengths: Mapping[str, int],
        batch_size: int,
        *,
        split: str = "train",
        shard_info: ShardInfo | None = None,
        seed: int = 0,
        shuffle: bool = True,
        num_epochs: int | None = None,
        block_size: int = 512,
        drop_remainder: bool = True,
        num_parallel_blocks: int = 2,
        trim_output_features: bool = True,
    ):
        if isinstance(provider, str):
            provider = get_mixture_or_task(provider)
        check_contract(feature_converter, FeatureConverter, component="feature_converter")
        for name, value in (("batch_size", batch_size), ("block_size", block_size)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"BatchIterator: {name} must be an int >= 1, got {value!r}")
        if not isinstance(seed, int):
            raise ValueError(f"BatchIterator: seed must be an int, got {seed!r}")
        self._provider = provider
        self._converter = feature_converter
        self._lengths = dict(task_feature_lengths)
        self._batch_size = batch_size
        self._split = split
        self._shard = shard_info or ShardInfo(0, 1)
        self._seed = seed
        self._shuffle = shuffle
        self._num_epochs = num_epochs
        self._block_size = block_size
        self._drop_remainder = drop_remainder
        self._parallel = max(1, num_parallel_blocks)
        self._trim = trim_output_features

        tasks = [t for t in provider.tasks if split in t.splits]
        if not tasks:
            raise ValueError(
                f"{provider.name!r}: no task has a split {split!r}; splits: {list(provider.splits)}"
            )
        rates = np.array([provider.get_rate(t) for t in tasks], dtype=np.float64)
        if rates.sum() <= 0:
            raise ValueError(f"{provider.name!r}: every task has rate 0 for split {split!r}")
        keep = rates > 0
        self._tasks = [t for t, k in zip(tasks, keep, strict=True) if k]
        self._rates = rates[keep] / rates[keep].sum()
        self._per_block = [max(1, round(block_size * r)) for r in self._rates]
        self._features = sorted(provider.output_features)

        self._block = 0
        self._offset = 0
        self._iterator: Iterator[Any] | None = None
        # Built on first use, so that a resumed iterator traces its pipeline once.
        self._dataset: tf.data.Dataset | None = None
        self._element_spec: dict[str, ArraySpec] | None = None

    # ---- the tf.data pipeline -------------------------------------------------
    def _raw_blocks(self, start_block: int) -> tf.data.Dataset:
        streams = []
        for t, (task, n) in enumerate(zip(self._tasks, self._per_block, strict=True)):
            ds = task.source_dataset(
                self._split,
                shuffle=self._shuffle,
                seed=_task_source_seed(self._seed, t),
                shard_info=self._shard,
            )
            ds = ds.repeat(self._num_epochs)
            if start_block:
                ds = ds.skip(start_block * n)
            streams.append(ds.ragged_batch(n))
        return tf.data.Dataset.zip(tuple(streams)).enumerate(start=start_block)

    def _make_block(self, block: tf.Tensor, raw: tuple[Any, ...]) -> tf.data.Dataset:
        seed = tf.constant([self._seed, 0x5EED], tf.int64)
        parts = []
        for t, (task, rows) in enumerate(zip(self._tasks, raw, strict=True)):
            ds = tf.data.Dataset.from_tensor_slices(rows).map(_densify)
            ds = task.preprocess(
                ds, self._lengths, seed=fold_seed(seed, 1, t, block), trim_output_features=self._trim
            )
            features = self._features
            parts.append(ds.map(lambda x, f=features: {k: x[k] for k in f if k in x}))
        if len(parts) == 1:
            ds = parts[0]
        else:
            logits = tf.math.log(tf.constant([self._rates.tolist()], tf.float32))
            mix_seed = fold_seed(seed, 2, block)
            choices = tf.data.Dataset.range(_NO_LIMIT).map(
                lambda i: tf.random.stateless_categorical(
                    logits, 1, seed=fold_seed(mix_seed, i), dtype=tf.int64
                )[0, 0]
            )
            ds = tf.data.Dataset.choose_from_datasets(parts, choices, stop_on_empty_dataset=False)
        if self._shuffle:
            shuffle_seed = fold_seed(seed, 3, block)[1]
            ds = ds.shuffle(1 << 16, seed=shuffle_seed)
        ds = self._converter(ds, self._lengths)
        return ds.enumerate().map(lambda i, x: {**x, _BLOCK_KEY: block, _INDEX_KEY: i})

    def _build(self, block: int, offset: int) -> tf.data.Dataset:
        ds = self._raw_blocks(block).interleave(
            self._make_block,
            cycle_length=self._parallel,
            block_length=_MAX_BLOCK_OUTPUTS,
            num_parallel_calls=self._parallel,
            deterministic=True,
        )
        if offset:
            ds = ds.skip(offset)
        ds = ds.batch(self._batch_size, drop_remainder=self._drop_remainder, num_parallel_calls=AUTOTUNE)
        return ds.prefetch(2)

    # ---- InputIterator --------------------------------------------------------
    @property
    def element_spec(self) -> dict[str, ArraySpec]:
        if self._element_spec is None:
            if self._dataset is None:
                self._dataset = self._build(self._block, self._offset)
            self._element_spec = {
                k: ArraySpec(tuple(v.shape.as_list()), v.dtype.name)
                for k, v in self._dataset.element_spec.items()
                if not k.startswith("_t5x_")
            }
        return dict(self._element_spec)

    def __iter__(self) -> BatchIterator:
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        if self._iterator is None:
            if self._dataset is None:
                self._dataset = self._build(self._block, self._offset)
            self._iterator = iter(self._dataset)
        fresh = self._block == 0 and self._offset == 0
        failure = None
        try:
            batch = next(self._iterator)
        except tf.errors.OpError as error:
            sources = [(t.name, t.source, self._split) for t in self._tasks]
            failure = data_source_error(error, sources)
            if failure is None:
                raise
        except StopIteration:
            if fresh:
                raise ValueError(
                    f"{self._provider.name!r}: split {self._split!r} shard {self._shard.index} of "
                    f"{self._shard.num_shards} yields no examples"
                ) from None
            raise
        if failure is not None:
            # Raised outside the handler so that nothing keeps TensorFlow's error, whose traceback
            # holds the broken iterator (its threads must stop now, not at interpreter exit).
            self._iterator = None
            raise failure
        blocks = batch.pop(_BLOCK_KEY).numpy()
        indices = batch.pop(_INDEX_KEY).numpy()
        self._block, self._offset = int(blocks[-1]), int(indices[-1]) + 1
        return {k: v.numpy() for k, v in batch.items()}

    def _fingerprint(self) -> dict[str, JSONValue]:
        return {
            "provider": self._provider.name,
            "tasks": [t.name for t in self._tasks],
            "split": self._split,
            "shard": [self._shard.index, self._shard.num_shards],
            "seed": self._seed,
            "shuffle": self._shuffle,
            "batch_size": self._batch_size,
            "block_size": self._block_size,
            "task_feature_lengths": {k: int(v) for k, v in sorted(self._lengths.items())},
        }

    def get_state(self) -> dict[str, JSONValue]:
        """The position after the last batch: block, offset in it, and a fingerprint.

        ``epochs`` (informational) says how many passes each task's source shard
        has started, when the source knows its size.
        """
        epochs: dict[str, JSONValue] = {}
        for task, n in zip(self._tasks, self._per_block, strict=True):
            total = task.num_input_examples(self._split)
            shard_total = (
                None if total is None else len(range(self._shard.index, total, self._shard.num_shards))
            )
            epochs[task.name] = None if not shard_total else (self._block * n) // shard_total
        return {
            "version": _STATE_VERSION,
            "block": self._block,
            "offset": self._offset,
            "epochs": epochs,
            **self._fingerprint(),
        }

    def set_state(self, state: Mapping[str, JSONValue]) -> None:
        """Moves to the position ``state`` describes (see ``get_state``).

        Raises:
          ValueError: ``state`` comes from an iterator over other data or settings.
        """
        state = json.loads(json.dumps(state))
        if state.get("version") != _STATE_VERSION:
            raise ValueError(
                f"BatchIterator.set_state: state version {state.get('version')!r}, expected {_STATE_VERSION}"
            )
        for key, mine in self._fingerprint().items():
            if state.get(key) != mine:
                raise ValueError(
                    f"BatchIterator.set_state: field {key!r} is {state.get(key)!r} in the state but {mine!r} here"
                )
        block, offset = state.get("block"), state.get("offset")
        if not isinstance(block, int) or not isinstance(offset, int) or block < 0 or offset < 0:
            raise ValueError(f"BatchIterator.set_state: bad position block={block!r} offset={offset!r}")
        self._block, self._offset = block, offset
        self._iterator = None
        self._dataset = None


def _densify(x: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v.to_tensor() if isinstance(v, tf.RaggedTensor) else v for k, v in x.items()}


def get_input_iterator(
    provider: Task | Mixture | str,
    feature_converter: FeatureConverter,
    task_feature_lengths: Mapping[str, int],
    batch_size: int,
    **kwargs: Any,
) -> BatchIterator:
    """Builds a :class:`BatchIterator` (see its arguments)."""
    return BatchIterator(provider, feature_converter, task_feature_lengths, batch_size, **kwargs)
