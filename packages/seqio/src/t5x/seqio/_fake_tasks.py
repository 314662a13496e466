"""The fake data and tasks of ``seqio.test_utils.FakeTaskTest``, built at test time.

seqio's fixture reads a SentencePiece model and cache metadata bundled with
seqio. We ship neither: the model is found in a seqio ``test_data`` folder when
one is around (``$SEQIO_TEST_DATA_DIR``, or next to the running test file), and
otherwise a small model is trained on the fake texts. The tokenized fake
datasets are derived by encoding the fake texts with that model, so tasks
compare against the ids of whichever model is in use; the cache metadata is
written when it is missing.
"""

from __future__ import annotations

import copy
import functools
import inspect
import os
import shutil
import sys
import tempfile
import unittest
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
import tensorflow as tf

DEFAULT_SEQUENCE_LENGTH = {"inputs": 13, "targets": 13}
_SP_MODEL = os.path.join("sentencepiece", "sentencepiece.model")
_FOUND_TEST_DATA_DIR: str | None = None

# The raw fake examples (facts of seqio's fixture): text, plus n-d and ragged features.
_TRAIN: list[tuple[str, str, list[list[list[int]]]]] = [
    ("this", "is a test", [[[3, 1], [4, 1]], [[5, 9], [2, 6]]]),
    ("that", "was a test", [[[3, 1]], [[4, 1], [5, 9]]]),
    ("those", "were tests", [[], []]),
]
_VALIDATION: list[tuple[Any, ...]] = [
    (0, (100,), "a", ("a1", "a2"), "this", "is a validation", [[[6, 2]], [[9, 0], [3, 3]]]),
    (1, (200, 201), "b", ("b1",), "that", "was another validation", [[[0, 9], [8, 7]], [[2, 4], [6, 5]]]),
]


def _ragged(rows: Sequence[Sequence[Sequence[int]]]) -> tf.RaggedTensor:
    """A [2, None, 2] int32 ragged tensor with one ragged dimension."""
    values = [pair for row in rows for pair in row]
    splits = np.cumsum([0] + [len(row) for row in rows])
    flat = tf.constant(values, tf.int32) if values else tf.zeros([0, 2], tf.int32)
    return tf.RaggedTensor.from_row_splits(flat, tf.constant(splits, tf.int64), validate=True)


def raw_examples() -> dict[str, list[dict[str, Any]]]:
    train = [
        {
            "prefix": p,
            "suffix": s,
            "2d_feature": ((1, 2, 3),),
            "3d_feature": (((1, 2, 3), (4, 5, 6)),),
            "ragged_feature": _ragged(r),
        }
        for p, s, r in _TRAIN
    ]
    validation = [
        {
            "idx": idx,
            "idxs": idxs,
            "id": id_,
            "ids": ids,
            "prefix": p,
            "suffix": s,
            "2d_feature": ((3, 2, 1),),
            "3d_feature": (((6, 5, 4), (3, 2, 1)),),
            "ragged_feature": _ragged(r),
        }
        for idx, idxs, id_, ids, p, s, r in _VALIDATION
    ]
    return {"train": train, "validation": validation}


# ---------------------------------------------------------------- the SentencePiece model


def _caller_test_data_dirs() -> list[str]:
    dirs = [os.environ.get("SEQIO_TEST_DATA_DIR", "")]
    for frame in inspect.stack(context=0):
        here = os.path.dirname(os.path.abspath(frame.filename))
        dirs += [os.path.join(here, "test_data"), os.path.join(here, "seqio", "test_data")]
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None) or ""
        base = os.path.basename(path)
        if base.endswith("_test.py") or base.startswith("test_"):
            dirs.append(os.path.join(os.path.dirname(os.path.abspath(path)), "test_data"))
    dirs += [os.path.join(os.getcwd(), "test_data"), os.path.join(os.getcwd(), "seqio", "test_data")]
    return [d for d in dirs if d]


@functools.lru_cache(maxsize=1)
def _trained_model_dir() -> str:
    """A test-data folder holding a small SentencePiece model trained on the fake texts."""
    import sentencepiece

    folder = tempfile.mkdtemp(prefix="t5x_seqio_test_data_")
    os.makedirs(os.path.join(folder, "sentencepiece"))
    texts = [f"complete: {p}" for p, _, _ in _TRAIN] + [s for _, s, _ in _TRAIN]
    texts += [v[4] for v in _VALIDATION] + [v[5] for v in _VALIDATION]
    corpus = os.path.join(folder, "corpus.txt")
    with open(corpus, "w", encoding="utf-8") as f:
        f.write("\n".join(texts * 20 + ["this is a test", "that was another test"] * 20))
    sentencepiece.SentencePieceTrainer.train(
        input=corpus,
        model_prefix=os.path.join(folder, "sentencepiece", "sentencepiece"),
        vocab_size=26,
        model_type="unigram",
        character_coverage=1.0,
        pad_id=0,
        eos_id=1,
        unk_id=2,
        bos_id=-1,
        hard_vocab_limit=False,
        num_threads=1,
        minloglevel=2,
    )
    return folder


def test_data_dir() -> str:
    """seqio's ``test_data`` folder when one is found, else a folder with a model trained here."""
    global _FOUND_TEST_DATA_DIR
    if _FOUND_TEST_DATA_DIR is None:
        for d in _caller_test_data_dirs():
            if os.path.exists(os.path.join(d, _SP_MODEL)):
                _FOUND_TEST_DATA_DIR = d  # later calls may come from frames that cannot see it
                break
    return _FOUND_TEST_DATA_DIR or _trained_model_dir()


def sentencepiece_model_file() -> str:
    return os.path.join(test_data_dir(), _SP_MODEL)


# ---------------------------------------------------------------- derived datasets


@functools.lru_cache(maxsize=4)
def _datasets(model_file: str) -> dict[str, dict[str, list[dict[str, Any]]]]:
    from t5x.seqio import vocabularies

    vocab = vocabularies.SentencePieceVocabulary(model_file)
    raw = raw_examples()

    def tokenized(ex: Mapping[str, Any], suffix: str = "_pretokenized") -> dict[str, Any]:
        out = {k: ex[k] for k in ("idx", "idxs", "id", "ids") if k in ex}
        inputs = "complete: " + ex["prefix"]
        out["inputs"] = tuple(vocab.encode(inputs))
        out["inputs" + suffix] = inputs
        out["targets"] = tuple(vocab.encode(ex["suffix"]))
        out["targets" + suffix] = ex["suffix"]
        return out

    def token_preprocessed(ex: Mapping[str, Any]) -> dict[str, Any]:
        out = tokenized(ex)
        out["inputs"] = tuple(50 if t > 15 else t for t in out["inputs"])  # test_token_preprocessor's rule
        return out

    def with_features(ex: Mapping[str, Any], names: Sequence[str]) -> dict[str, Any]:
        out = token_preprocessed(ex)
        for name in names:
            out[name] = ex[name]
            out[name + "_pretokenized"] = ex[name]
        return out

    splits = ("train", "validation")
    return {
        "input": raw,
        "tokenized": {s: [tokenized(ex) for ex in raw[s]] for s in splits},
        "plaintext": {"train": [tokenized(ex, "_plaintext") for ex in raw["train"]]},
        "token_preprocessed": {s: [token_preprocessed(ex) for ex in raw[s]] for s in splits},
        "token_preprocessed_ndfeatures": {
            s: [with_features(ex, ("2d_feature", "3d_feature")) for ex in raw[s]] for s in splits
        },
        "token_preprocessed_ragged_features": {
            s: [with_features(ex, ("ragged_feature",)) for ex in raw[s]] for s in splits
        },
    }


def fake_datasets() -> dict[str, dict[str, list[dict[str, Any]]]]:
    return _datasets(sentencepiece_model_file())


def get_fake_dataset(
    split: str,
    shuffle_files: bool = False,
    seed: int | None = None,
    shard_info: Any = None,
    ndfeatures: bool = False,
    ragged_features: bool = False,
) -> tf.data.Dataset:
    """The raw fake examples of ``split`` (text features; n-d / ragged ones on request)."""
    del shuffle_files, seed
    signature: dict[str, Any] = {
        "prefix": tf.TensorSpec([], tf.string),
        "suffix": tf.TensorSpec([], tf.string),
    }
    if split == "validation":
        signature.update(
            idx=tf.TensorSpec([], tf.int64),
            idxs=tf.TensorSpec([None], tf.int32),
            id=tf.TensorSpec([], tf.string),
            ids=tf.TensorSpec([None], tf.string),
        )
    if ndfeatures:
        signature["2d_feature"] = tf.TensorSpec([None, 3], tf.int32)
        signature["3d_feature"] = tf.TensorSpec([None, 2, 3], tf.int32)
    if ragged_features:
        signature["ragged_feature"] = tf.RaggedTensorSpec([2, None, 2], tf.int32, ragged_rank=1)
    examples = [{k: ex[k] for k in signature} for ex in raw_examples()[split]]
    ds = tf.data.Dataset.from_generator(lambda: iter(examples), output_signature=signature)
    if shard_info:
        ds = ds.shard(shard_info.num_shards, shard_info.index)
    return ds


# ---------------------------------------------------------------- comparing a task to the fake data


def _comparable(value: Any) -> Any:
    if isinstance(value, tf.RaggedTensor):
        value = value.to_list()
    elif isinstance(value, tf.Tensor):
        value = value.numpy()
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        return tuple(_comparable(v) for v in value)
    if isinstance(value, bytes):
        return value.decode("utf-8")
    if isinstance(value, np.generic):
        return value.item()
    return value


def _example_key(example: Mapping[str, Any]) -> tuple:
    return tuple(sorted((k, _comparable(v)) for k, v in example.items()))


class _Checks(unittest.TestCase):
    def runTest(self) -> None:  # a TestCase instance needs one to exist
        pass


_CHECKS = _Checks()


def assert_matches_fake_dataset(
    ds: tf.data.Dataset,
    split: str,
    features: Mapping[str, Any],
    sequence_length: Mapping[str, int] | None,
    token_preprocessed: bool = False,
    ndfeatures: bool = False,
    ragged_features: bool = False,
) -> None:
    """Asserts ``ds`` holds the fake ``split`` as a tokenized task with ``features`` gives it (any order)."""
    if ndfeatures and ragged_features:
        raise ValueError("give at most one of ndfeatures and ragged_features")
    kind = "token_preprocessed" if token_preprocessed else "tokenized"
    if ndfeatures:
        kind = "token_preprocessed_ndfeatures"
    if ragged_features:
        kind = "token_preprocessed_ragged_features"
    expected = copy.deepcopy([dict(ex) for ex in fake_datasets()[kind][split]])
    for name, feature in features.items():
        for ex in expected:
            if sequence_length and name in sequence_length:
                ex[name] = ex[name][: sequence_length[name] - int(feature.add_eos)]
            if feature.add_eos:
                ex[name] = (*ex[name], feature.vocabulary.eos_id)
    shapes: dict[str, list[int | None]] = {
        "inputs": [None], "targets": [None], "inputs_pretokenized": [], "targets_pretokenized": [],
    }  # fmt: skip
    dtypes: dict[str, tf.DType] = {
        "inputs": tf.int32, "targets": tf.int32, "inputs_pretokenized": tf.string, "targets_pretokenized": tf.string,
    }  # fmt: skip
    if split == "validation":
        shapes.update(id=[], ids=[None], idx=[], idxs=[None])
        dtypes.update(id=tf.string, ids=tf.string, idx=tf.int64, idxs=tf.int32)
    extra: dict[str, list[int | None]] = {}
    if ndfeatures:
        extra = {"2d_feature": [None, 3], "3d_feature": [None, 2, 3]}
    if ragged_features:
        extra = {"ragged_feature": [None, None, 2]}
    for name, shape in extra.items():
        for key in (name, name + "_pretokenized"):
            shapes[key], dtypes[key] = shape, tf.int32
    for name, feature in features.items():
        dtypes[name] = feature.dtype
    _CHECKS.assertDictEqual(shapes, {k: v.shape.as_list() for k, v in ds.element_spec.items()})  # noqa: PT009
    _CHECKS.assertDictEqual(dtypes, {k: v.dtype for k, v in ds.element_spec.items()})  # noqa: PT009
    _CHECKS.assertCountEqual([_example_key(ex) for ex in expected], [_example_key(ex) for ex in ds])  # noqa: PT009


# ---------------------------------------------------------------- files and the fake TFDS dataset


def _tfexample(example: Mapping[str, Any]) -> bytes:
    from t5x.seqio import utils

    return utils.dict_to_tfexample(dict(example)).SerializeToString()


def write_shards(
    path: str, examples: Sequence[Mapping[str, Any]], shard_sizes: Sequence[int], kind: str
) -> None:
    """Writes ``examples`` as ``<path>-0000i-of-0000n`` shards: TFRecords of tf.Examples, or TSV lines."""
    bounds = np.cumsum([0, *shard_sizes])
    for i in range(len(shard_sizes)):
        part = examples[bounds[i] : bounds[i + 1]]
        shard = f"{path}-{i:05d}-of-{len(shard_sizes):05d}"
        tf.io.gfile.makedirs(os.path.dirname(shard))
        if kind == "tfrecord":
            with tf.io.TFRecordWriter(shard) as writer:
                for ex in part:
                    writer.write(_tfexample(ex))
        else:
            with tf.io.gfile.GFile(shard, "w") as f:
                f.write("prefix\tsuffix\n")
                for ex in part:
                    f.write(f"{ex['prefix']}\t{ex['suffix']}\n")


def write_cache_metadata(
    task_dir: str, split: str, examples: Sequence[Mapping[str, Any]], num_shards: int
) -> None:
    """Writes seqio's ``info``/``stats`` JSON and the ``COMPLETED`` marker when they are missing."""
    import json

    info = os.path.join(task_dir, f"info.{split}.json")
    if not tf.io.gfile.exists(info):
        specs: dict[str, dict[str, Any]] = {}
        for name, value in examples[0].items():
            if isinstance(value, str):
                specs[name] = {"dtype": "string", "shape": []}
            elif isinstance(value, tuple):
                is_text = bool(value) and isinstance(value[0], str)
                specs[name] = {"dtype": "string" if is_text else "int32", "shape": [None]}
            else:
                specs[name] = {"dtype": "int64", "shape": []}
        tf.io.gfile.makedirs(task_dir)
        with tf.io.gfile.GFile(info, "w") as f:
            json.dump({"features": specs, "num_shards": num_shards, "seqio_version": "0.0.0"}, f)
    stats = os.path.join(task_dir, f"stats.{split}.json")
    if not tf.io.gfile.exists(stats):
        counts: dict[str, int] = {"examples": len(examples)}
        for name in ("inputs", "targets"):
            lengths = [len(ex[name]) for ex in examples if name in ex]
            counts[f"{name}_tokens"] = sum(lengths)
            counts[f"{name}_max_tokens"] = max(lengths, default=0)
        with tf.io.gfile.GFile(stats, "w") as f:
            json.dump(counts, f)
    marker = os.path.join(task_dir, "COMPLETED")
    if not tf.io.gfile.exists(marker):
        with tf.io.gfile.GFile(marker, "w") as f:
            f.write("")


class FakeTfdsInfo:
    """What the fake TFDS dataset's ``info`` answers."""

    splits: ClassVar[dict[str, None]] = {"train": None, "validation": None}
    features: ClassVar[dict[str, Any]] = {}
    description = "This is a fake TFDS dataset."
    version = "0.0.0"
    homepage = "http://data.org/fake"
    config_name = None


class FakeLazyTfds:
    """Stands in for ``LazyTfdsLoader`` in FakeTaskTest: serves the fake examples as TFDS would."""

    name = "fake:0.0.0"
    tfds_splits = None
    split_map = None
    data_dir = "/tfds"
    info = FakeTfdsInfo()

    _FILES: ClassVar[dict[str, list[dict[str, Any]]]] = {
        "train": [{"filename": f"train.tfrecord-{i:05d}-of-00002", "skip": 0, "take": -1} for i in range(2)],
        "validation": [{"filename": "validation.tfrecord-00000-of-00001", "skip": 0, "take": -1}],
    }

    def resolved_tfds_name(self, split: str | None = None) -> str:
        return self.name

    def load(
        self, split: str, shuffle_files: bool = False, seed: int | None = None, shard_info: Any = None
    ) -> Any:
        return get_fake_dataset(split, shuffle_files, seed, shard_info)

    def load_shard(self, shard_instruction: Mapping[str, Any], shuffle_files: bool, seed: int | None) -> Any:
        name = shard_instruction["filename"]
        if "train" not in name:
            return get_fake_dataset("validation")
        ds = get_fake_dataset("train")
        return ds.take(2) if name.endswith("00000-of-00002") else ds.skip(2)

    def files(self, split: str) -> list[dict[str, Any]] | None:
        return self._FILES.get(split)

    def size(self, split: str) -> int:
        return 30 if split == "train" else 10

    def set_decoders(self, decoders: Any) -> None:
        del decoders


def copy_test_data(into: str) -> str:
    """Copies a seqio ``test_data`` folder (when one is found) to ``<into>/test_data``, writable."""
    target = os.path.join(into, "test_data")
    source = test_data_dir()
    shutil.copytree(source, target, dirs_exist_ok=True)
    for root, dirs, _ in os.walk(target):
        for d in [*dirs, ""]:
            os.chmod(os.path.join(root, d), 0o777)
    return target
