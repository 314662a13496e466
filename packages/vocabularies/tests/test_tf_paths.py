"""The tf.data methods agree with the Python ones, for every vocabulary and tensor shape.

The SentencePiece and Hugging Face tf paths call the very tokenizer the Python
path calls (through ``tf.numpy_function``), so ids agree by construction, ties
included; these tests check the plumbing (shapes, raggedness, EOS/padding rules,
graph mode, ``Dataset.map``). The byte and pass-through tf paths are separate
TensorFlow code, so their agreement is tested over random inputs.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from t5x.vocabularies import (
    ByteVocabulary,
    HuggingFaceVocabulary,
    PassThroughVocabulary,
    SentencePieceVocabulary,
)

from .corpora import ALPHABET

tf = pytest.importorskip("tensorflow", reason="the tf paths need TensorFlow")

TEXT = st.text(alphabet=st.sampled_from(ALPHABET + " \t\nøÿ\u0301\U0001f600"), max_size=30)


@pytest.fixture(scope="module", params=["sentencepiece", "byte", "huggingface"])
def vocab(request, sp_model_file, hf_tokenizer_file):
    if request.param == "sentencepiece":
        return SentencePieceVocabulary(sp_model_file, extra_ids=10)
    if request.param == "byte":
        return ByteVocabulary(extra_ids=3)
    pytest.importorskip("tokenizers")
    return HuggingFaceVocabulary(hf_tokenizer_file, extra_ids=5)


def _rows(ragged) -> list[list[int]]:
    return [list(map(int, row)) for row in ragged.to_list()]


def _text(t) -> str:
    return t.decode("utf-8")


@settings(max_examples=25, deadline=None)
@given(texts=st.lists(TEXT, min_size=1, max_size=6))
def test_encode_and_decode_agree(vocab, texts):
    expected = vocab.encode_batch(texts)
    got = vocab.encode_tf(tf.constant(texts))
    assert isinstance(got, tf.RaggedTensor) and got.dtype == tf.int32
    assert _rows(got) == expected
    # Decoding: ragged, and dense with EOS and padding after the text.
    assert [_text(t) for t in vocab.decode_tf(got).numpy()] == vocab.decode_batch(expected)
    dense = got.to_tensor(default_value=0, shape=[len(texts), max(map(len, expected)) + 3]).numpy()
    dense[:, -2] = vocab.eos_id
    dense[:, -1] = vocab.encode("x")[0]
    assert [_text(t) for t in vocab.decode_tf(tf.constant(dense)).numpy()] == vocab.decode_batch(dense)
    assert vocab.decode_batch(dense) == vocab.decode_batch(expected)


def test_shapes(vocab):
    texts = [["hello world", ""], ["ab", "Grüße 世界"]]
    flat = vocab.encode_batch([t for row in texts for t in row])
    scalar = vocab.encode_tf(tf.constant("hello world"))
    assert isinstance(scalar, tf.Tensor) and scalar.shape.rank == 1
    assert scalar.numpy().tolist() == vocab.encode("hello world")
    matrix = vocab.encode_tf(tf.constant(texts))
    assert matrix.shape.rank == 3 and matrix.shape[:2] == [2, 2]
    assert [r for row in matrix.to_list() for r in row] == flat
    ragged = vocab.encode_tf(tf.ragged.constant([["hello world"], ["", "ab", "Grüße 世界"]]))
    assert [r for row in ragged.to_list() for r in row] == [flat[0], flat[1], flat[2], flat[3]]
    # decode_tf removes the last dimension, keeping the outer (ragged) ones.
    decoded = vocab.decode_tf(ragged)
    assert [[_text(t) for t in row] for row in decoded.to_list()] == [
        [vocab.decode(flat[0])],
        [vocab.decode(flat[1]), vocab.decode(flat[2]), vocab.decode(flat[3])],
    ]
    dense3 = vocab.decode_tf(matrix.to_tensor())
    assert dense3.shape == [2, 2]
    assert _text(vocab.decode_tf(tf.constant(flat[0])).numpy()) == vocab.decode(flat[0])
    assert vocab.decode_tf(tf.zeros([0], tf.int32)).numpy() == b""
    assert vocab.encode_tf(tf.constant([], tf.string)).to_list() == []


def test_inside_tf_data(vocab):
    texts = ["hello world", "", "Grüße, 世界!", "a\nb\tc", "12345 67.8"] * 8
    ds = tf.data.Dataset.from_tensor_slices(texts).map(vocab.encode_tf, num_parallel_calls=tf.data.AUTOTUNE)
    assert [x.tolist() for x in ds.as_numpy_iterator()] == vocab.encode_batch(texts)
    # The fast form: batch, tokenize a whole batch per call, unbatch.
    batched = (
        tf.data.Dataset.from_tensor_slices(texts)
        .batch(16)
        .map(vocab.encode_tf, num_parallel_calls=tf.data.AUTOTUNE)
        .unbatch()
    )
    assert [x.tolist() for x in batched.as_numpy_iterator()] == vocab.encode_batch(texts)
    decoded = tf.data.Dataset.from_tensor_slices(tf.ragged.constant(vocab.encode_batch(texts))).map(
        vocab.decode_tf, num_parallel_calls=tf.data.AUTOTUNE
    )
    assert [_text(t) for t in decoded.as_numpy_iterator()] == vocab.decode_batch(vocab.encode_batch(texts))


def test_graph_mode(vocab):
    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def round_trip(s):
        return vocab.decode_tf(vocab.encode_tf(s))

    texts = ["hello world", "ab cd"]
    assert [_text(t) for t in round_trip(tf.constant(texts)).numpy()] == [
        vocab.decode(ids) for ids in vocab.encode_batch(texts)
    ]


def test_out_of_range_ids_follow_the_python_rule(vocab):
    ids = [*vocab.encode("ab"), vocab.vocab_size, vocab.vocab_size + 7, -3, *vocab.encode("cd")]
    assert _text(vocab.decode_tf(tf.constant(ids)).numpy()) == vocab.decode(ids)


def test_type_errors(vocab):
    name = type(vocab).__name__
    with pytest.raises(TypeError, match=f"{name}.encode_tf: s must be a tf.string tensor, got dtype int32"):
        vocab.encode_tf(tf.constant([1, 2]))
    with pytest.raises(TypeError, match=f"{name}.decode_tf: ids must be an integer tensor, got dtype string"):
        vocab.decode_tf(tf.constant(["a"]))
    with pytest.raises(ValueError, match="got a scalar"):
        vocab.decode_tf(tf.constant(5))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(-5, 270), max_size=20))
def test_byte_decode_tf_matches_python_on_any_ids(ids):
    vocab = ByteVocabulary(extra_ids=2)
    assert _text(vocab.decode_tf(tf.constant(ids, tf.int32)).numpy()) == vocab.decode(ids)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.binary(max_size=12), min_size=1, max_size=4))
def test_byte_paths_agree_on_invalid_utf8(blobs):
    vocab = ByteVocabulary()
    ids = vocab.encode_tf(tf.constant(blobs))
    assert _rows(ids) == [[b + 3 for b in blob] for blob in blobs]
    assert [_text(t) for t in vocab.decode_tf(ids).numpy()] == [b.decode("utf-8", "replace") for b in blobs]


def test_passthrough_tf():
    vocab = PassThroughVocabulary(100, eos_id=1)
    assert _rows(vocab.encode_tf(tf.constant(["5 6  7", "", "\t99\n"]))) == [[5, 6, 7], [], [99]]
    assert vocab.encode_tf(tf.constant("3 4")).numpy().tolist() == [3, 4]
    ints = tf.constant([[3, 4]], tf.int64)
    passed = vocab.encode_tf(ints)
    assert passed.dtype == tf.int32 and passed.numpy().tolist() == [[3, 4]]
    rows = [[5, 0, 6, 1, 7], [8, 9, 0, 0, 0], [1, 2, 3, 0, 0]]
    assert [_text(t) for t in vocab.decode_tf(tf.constant(rows)).numpy()] == vocab.decode_batch(rows)
    with pytest.raises(tf.errors.InvalidArgumentError, match="id >= size=100"):
        vocab.encode_tf(tf.constant("5 100"))
    with pytest.raises(tf.errors.InvalidArgumentError):
        vocab.encode_tf(tf.constant("5 x"))


@settings(max_examples=30, deadline=None)
@given(st.lists(st.lists(st.integers(0, 120), max_size=8), min_size=1, max_size=5))
def test_passthrough_decode_tf_matches_python(rows):
    vocab = PassThroughVocabulary(100, eos_id=1)
    got = vocab.decode_tf(tf.ragged.constant(rows, dtype=tf.int32, ragged_rank=1)).numpy()
    assert [_text(t) for t in got] == vocab.decode_batch(rows)


def test_sentencepiece_tf_path_handles_bytes_python_cannot_spell(sp_model_file):
    # Invalid UTF-8 reaches the tokenizer from tf as raw bytes; Python bytes input
    # takes the same route, so the two paths still agree.
    vocab = SentencePieceVocabulary(sp_model_file)
    blob = b"ab \xff\xfe cd"
    assert vocab.encode_tf(tf.constant(blob)).numpy().tolist() == vocab.encode(blob)
    assert np.isin(vocab.unk_id, vocab.encode(blob))
