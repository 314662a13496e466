"""ByteVocabulary: the ByT5 layout, exact round trips, replacement characters."""

from __future__ import annotations

import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from t5x.interfaces.testing import check_vocabulary
from t5x.vocabularies import ByteVocabulary


def test_conformance():
    check_vocabulary(ByteVocabulary())
    check_vocabulary(ByteVocabulary(extra_ids=100))


def test_byt5_layout():
    vocab = ByteVocabulary(extra_ids=125)
    assert (vocab.pad_id, vocab.eos_id, vocab.unk_id, vocab.bos_id) == (0, 1, 2, None)
    assert vocab.vocab_size == 3 + 256 + 125  # ByT5's 384 ids
    assert vocab.encode("A") == [ord("A") + 3]
    assert vocab.encode("é") == [0xC3 + 3, 0xA9 + 3]
    assert vocab.encode("") == []
    assert ByteVocabulary().vocab_size == 259


def test_sentinels_are_the_top_ids_and_decode_to_nothing():
    vocab = ByteVocabulary(extra_ids=5)
    sentinels = [vocab.vocab_size - 1 - k for k in range(5)]
    assert sentinels == [263, 262, 261, 260, 259]
    assert vocab.decode([*vocab.encode("ab"), sentinels[0], *vocab.encode("cd")]) == "abcd"
    # The text "<extra_id_0>" is only its bytes.
    assert vocab.encode("<extra_id_0>") == [b + 3 for b in b"<extra_id_0>"]


def test_decode_rules():
    vocab = ByteVocabulary(extra_ids=2)
    ab = vocab.encode("ab")
    assert vocab.decode([*ab, 1, *vocab.encode("cd")]) == "ab"  # stops at EOS
    assert vocab.decode([0, *ab, 0, 2]) == "ab"  # pad and UNK dropped
    assert vocab.decode([*ab, 261, 5000, -7]) == "ab"  # sentinels and out-of-range ids dropped
    assert vocab.decode([0xFF + 3, *ab]) == "\ufffdab"  # invalid UTF-8 -> U+FFFD
    assert vocab.decode([0xE2 + 3, 0x82 + 3]) == "\ufffd"  # truncated sequence -> one U+FFFD


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_round_trip_is_exact(text):
    vocab = ByteVocabulary(extra_ids=3)
    ids = vocab.encode(text)
    assert ids == [b + 3 for b in text.encode("utf-8")]
    assert vocab.decode(ids) == text


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=24))
def test_any_bytes_decode_like_python_replace(data):
    vocab = ByteVocabulary()
    assert vocab.decode([b + 3 for b in data]) == data.decode("utf-8", "replace")
    assert vocab.encode(data) == [b + 3 for b in data]


def test_equality_hash_pickle():
    assert ByteVocabulary(3) == ByteVocabulary(extra_ids=3)
    assert hash(ByteVocabulary(3)) == hash(ByteVocabulary(3))
    assert ByteVocabulary(3) != ByteVocabulary(4)
    assert ByteVocabulary() != 259
    assert pickle.loads(pickle.dumps(ByteVocabulary(7))) == ByteVocabulary(7)


def test_bad_arguments():
    with pytest.raises(TypeError, match="extra_ids must be an int, got str"):
        ByteVocabulary("3")
    with pytest.raises(ValueError, match="extra_ids must be >= 0"):
        ByteVocabulary(-2)
    with pytest.raises(TypeError, match="s must be a str"):
        ByteVocabulary().encode(None)
    with pytest.raises(TypeError, match="ids must be a sequence of ints"):
        ByteVocabulary().decode(b"abc")
