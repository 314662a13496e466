"""seqio's Beam transforms (``seqio.beam_utils``): preprocess a task and write it, its info and stats.

Only this module of the facade imports Apache Beam (install ``t5x-seqio[beam]``).
These follow seqio's conventions (per-shard md5 seeds, ``seqio.dict_to_tfexample``
records, seqio's stats); ``t5x.tasks``' own cache pipeline writes its own layout.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import apache_beam as beam
import numpy as np
import tensorflow as tf

from t5x import seqio

_log = logging.getLogger("t5x.seqio.beam_utils")

PROVENANCE_PREFIX = "provenance/"
TASK_PROVENANCE_KEY = PROVENANCE_PREFIX + "task"
SOURCE_SHARD_PROVENANCE_KEY = PROVENANCE_PREFIX + "source_shard"
SOURCE_SHARD_ID_PROVENANCE_KEY = PROVENANCE_PREFIX + "source_shard_index"
ID_WITHIN_SHARD_PROVENANCE_KEY = PROVENANCE_PREFIX + "index_within_shard"
PREPROCESSORS_SEED_PROVENANCE_KEY = PROVENANCE_PREFIX + "preprocessors_seed"
PROVENANCE_KEYS = [
    TASK_PROVENANCE_KEY,
    SOURCE_SHARD_PROVENANCE_KEY,
    SOURCE_SHARD_ID_PROVENANCE_KEY,
    ID_WITHIN_SHARD_PROVENANCE_KEY,
    PREPROCESSORS_SEED_PROVENANCE_KEY,
]
_INT64_MAX = 2**63 - 1


def shard_seed(task_name: str, shard_index: int, seed: int | None) -> int:
    """The seed of one source shard's preprocessors, as seqio derives it.

    An md5 of the task name and shard index (little-endian), plus the user's
    seed; cut to 7 bytes when that overflows int64, so caches written by seqio
    and by this module see the same random preprocessing.
    """
    digest = hashlib.md5(f"{task_name}shard{shard_index}".encode()).digest()
    value = int.from_bytes(digest, "little") + (seed or 0)
    if value > _INT64_MAX:
        value = int.from_bytes(digest[:7], "little") + (seed or 0)
    return value % _INT64_MAX


def _import_modules(modules: Iterable[str]) -> None:
    for module in modules:
        if module:
            importlib.import_module(module)


class PreprocessTask(beam.PTransform):
    """A task's examples after its pre-cache preprocessors, one Beam work item per source shard.

    The output is a PCollection of dicts of ``tf.Tensor`` values (as iterating the
    dataset gives them); with ``add_provenance`` each also holds the task, the
    shard's name and index, the position within the shard and the seed.
    """

    def __init__(
        self,
        task: seqio.Task,
        split: str,
        *,
        preprocessors_seed: int | None = None,
        setup_fn: Callable[[], None] = lambda: None,
        modules_to_import: Sequence[str] = (),
        add_provenance: bool = False,
        tfds_data_dir: str | None = None,
    ):
        super().__init__()
        self._task_name = task.name
        self._split = split
        self._seed = preprocessors_seed
        self._setup_fn = setup_fn
        self._modules = tuple(modules_to_import)
        self._add_provenance = add_provenance
        self._tfds_data_dir = tfds_data_dir
        self.shards = list(enumerate(task.source.list_shards(split)))
        if not self.shards:
            raise FileNotFoundError(f"No shards found for task {task.name!r}, split {split!r}")

    def _examples(self, shard: tuple[int, str]) -> Iterator[dict[str, Any]]:
        # Runs on a worker: the task is looked up there (after importing the modules that register it).
        self._setup_fn()
        _import_modules(self._modules)
        if self._tfds_data_dir:
            seqio.set_tfds_data_dir_override(self._tfds_data_dir)
        task = seqio.TaskRegistry.get(self._task_name)
        index, name = shard
        beam.metrics.Metrics.counter(f"{self._task_name}_{self._split}", "input-shards").inc()
        seed = shard_seed(self._task_name, index, self._seed)
        ds = task.source.get_dataset(
            split=self._split,
            shard_info=seqio.ShardInfo(index=index, num_shards=len(self.shards)),
            shuffle=False,
            seed=seed,
        )
        ds = task.preprocess_precache(ds, seed=seed)
        examples = beam.metrics.Metrics.counter(f"{self._task_name}_{self._split}", "examples")
        for position, ex in enumerate(ds):
            if self._add_provenance:
                ex = dict(ex)
                ex[TASK_PROVENANCE_KEY] = self._task_name
                ex[SOURCE_SHARD_PROVENANCE_KEY] = name
                ex[SOURCE_SHARD_ID_PROVENANCE_KEY] = index
                ex[ID_WITHIN_SHARD_PROVENANCE_KEY] = position
                if self._seed:
                    ex[PREPROCESSORS_SEED_PROVENANCE_KEY] = self._seed
            examples.inc()
            yield ex

    def expand(self, pipeline: Any) -> Any:
        return (
            pipeline
            | "create_shards" >> beam.Create(self.shards)
            | "emit_examples" >> beam.FlatMap(self._examples)
        )


class WriteExampleTfRecord(beam.PTransform):
    """Writes example dicts as TFRecord files of ``tf.train.Example`` (seqio's cache encoding).

    ``output_path`` is the file prefix (Beam appends ``-SSSSS-of-NNNNN``);
    ``num_shards=None`` lets the runner choose.
    """

    def __init__(self, output_path: str, num_shards: int | None = None):
        super().__init__()
        self._output_path = output_path
        self._num_shards = num_shards

    def expand(self, pcoll: Any) -> Any:
        sink = beam.io.tfrecordio.WriteToTFRecord(
            self._output_path,
            num_shards=self._num_shards or 0,
            coder=beam.coders.ProtoCoder(tf.train.Example),
        )
        return pcoll | beam.Map(seqio.dict_to_tfexample) | beam.Reshuffle() | sink


class WriteJson(beam.PTransform):
    """Writes each element as JSON into the single file ``output_path`` (no shard suffix).

    ``prettify`` sorts keys and indents; with several elements the file holds
    one JSON document after another (pass ``prettify=False`` for JSON lines).
    """

    def __init__(self, output_path: str, prettify: bool | None = True):
        super().__init__()
        self._output_path = output_path
        self._prettify = prettify

    def _dumps(self, value: Any) -> str:
        return json.dumps(value, sort_keys=True, indent=2) if self._prettify else json.dumps(value)

    def expand(self, pcoll: Any) -> Any:
        sink = beam.io.WriteToText(self._output_path, num_shards=1, shard_name_template="")
        return pcoll | beam.Map(self._dumps) | "write_info" >> sink


def _info_of(sample: list[dict[str, Any]], num_shards: int, exclude_provenance: bool) -> dict[str, Any]:
    if not sample:
        return {}
    features = {}
    for key, value in sample[0].items():
        if exclude_provenance and key.startswith(PROVENANCE_PREFIX):
            continue
        tensor = value if isinstance(value, tf.RaggedTensor) else tf.constant(value)
        shape = tensor.shape.as_list()
        # The first dimension varies between examples; deeper ones are kept.
        features[key] = {"shape": [None, *shape[1:]] if shape else shape, "dtype": tensor.dtype.name}
    return {"num_shards": num_shards, "features": features, "seqio_version": seqio.__version__}


class GetInfo(beam.PTransform):
    """The ``info`` dict a cache is read with: ``num_shards``, each feature's dtype and shape, seqio version.

    Shapes come from one example, with the first dimension as ``None``.
    """

    def __init__(self, num_shards: int, exclude_provenance: bool = True):
        super().__init__()
        self._num_shards = num_shards
        self._exclude_provenance = exclude_provenance

    def expand(self, pcoll: Any) -> Any:
        num_shards, exclude = self._num_shards, self._exclude_provenance
        return (
            pcoll
            | beam.combiners.Sample.FixedSizeGlobally(1)
            | beam.Map(_info_of, num_shards=num_shards, exclude_provenance=exclude)
        )


def _as_numpy(value: Any) -> Any:
    return value.numpy() if isinstance(value, tf.Tensor) else value


class _CountTokens(beam.DoFn):
    """``(<feature>_tokens, n)`` per integer feature: tokens that are neither EOS nor padding."""

    def __init__(self, output_features: Mapping[str, seqio.Feature]):
        self._features = output_features

    def process(self, ex: Mapping[str, Any]) -> Iterator[tuple[str, int]]:
        for name, feature in self._features.items():
            value = _as_numpy(ex.get(name))
            if not isinstance(value, np.ndarray) or value.dtype not in (np.int32, np.int64):
                continue
            valid = np.ones_like(value, dtype=bool)
            for special in (feature.vocabulary.eos_id, feature.vocabulary.pad_id):
                if special is not None:
                    valid &= value != special
            yield f"{name}_tokens", int(valid.sum())


class _CountCharacters(beam.DoFn):
    """``(<feature>_chars, n)``: characters of a string feature, or of a rank-1 SentencePiece feature decoded."""

    def __init__(self, output_features: Mapping[str, seqio.Feature]):
        self._features = output_features

    def process(self, ex: Mapping[str, Any]) -> Iterator[tuple[str, int]]:
        for name, feature in self._features.items():
            value = _as_numpy(ex.get(name))
            if (
                isinstance(value, np.ndarray)
                and value.dtype in (np.int32, np.int64)
                and feature.rank == 1
                and isinstance(feature.vocabulary, seqio.SentencePieceVocabulary)
            ):
                ids = np.abs(value.astype(np.int32))
                text = feature.vocabulary.decode_tf(tf.constant(ids)).numpy().decode("utf-8")
            elif isinstance(value, bytes):
                text = value.decode("utf-8")
            else:
                continue
            yield f"{name}_chars", len(text)


def _merge_disjoint(dicts: Iterable[dict[str, Any]]) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for d in dicts:
        clash = set(merged) & set(d)
        if clash:
            raise ValueError(f"GetStats: statistics {sorted(clash)} computed twice")
        merged.update(d)
    return merged


class GetStats(beam.PTransform):
    """seqio's cache statistics of a PCollection of examples, as one dict.

    ``examples``; per integer output feature ``<name>_tokens`` (sum) and
    ``<name>_max_tokens`` (max), counting neither EOS nor padding; with
    ``enable_char_counts`` also ``<name>_chars``; with ``task_ids`` that mapping
    under ``task_ids``.
    """

    def __init__(
        self,
        output_features: Mapping[str, seqio.Feature],
        task_ids: Mapping[str, Any] | None = None,
        enable_char_counts: bool = False,
    ):
        super().__init__()
        self._features = output_features
        self._task_ids = {k: int(v) for k, v in (task_ids or {}).items()}
        self._chars = enable_char_counts

    def expand(self, pcoll: Any) -> Any:
        stats = [
            pcoll
            | "count_examples" >> beam.combiners.Count.Globally()
            | "key_example_counts" >> beam.Map(lambda n: ("examples", n))
            | "example_count_dict" >> beam.combiners.ToDict()
        ]
        tokens = pcoll | "count_tokens" >> beam.ParDo(_CountTokens(self._features))
        stats.append(
            tokens | "sum_tokens" >> beam.CombinePerKey(sum) | "token_count_dict" >> beam.combiners.ToDict()
        )
        stats.append(
            tokens
            | "max_tokens" >> beam.CombinePerKey(max)
            | "rename_max_stat" >> beam.Map(lambda kv: (kv[0].replace("tokens", "max_tokens"), kv[1]))
            | "token_max_dict" >> beam.combiners.ToDict()
        )
        if self._chars:
            stats.append(
                pcoll
                | "count_characters" >> beam.ParDo(_CountCharacters(self._features))
                | "sum_characters" >> beam.CombinePerKey(sum)
                | "character_length_dict" >> beam.combiners.ToDict()
            )
        if self._task_ids:
            task_ids = {"task_ids": self._task_ids}
            stats.append(
                pcoll
                | "sample_for_task_ids" >> beam.combiners.Sample.FixedSizeGlobally(1)
                | "create_task_ids" >> beam.Map(lambda _: task_ids)
            )
        return (
            stats
            | "flatten_counts" >> beam.Flatten()
            | "merge_stats" >> beam.CombineGlobally(_merge_disjoint)
        )
