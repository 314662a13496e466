"""PassThroughVocabulary: ids pass through; their text form is decimal."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from t5x.interfaces.testing import check_vocabulary
from t5x.vocabularies import PassThroughVocabulary


def test_conformance():
    texts = ("", "5", "17 3 99", "  4\t 8\n15  ")
    check_vocabulary(PassThroughVocabulary(100), texts)
    check_vocabulary(PassThroughVocabulary(100, eos_id=None), texts)


def test_properties():
    vocab = PassThroughVocabulary(32128)
    assert (vocab.vocab_size, vocab.size, vocab.pad_id, vocab.eos_id, vocab.unk_id, vocab.extra_ids) == (
        32128,
        32128,
        0,
        1,
        None,
        0,
    )


def test_ids_pass_through_unchanged():
    vocab = PassThroughVocabulary(50)
    assert vocab.encode([4, 9, 0, 49]) == [4, 9, 0, 49]
    assert vocab.encode(np.array([3, 2], np.int64)) == [3, 2]
    assert vocab.encode("4 9 49") == [4, 9, 49]


def test_decode_rules():
    vocab = PassThroughVocabulary(50, eos_id=7)
    assert vocab.decode([4, 0, 9, 7, 12]) == "4 9"
    assert vocab.decode([4, 60, -1]) == "4 60 -1"  # out-of-range ids are written as they are
    assert PassThroughVocabulary(50, eos_id=None).decode([4, 7, 12]) == "4 7 12"


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(2, 999), max_size=20))
def test_round_trip(ids):
    vocab = PassThroughVocabulary(1000)
    assert vocab.encode(vocab.decode(ids)) == ids


def test_equality():
    assert PassThroughVocabulary(10) == PassThroughVocabulary(10, eos_id=1)
    assert hash(PassThroughVocabulary(10)) == hash(PassThroughVocabulary(10, 1))
    assert PassThroughVocabulary(10) != PassThroughVocabulary(11)
    assert PassThroughVocabulary(10) != PassThroughVocabulary(10, eos_id=None)


def test_errors():
    with pytest.raises(TypeError, match="size must be an int"):
        PassThroughVocabulary("10")
    with pytest.raises(ValueError, match="size must be >= 1"):
        PassThroughVocabulary(0)
    with pytest.raises(TypeError, match="eos_id must be an int"):
        PassThroughVocabulary(10, eos_id=1.0)
    with pytest.raises(ValueError, match=r"eos_id must be None or in \[1, size=10\), got 10"):
        PassThroughVocabulary(10, eos_id=10)
    vocab = PassThroughVocabulary(10)
    with pytest.raises(ValueError, match="'x' in '3 x' is not a decimal id"):
        vocab.encode("3 x")
    with pytest.raises(ValueError, match=r"ids \[12\].*outside \[0, 10\)"):
        vocab.encode("3 12")
    with pytest.raises(ValueError, match="outside"):
        vocab.encode([3, -1])
    with pytest.raises(TypeError, match="s must be a str of decimal ids or a sequence of ints"):
        vocab.encode(3.5)
