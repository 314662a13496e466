# ruff: noqa: PT028  (seqio names these helpers test_*; they are not pytest tests)
"""``seqio.test_utils``: the helpers task authors test their tasks with.

``assert_dataset``, ``create_default_dataset``, ``DataInjector``,
``test_preprocessing[_single]``, ``test_postprocessing``, ``test_task``,
``FakeTaskTest`` / ``FakeMixtureTest`` (seqio's fake tasks and sources on fake
data, with clean registries), ``get_fake_dataset``, the toy preprocessors
seqio's tests use, ``MockVocabulary``, ``sentencepiece_vocab``.
seqio's bundled test data is not shipped: the SentencePiece model is read from
a seqio ``test_data`` folder when one is found (``$SEQIO_TEST_DATA_DIR``, or
next to the running test file), else a small one is trained on the fake texts
(token ids then differ from seqio's model). See ``_fake_tasks``.
"""

from __future__ import annotations

import os
import unittest
import unittest.mock
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

from t5x.seqio import _fake_tasks, dataset_providers, feature_converters, preprocessors, utils, vocabularies
from t5x.seqio.evaluation import Evaluator

TaskRegistry = dataset_providers.TaskRegistry
MixtureRegistry = dataset_providers.MixtureRegistry


def _as_bytes(value: Any) -> Any:
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (list, tuple)):
        return type(value)(_as_bytes(v) for v in value)
    return value


def _numpy(value: Any) -> Any:
    if isinstance(value, tf.RaggedTensor):
        return value.to_list()
    if isinstance(value, tf.SparseTensor):
        return tf.sparse.to_dense(value).numpy()
    if isinstance(value, tf.Tensor):
        return value.numpy()
    if isinstance(value, Mapping):
        return {k: _numpy(v) for k, v in value.items()}
    return value


def _compare(
    actual: Mapping[str, Any], expected: Mapping[str, Any], rtol: float, atol: float, where: str
) -> None:
    if set(actual) != set(expected):
        raise AssertionError(f"{where}: features {sorted(actual)} != expected {sorted(expected)}")
    for key, value in actual.items():
        want = expected[key]
        if isinstance(value, Mapping):
            _compare(value, want, rtol, atol, f"{where}[{key!r}]")
        elif isinstance(value, list):
            np.testing.assert_array_equal(
                np.array(value, dtype=object), np.array(_as_bytes(want), dtype=object), f"{where}[{key!r}]"
            )
        elif isinstance(value, (np.floating, np.ndarray)) and np.issubdtype(
            np.asarray(value).dtype, np.floating
        ):
            np.testing.assert_allclose(value, want, rtol=rtol, atol=atol, err_msg=f"{where}[{key!r}]")
        else:
            np.testing.assert_array_equal(value, _as_bytes(want), f"{where}[{key!r}]")


def assert_dataset(
    dataset: tf.data.Dataset,
    expected: Mapping[str, Any] | Sequence[Mapping[str, Any]],
    expected_dtypes: Mapping[str, tf.DType] | None = None,
    rtol: float = 1e-7,
    atol: float = 0,
) -> None:
    """Asserts that ``dataset`` holds exactly the ``expected`` examples, in order (strings compare as bytes)."""
    if not isinstance(expected, list):
        expected = [expected]  # type: ignore[list-item]
    actual = [_numpy(ex) for ex in dataset]
    if len(actual) != len(expected):
        raise AssertionError(f"the dataset has {len(actual)} examples, expected {len(expected)}")
    for i, (a, e) in enumerate(zip(actual, expected)):
        _compare(a, e, rtol, atol, f"example {i}")
    if expected_dtypes:
        got = {k: dataset.element_spec[k].dtype for k in expected_dtypes}
        if got != dict(expected_dtypes):
            raise AssertionError(f"dtypes {got} != expected {dict(expected_dtypes)}")


def assert_datasets_eq(dataset1: tf.data.Dataset, dataset2: tf.data.Dataset) -> None:
    """Asserts two datasets hold the same examples in the same order."""
    assert_dataset(dataset1, [_numpy(ex) for ex in dataset2])


def assert_datasets_neq(dataset1: tf.data.Dataset, dataset2: tf.data.Dataset) -> None:
    """Asserts two datasets differ."""
    try:
        assert_datasets_eq(dataset1, dataset2)
    except AssertionError:
        return
    raise AssertionError("the datasets are equal")


def create_default_dataset(
    x: Sequence[Mapping[str, Any]],
    feature_names: Sequence[str] = ("inputs", "targets"),
    output_types: Mapping[str, tf.DType] | None = None,
    output_shapes: Mapping[str, Any] | None = None,
) -> tf.data.Dataset:
    """A dataset of the examples ``x``; features default to int32 of shape ``[None]``."""
    types = output_types or {name: tf.int32 for name in feature_names}
    shapes = output_shapes or {name: [None] for name in feature_names}
    signature = {k: tf.TensorSpec(shapes[k], types[k]) for k in types}
    return tf.data.Dataset.from_generator(lambda: iter(x), output_signature=signature)


def test_text_preprocessor(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """``{"prefix", "suffix"}`` -> ``{"inputs": "complete: " + prefix, "targets": suffix}``."""

    def fn(ex: Mapping[str, Any]) -> dict[str, Any]:
        out = {k: v for k, v in ex.items() if k not in ("prefix", "suffix")}
        out["inputs"] = tf.strings.join(["complete: ", ex["prefix"]])
        out["targets"] = ex["suffix"]
        return out

    return dataset.map(fn, num_parallel_calls=tf.data.AUTOTUNE)


def split_tsv_preprocessor(
    dataset: tf.data.Dataset, field_names: Sequence[str] = ("prefix", "suffix")
) -> tf.data.Dataset:
    """Splits tab-separated lines into named string features."""

    def parse(line: tf.Tensor) -> dict[str, tf.Tensor]:
        fields = tf.io.decode_csv(
            line, record_defaults=[""] * len(field_names), field_delim="\t", use_quote_delim=False
        )
        return dict(zip(field_names, fields))

    return dataset.map(parse, num_parallel_calls=tf.data.AUTOTUNE)


def test_token_preprocessor(
    dataset: tf.data.Dataset, output_features: Any, sequence_length: Any
) -> tf.data.Dataset:
    """Replaces every ``inputs`` token above 15 with 50."""
    del output_features, sequence_length

    def fn(ex: Mapping[str, Any]) -> dict[str, Any]:
        out = dict(ex)
        out["inputs"] = tf.where(ex["inputs"] > 15, tf.constant(50, ex["inputs"].dtype), ex["inputs"])
        return out

    return dataset.map(fn, num_parallel_calls=tf.data.AUTOTUNE)


@utils.map_over_dataset(num_seeds=1)
def random_token_preprocessor(ex: Mapping[str, Any], seed: Any, sequence_length: Mapping[str, int]) -> dict:
    """Rolls each listed feature's tokens by a random shift."""
    out = dict(ex)
    for feat in sequence_length:
        tokens = ex[feat]
        shift = tf.random.stateless_uniform([], maxval=tf.size(tokens), dtype=tf.int32, seed=seed)
        out[feat] = tf.roll(tokens, shift=shift, axis=0)
    return out


def token_preprocessor_no_sequence_length(dataset: tf.data.Dataset, output_features: Any) -> tf.data.Dataset:
    return test_token_preprocessor(dataset, output_features, sequence_length=None)


class DataInjector:
    """Within the ``with`` block, ``task_name`` reads ``per_split_data[split]`` (one example per split)."""

    def __init__(self, task_name: str, per_split_data: Mapping[str, Mapping[str, Any]]):
        self._task = dataset_providers.get_mixture_or_task(task_name)
        self.per_split_data = per_split_data
        self._saved_source = self._task._source
        self._mock_source: Any = None

    def __enter__(self) -> DataInjector:
        def dataset_fn(split: str, shuffle_files: bool, seed: int | None = None) -> tf.data.Dataset:
            del shuffle_files, seed
            return tf.data.Dataset.from_tensors(self.per_split_data[split])

        self._mock_source = dataset_providers.FunctionDataSource(dataset_fn, splits=list(self.per_split_data))
        self._task._source = self._mock_source
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._task._source is not self._mock_source:
            raise RuntimeError("the task's source was changed inside the DataInjector block and not restored")
        self._task._source = self._saved_source


def assert_dict_values_equal(a: Any, b: Any) -> None:
    """Asserts two nested dicts hold equal arrays."""
    tf.nest.map_structure(np.testing.assert_equal, a, b)


def assert_dict_contains(expected: Mapping[str, Any], actual: Mapping[str, Any]) -> None:
    """Asserts ``actual`` has every item of ``expected``."""
    for k, v in expected.items():
        np.testing.assert_equal(actual[k], v)


def encode_str(task_name: str, s: str, output_feature_name: str = "targets") -> Sequence[int]:
    task = dataset_providers.get_mixture_or_task(task_name)
    return task.output_features[output_feature_name].vocabulary.encode(s)


def create_prediction(task_name: str, s: str, output_feature_name: str = "targets") -> list[tuple[int, Any]]:
    return [(0, encode_str(task_name, s, output_feature_name))]


def test_preprocessing(
    task_name: str,
    raw_data: Mapping[str, Mapping[str, Any]],
    seed: int | None = None,
    sequence_length: Mapping[str, int] | None = None,
) -> Iterator[Mapping[str, Any]]:
    """The task's preprocessed examples of ``raw_data`` (one split, one example) as numpy."""
    if len(raw_data) > 1:
        raise ValueError("test_preprocessing supports a single split in raw_data")
    with DataInjector(task_name, raw_data):
        split = next(iter(raw_data))
        task = dataset_providers.get_mixture_or_task(task_name)
        return task.get_dataset(
            sequence_length=sequence_length, split=split, shuffle=False, seed=seed
        ).as_numpy_iterator()


def test_preprocessing_single(
    task_name: str,
    raw_data: Mapping[str, Mapping[str, Any]],
    seed: int | None = None,
    sequence_length: Mapping[str, int] | None = None,
) -> Mapping[str, Any]:
    """Like ``test_preprocessing``, asserting that exactly one example comes out."""
    iterator = test_preprocessing(task_name, raw_data, seed=seed, sequence_length=sequence_length)
    item = next(iterator)
    if next(iterator, None) is not None:
        raise AssertionError("Expected dataset with a single item, but more were generated.")
    return item


def test_postprocessing(
    task_name: str,
    raw_data: Mapping[str, Mapping[str, Any]],
    target_feature_name: str = "targets",
    predict_output: Sequence[str] | None = None,
    score_output: Sequence[float] | None = None,
    feature_encoder: Any = None,
    sequence_length: Mapping[str, int] | None = None,
) -> Mapping[str, Any]:
    """The task's metrics when the model predicts ``predict_output`` (texts) / scores ``score_output``."""
    converter = feature_encoder or feature_converters.EncDecFeatureConverter(pack=False)
    task = dataset_providers.get_mixture_or_task(task_name)
    vocab = task.output_features[target_feature_name].vocabulary

    def predict_fn(dataset: Any, model_feature_lengths: Any = None) -> list[tuple[int, Any]]:
        return list(enumerate(vocab.encode(s) for s in predict_output or ()))

    def score_fn(dataset: Any, model_feature_lengths: Any = None) -> list[tuple[int, float]]:
        return list(enumerate(score_output or ()))

    with DataInjector(task_name, raw_data):
        split = next(iter(raw_data))
        evaluator = Evaluator(
            task_name, feature_converter=converter, eval_split=split, sequence_length=sequence_length
        )
        metrics = evaluator.evaluate(compute_metrics=True, predict_fn=predict_fn, score_fn=score_fn)
    result: Any = metrics[0] if isinstance(metrics, tuple) else metrics
    result = result.result() if hasattr(result, "result") else result
    return result[task_name]


def test_task(
    task_name: str,
    raw_data: Mapping[str, Mapping[str, Any]],
    output_feature_name: str = "targets",
    feature_encoder: Any = None,
    seed: int | None = None,
) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
    """Preprocesses ``raw_data`` and scores the task's metrics on its own targets."""
    output = test_preprocessing_single(task_name, raw_data, seed=seed)
    task = dataset_providers.get_mixture_or_task(task_name)
    vocab = task.output_features[output_feature_name].vocabulary
    prediction = vocab.decode(list(output[output_feature_name]))
    metrics = test_postprocessing(
        task_name, raw_data, predict_output=[prediction], feature_encoder=feature_encoder
    )
    return output, metrics


class MockVocabulary(vocabularies.Vocabulary):
    """A vocabulary encoding from a fixed ``{text: ids}`` dict (EOS is 1)."""

    def __init__(self, encode_dict: Mapping[str, Sequence[int]], vocab_size: int | None = None):
        super().__init__()
        self._encode_dict = dict(encode_dict)
        self._vocab_size = vocab_size

    @property
    def unk_id(self) -> int | None:
        return None

    @property
    def eos_id(self) -> int:
        return 1

    @property
    def vocab_size(self) -> int:  # type: ignore[override]
        return self._vocab_size  # type: ignore[return-value]

    @property
    def _base_vocab_size(self) -> int:
        return self._vocab_size or 0

    def encode(self, s: Any) -> Sequence[int]:
        return self._encode_dict[s]

    def encode_tf(self, s: Any) -> tf.Tensor:
        keys = tf.constant(list(self._encode_dict))
        rows = tf.ragged.constant([list(v) for v in self._encode_dict.values()], dtype=tf.int32)
        hit = tf.where(tf.equal(keys, s))
        return tf.cond(
            tf.size(hit) > 0, lambda: rows[tf.cast(hit[0][0], tf.int32)], lambda: tf.constant([-1], tf.int32)
        )

    def _encode(self, s: str) -> Sequence[int]:
        raise NotImplementedError

    def _encode_tf(self, s: Any) -> Any:
        raise NotImplementedError

    def _decode(self, ids: Any) -> Any:
        raise NotImplementedError

    def _decode_tf(self, ids: Any) -> Any:
        raise NotImplementedError


def bertwordpiece_vocab(start_of_sequence_id: int = 101) -> vocabularies.BertWordPieceVocabulary:
    """The WordPiece vocabulary of seqio's test data (``bertwordpiece/vocab.txt``); needs tensorflow-text."""
    import os

    path = os.path.join(_fake_tasks.test_data_dir(), "bertwordpiece", "vocab.txt")
    return vocabularies.BertWordPieceVocabulary(path, start_of_sequence_id=start_of_sequence_id)


def sentencepiece_vocab(
    extra_ids: int = 0,
    normalizer_spec_overrides: Any = None,
    reverse_extra_ids: bool = True,
    use_fast_tokenizer: bool = False,
) -> vocabularies.SentencePieceVocabulary:
    """The test SentencePiece model: seqio's when its test data is found, else one trained on the fake texts."""
    return vocabularies.SentencePieceVocabulary(
        _fake_tasks.sentencepiece_model_file(),
        extra_ids=extra_ids,
        normalizer_spec_overrides=normalizer_spec_overrides,
        reverse_extra_ids=reverse_extra_ids,
        use_fast_tokenizer=use_fast_tokenizer,
    )


def mark_completed(cache_dir: str, task_name: str) -> str:
    """Writes the ``COMPLETED`` marker of ``task_name``'s cache in seqio's layout; returns the task folder."""
    task_dir = os.path.join(cache_dir, utils.get_task_dir_from_name(task_name))
    tf.io.gfile.makedirs(task_dir)
    with tf.io.gfile.GFile(os.path.join(task_dir, "COMPLETED"), "w") as f:
        f.write("")
    return task_dir


def clear_tasks() -> None:
    TaskRegistry.reset()


def clear_mixtures() -> None:
    MixtureRegistry.reset()


try:
    from absl.testing import absltest

    _TestCase: type = absltest.TestCase
except ImportError:  # absl comes with TensorFlow; without it the plain TestCase still works
    _TestCase = unittest.TestCase


class _DefaultOutputFeatures:
    """``FakeTaskTest.DEFAULT_OUTPUT_FEATURES``, built on first use (it needs the test model)."""

    def __get__(self, obj: Any, owner: Any) -> dict[str, Any]:
        vocab = sentencepiece_vocab()
        return {k: dataset_providers.Feature(vocab) for k in ("inputs", "targets")}


class FakeTaskTest(_TestCase):  # type: ignore[misc,valid-type]
    """A TestCase with seqio's fake sources and tasks registered (and nothing else).

    An ``absltest.TestCase`` (``assertLen``, ``assertSameElements``, ...) as seqio's is.

    Registered: ``tfds_task`` (and ``t5:tfds_task``), ``text_line_task``,
    ``tf_example_task``, ``proto_task``, ``function_task``,
    ``fully_processed_precache``, ``tokenized_postcache``, ``random_task``,
    ``uncached_task``, ``cached_task`` and ``cached_plaintext_task``, on the
    fake examples of ``get_fake_dataset``; the sources are attributes
    (``self.tfds_source``, ``self.function_source``, ...). ``LazyTfdsLoader`` is
    replaced by a fake one and the cache dirs by ``self.test_data_dir`` while a
    test runs; registries and cache dirs are restored afterwards.
    """

    DEFAULT_PREPROCESSORS = (
        test_text_preprocessor,
        preprocessors.tokenize,
        dataset_providers.CacheDatasetPlaceholder(),
        preprocessors.append_eos_after_trim,
    )
    DEFAULT_OUTPUT_FEATURES = _DefaultOutputFeatures()

    def add_task(
        self,
        name: str,
        source: Any,
        preprocessors: Sequence[Any] = DEFAULT_PREPROCESSORS,
        output_features: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> Any:
        return TaskRegistry.add(
            name,
            source=source,
            preprocessors=preprocessors,
            output_features=output_features or self.DEFAULT_OUTPUT_FEATURES,
            **kwargs,
        )

    def get_tempdir(self) -> str:
        import shutil
        import tempfile

        path = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, path, True)
        return path

    def setUp(self) -> None:
        super().setUp()
        self.maxDiff = None
        self._saved = (
            dict(TaskRegistry._REGISTRY),
            dict(MixtureRegistry._REGISTRY),
            list(utils.get_global_cache_dirs()),
        )
        self._tfds_patch = unittest.mock.patch.object(
            utils, "LazyTfdsLoader", new=unittest.mock.Mock(return_value=_fake_tasks.FakeLazyTfds())
        )
        self._tfds_patch.start()
        self.addCleanup(self._restore)
        self.test_tmpdir = self.get_tempdir()
        self.test_data_dir = _fake_tasks.copy_test_data(self.test_tmpdir)
        clear_tasks()
        clear_mixtures()
        self._prepare_sources_and_tasks()

    def _restore(self) -> None:
        self._tfds_patch.stop()
        clear_tasks()
        clear_mixtures()
        TaskRegistry._REGISTRY.update(self._saved[0])
        MixtureRegistry._REGISTRY.update(self._saved[1])
        utils.set_global_cache_dirs(self._saved[2])

    def _prepare_sources_and_tasks(self) -> None:
        data = _fake_tasks.fake_datasets()
        train = data["input"]["train"]
        join = os.path.join

        self.tfds_source = dataset_providers.TfdsDataSource(
            tfds_name="fake:0.0.0", splits=("train", "validation")
        )
        self.add_task("tfds_task", source=self.tfds_source)
        self.add_task("t5:tfds_task", source=self.tfds_source)

        _fake_tasks.write_shards(join(self.test_data_dir, "train.tsv"), train, [2, 1], "tsv")
        self.text_line_source = dataset_providers.TextLineDataSource(
            split_to_filepattern={"train": join(self.test_data_dir, "train.tsv*")}, skip_header_lines=1
        )
        self.add_task(
            "text_line_task",
            source=self.text_line_source,
            preprocessors=(split_tsv_preprocessor, *self.DEFAULT_PREPROCESSORS),
        )

        text_only = [{"prefix": ex["prefix"], "suffix": ex["suffix"]} for ex in train]
        _fake_tasks.write_shards(join(self.test_data_dir, "train.tfrecord"), text_only, [2, 1], "tfrecord")
        description = {
            "prefix": tf.io.FixedLenFeature([], tf.string),
            "suffix": tf.io.FixedLenFeature([], tf.string),
        }
        self.tf_example_source = dataset_providers.TFExampleDataSource(
            split_to_filepattern={"train": join(self.test_data_dir, "train.tfrecord*")},
            feature_description=description,
        )
        self.add_task("tf_example_task", source=self.tf_example_source)
        self.proto_source = dataset_providers.ProtoDataSource(
            split_to_filepattern={"train": join(self.test_data_dir, "train.tfrecord*")},
            decode_proto_fn=lambda record: tf.io.parse_single_example(record, description),
        )
        self.add_task("proto_task", source=self.proto_source)

        self.function_source = dataset_providers.FunctionDataSource(
            dataset_fn=_fake_tasks.get_fake_dataset, splits=["train", "validation"]
        )
        self.add_task("function_task", source=self.function_source)
        placeholder = dataset_providers.CacheDatasetPlaceholder()
        self.add_task(
            "fully_processed_precache",
            source=self.function_source,
            preprocessors=(
                test_text_preprocessor, preprocessors.tokenize, token_preprocessor_no_sequence_length, placeholder,
            ),
        )  # fmt: skip
        self.add_task(
            "tokenized_postcache",
            source=self.function_source,
            preprocessors=(
                test_text_preprocessor, placeholder, preprocessors.tokenize, token_preprocessor_no_sequence_length,
            ),
        )  # fmt: skip
        self.random_task = self.add_task(
            "random_task",
            source=self.function_source,
            preprocessors=(
                test_text_preprocessor,
                placeholder,
                preprocessors.tokenize,
                random_token_preprocessor,
            ),
        )
        self.uncached_task = self.add_task("uncached_task", source=self.tfds_source)

        utils.set_global_cache_dirs([self.test_data_dir])
        self.cached_task_dir = join(self.test_data_dir, "cached_task")
        for split, sizes in (("train", [2, 1]), ("validation", [2])):
            examples = data["tokenized"][split]
            _fake_tasks.write_shards(
                join(self.cached_task_dir, f"{split}.tfrecord"), examples, sizes, "tfrecord"
            )
            _fake_tasks.write_cache_metadata(self.cached_task_dir, split, examples, len(sizes))
        self.cached_task = self.add_task("cached_task", source=self.tfds_source)

        plaintext_dir = join(self.test_data_dir, "cached_plaintext_task")
        plaintext = data["plaintext"]["train"]
        _fake_tasks.write_shards(join(plaintext_dir, "train.tfrecord"), plaintext, [2, 1], "tfrecord")
        _fake_tasks.write_cache_metadata(plaintext_dir, "train", plaintext, 2)
        self.cached_plaintext_task = self.add_task(
            "cached_plaintext_task",
            source=self.tfds_source,
            preprocessors=(*self.DEFAULT_PREPROCESSORS, test_token_preprocessor),
        )

    def tearDown(self) -> None:
        tf.random.set_seed(None)
        super().tearDown()

    def verify_task_matches_fake_datasets(
        self,
        task_name: str = "",
        use_cached: bool = False,
        token_preprocessed: bool = False,
        ndfeatures: bool = False,
        ragged_features: bool = False,
        splits: Sequence[str] = ("train", "validation"),
        sequence_length: Mapping[str, int] | None = _fake_tasks.DEFAULT_SEQUENCE_LENGTH,
        num_shards: int | None = None,
        task: Any = None,
    ) -> None:
        """Asserts that every split of the task holds the fake examples, tokenized (and trimmed)."""
        task = task or TaskRegistry.get(task_name)
        for split in splits:

            def read(shard: Any = None, split: str = split) -> tf.data.Dataset:
                return task.get_dataset(
                    sequence_length, split, use_cached=use_cached, shuffle=False, shard_info=shard
                )

            if num_shards:
                ds = read(dataset_providers.ShardInfo(0, num_shards))
                for i in range(1, num_shards):
                    ds = ds.concatenate(read(dataset_providers.ShardInfo(i, num_shards)))
            else:
                ds = read()
            _fake_tasks.assert_matches_fake_dataset(
                ds,
                split,
                task.output_features,
                sequence_length,
                token_preprocessed,
                ndfeatures,
                ragged_features,
            )


class FakeMixtureTest(FakeTaskTest):
    """FakeTaskTest plus ``cached_mixture``, ``uncached_mixture`` and ``uncached_random_mixture``."""

    def setUp(self) -> None:
        super().setUp()
        clear_mixtures()
        self.uncached_mixture = MixtureRegistry.add("uncached_mixture", [("uncached_task", 1.0)])
        self.cached_mixture = MixtureRegistry.add("cached_mixture", [("cached_task", 1.0)])
        # seqio rebinds the attribute to the random mixture; kept so.
        self.uncached_mixture = MixtureRegistry.add("uncached_random_mixture", [("random_task", 1.0)])


get_fake_dataset = _fake_tasks.get_fake_dataset


__all__ = [
    "bertwordpiece_vocab",
    "DataInjector",
    "FakeMixtureTest",
    "FakeTaskTest",
    "MockVocabulary",
    "assert_dataset",
    "assert_datasets_eq",
    "assert_datasets_neq",
    "assert_dict_contains",
    "assert_dict_values_equal",
    "clear_mixtures",
    "clear_tasks",
    "create_default_dataset",
    "create_prediction",
    "encode_str",
    "get_fake_dataset",
    "mark_completed",
    "random_token_preprocessor",
    "sentencepiece_vocab",
    "split_tsv_preprocessor",
    "test_postprocessing",
    "test_preprocessing",
    "test_preprocessing_single",
    "test_task",
    "test_text_preprocessor",
    "test_token_preprocessor",
    "token_preprocessor_no_sequence_length",
]


def __getattr__(name: str) -> Any:
    # seqio's TEST_DATA_DIR: resolved on first use (finding or training the test model takes a moment).
    if name == "TEST_DATA_DIR":
        return _fake_tasks.test_data_dir()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
