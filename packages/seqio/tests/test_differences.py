"""Every row of docs/differences.md: what the core does, and what the seqio facade does instead."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import t5x.seqio as seqio
import t5x.tasks as core
import t5x.vocabularies as core_vocab


def test_text_line_source_core_yields_dicts_facade_yields_strings(tmp_path):
    path = tmp_path / "lines.txt"
    path.write_text("first\nsecond\n")
    core_ex = next(iter(core.TextLineDataSource({"train": str(path)}).get_dataset("train", shuffle=False)))
    facade_ex = next(iter(seqio.TextLineDataSource({"train": str(path)}).get_dataset("train", shuffle=False)))
    assert core_ex["text"].numpy() == b"first"
    assert isinstance(facade_ex, tf.Tensor) and facade_ex.numpy() == b"first"


class _ShapeRecorder(seqio.Vocabulary):
    """Records the shape of every string tensor ``encode_tf`` is handed (at trace time)."""

    def __init__(self):
        super().__init__()
        self.ranks: list[int] = []

    eos_id = property(lambda self: 1)
    unk_id = property(lambda self: 2)
    _base_vocab_size = property(lambda self: 259)

    def _encode(self, s):
        return [b + 3 for b in s.encode()]

    def _decode(self, ids):
        return bytes(i - 3 for i in ids if 3 <= i < 259).decode()

    def _encode_tf(self, s):
        self.ranks.append(s.shape.rank)
        return core_vocab.ByteVocabulary().encode_tf(s)

    def _decode_tf(self, ids):
        return core_vocab.ByteVocabulary().decode_tf(ids)


def test_tokenize_core_encodes_batches_facade_encodes_one_string():
    texts = tf.data.Dataset.from_tensor_slices({"targets": ["ab", "c", "def"]})
    core_vocab_spy, facade_vocab_spy = _ShapeRecorder(), _ShapeRecorder()
    core_out = list(core.tokenize(texts, {"targets": core.Feature(core_vocab_spy)}).as_numpy_iterator())
    facade_out = list(
        seqio.preprocessors.tokenize(texts, {"targets": seqio.Feature(facade_vocab_spy)}).as_numpy_iterator()
    )
    assert core_vocab_spy.ranks == [1]  # one [batch] string tensor per call
    assert facade_vocab_spy.ranks == [0]  # one scalar string per call, as seqio
    for a, b in zip(core_out, facade_out, strict=True):
        np.testing.assert_array_equal(a["targets"], b["targets"])


def test_passthrough_decode_core_gives_text_facade_gives_ids():
    assert core_vocab.PassThroughVocabulary(10, eos_id=1).decode([5, 7, 3, 1, 9]) == "5 7 3"
    # seqio keeps ids through the first EOS (the EOS included) and returns them as they are.
    assert seqio.PassThroughVocabulary(10, eos_id=1).decode([5, 7, 3, 1, 9]) == [5, 7, 3, 1]
    ids = seqio.PassThroughVocabulary(10, eos_id=1).decode_tf(tf.constant([5, 1, 9]))
    np.testing.assert_array_equal(ids.numpy(), [5, 1, 0])


def test_passthrough_eos_true_core_refuses_facade_accepts():
    with pytest.raises(TypeError, match="eos_id"):
        core_vocab.PassThroughVocabulary(10, eos_id=True)
    vocab = seqio.PassThroughVocabulary(10, eos_id=True)
    assert vocab.eos_id is True
    assert vocab.decode([4, 1, 6]) == [4, 1]  # True == 1: cut after the first 1, as seqio


def test_byte_vocabulary_invalid_utf8_core_replaces_facade_drops():
    ids = [3 + 0x68, 3 + 0xFF, 3 + 0x69]  # "h", a byte that is never valid UTF-8, "i"
    assert core_vocab.ByteVocabulary().decode(ids) == "h\ufffdi"
    assert seqio.ByteVocabulary().decode(ids) == "hi"
    assert core_vocab.ByteVocabulary().decode_tf(tf.constant(ids)).numpy().decode() == "h\ufffdi"
    assert seqio.ByteVocabulary().decode_tf(tf.constant(ids)).numpy() == b"hi"


def _seeded_noise(ex, seed):
    return {"x": tf.random.stateless_uniform([], seed=seed, maxval=1_000_000, dtype=tf.int64)}


def test_seeding_core_by_position_facade_by_map_seed_manager():
    ds = tf.data.Dataset.range(3).map(lambda i: {"x": i})
    facade_fn = seqio.map_over_dataset(_seeded_noise, num_seeds=1)
    with seqio.map_seed_manager(5):
        first = [ex["x"] for ex in facade_fn(ds).as_numpy_iterator()]
    with seqio.map_seed_manager(5):
        again = [ex["x"] for ex in facade_fn(ds).as_numpy_iterator()]
    # seqio: example n's seed is the n-th draw of tf.data random streams seeded 5 and 6.
    streams = list(tf.data.Dataset.zip((tf.data.Dataset.random(5), tf.data.Dataset.random(6))).take(3))
    expected = [
        int(tf.random.stateless_uniform([], seed=tf.stack(pair), maxval=1_000_000, dtype=tf.int64))
        for pair in streams
    ]
    assert first == again == expected

    core_fn = core.map_over_dataset(_seeded_noise, num_seeds=1)
    from t5x.tasks.seqio_extras import preprocessor_seed_scope

    with preprocessor_seed_scope(5), seqio.map_seed_manager(123):
        core_a = [ex["x"] for ex in core_fn(ds).as_numpy_iterator()]
    with preprocessor_seed_scope(5), seqio.map_seed_manager(999):
        core_b = [ex["x"] for ex in core_fn(ds).as_numpy_iterator()]
    assert core_a == core_b  # the core ignores map_seed_manager: its seeds come from the task seed
    assert core_a != first


def test_tfexample_varlen_core_densifies_facade_keeps_sparse(tmp_path):
    path = str(tmp_path / "data.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
        writer.write(seqio.dict_to_tfexample({"ids": [4, 5]}).SerializeToString())
    description = {"ids": tf.io.VarLenFeature(tf.int64)}
    core_ex = next(
        iter(core.TFExampleDataSource({"train": path}, description).get_dataset("train", shuffle=False))
    )
    facade_ex = next(
        iter(seqio.TFExampleDataSource({"train": path}, description).get_dataset("train", shuffle=False))
    )
    assert isinstance(core_ex["ids"], tf.Tensor) and core_ex["ids"].numpy().tolist() == [4, 5]
    assert isinstance(facade_ex["ids"], tf.SparseTensor)


def test_too_few_files_for_the_shards_core_shards_examples_facade_refuses(tmp_path):
    (tmp_path / "only.txt").write_text("a\nb\n")
    shard = seqio.ShardInfo(1, 2)
    core_src = core.TextLineDataSource({"train": str(tmp_path / "only.txt")})
    assert [ex["text"].numpy() for ex in core_src.get_dataset("train", shuffle=False, shard_info=shard)] == [
        b"b"
    ]
    with pytest.raises(ValueError, match="too few"):
        seqio.TextLineDataSource({"train": str(tmp_path / "only.txt")}).get_dataset("train", shard_info=shard)


def test_unknown_name_core_raises_key_error_facade_also_value_error():
    with pytest.raises(KeyError) as core_error:
        core.get_mixture_or_task("no_such_provider")
    assert not isinstance(core_error.value, ValueError)
    with pytest.raises(ValueError, match="no_such_provider"):
        seqio.get_mixture_or_task("no_such_provider")


def test_evaluator_core_calls_per_batch_facade_once_per_task(clean_registry):
    vocab = seqio.ByteVocabulary()

    def accuracy(targets, predictions):
        return {"acc": float(np.mean([t == p for t, p in zip(targets, predictions)]))}

    rows = [{"inputs": "a", "targets": "b"}] * 3
    core.TaskRegistry.add(
        "diff_eval",
        source=core.InMemoryDataSource({"validation": rows}),
        preprocessors=[core.tokenize, core.append_eos],
        output_features={"inputs": core.Feature(vocab), "targets": core.Feature(vocab)},
        metric_fns=[accuracy],
    )
    converter = seqio.EncDecFeatureConverter(pack=False)
    batch_sizes = []

    def core_predict(batch):
        batch_sizes.append(len(batch["decoder_target_tokens"]))
        return list(batch["decoder_target_tokens"])

    future = core.Evaluator("diff_eval", converter, batch_size=2).evaluate(
        compute_metrics=True, predict_fn=core_predict
    )
    assert batch_sizes == [2, 2] and future.result()["diff_eval"] == {"acc": 1.0}

    def seqio_predict(ds):
        batch_sizes.append(-len(list(ds)))
        return [(int(i), ex["decoder_target_tokens"]) for i, ex in ds.as_numpy_iterator()]

    future, outputs = seqio.Evaluator("diff_eval", converter).evaluate(
        compute_metrics=True, predict_fn=seqio_predict
    )
    assert batch_sizes[-1] == -3 and future.result()["diff_eval"] == {"acc": 1.0}
    assert len(outputs["diff_eval"][seqio.metrics.ModelOutputType.PREDICTION]) == 3


def test_autoregressive_inputs_rank2_core_shifts_rows_facade_shifts_first_axis():
    x = tf.constant([[3, 8, 1], [9, 5, 2]])
    from t5x.feature_converters import make_autoregressive_inputs as core_shift

    np.testing.assert_array_equal(core_shift(x), [[0, 3, 8], [0, 9, 5]])  # a batch of sequences
    np.testing.assert_array_equal(seqio.utils.make_autoregressive_inputs(x), [[0, 0, 0], [3, 8, 1]])


def test_list_files_core_relists_facade_lists_each_pattern_once(tmp_path):
    from t5x.tasks.seqio_extras import list_files as core_list_files

    (tmp_path / "b.txt").write_text("x")
    pattern = str(tmp_path / "*.txt")
    assert core_list_files(pattern) == seqio.list_files(pattern) == [str(tmp_path / "b.txt")]
    (tmp_path / "a.txt").write_text("x")
    assert core_list_files(pattern) == [str(tmp_path / "a.txt"), str(tmp_path / "b.txt")]
    assert seqio.list_files(pattern) == [str(tmp_path / "b.txt")]  # listed once per process, as seqio
    assert seqio.list_files([str(tmp_path / "z@2"), pattern]) == [
        str(tmp_path / "z@2"),
        str(tmp_path / "b.txt"),
    ]
