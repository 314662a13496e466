"""HuggingFaceVocabulary over a tokenizer.json trained in a fixture."""

from __future__ import annotations

import json
import pickle
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from t5x.interfaces.testing import check_vocabulary
from t5x.vocabularies import HuggingFaceVocabulary

tokenizers = pytest.importorskip("tokenizers", reason="the hf extra (tokenizers) is not installed")


@pytest.fixture(scope="module")
def vocab(hf_tokenizer_file):
    return HuggingFaceVocabulary(hf_tokenizer_file, extra_ids=5)


def test_conformance(vocab, hf_tokenizer_file):
    check_vocabulary(vocab)
    check_vocabulary(HuggingFaceVocabulary(hf_tokenizer_file))


def test_special_ids_found(vocab):
    assert (vocab.pad_id, vocab.eos_id, vocab.unk_id, vocab.extra_ids) == (0, 1, 2, 5)


def test_added_sentinels(vocab, hf_tokenizer_file):
    base = HuggingFaceVocabulary(hf_tokenizer_file)
    assert vocab.vocab_size == base.vocab_size + 5
    for k in range(5):
        assert vocab.encode(f"<extra_id_{k}>") == [vocab.vocab_size - 1 - k]
        assert vocab.decode([vocab.vocab_size - 1 - k]) == f"<extra_id_{k}>"


def test_existing_sentinels_are_used(vocab, tmp_path):
    # A tokenizer that already ends with sentinels (like T5's) keeps them.
    path = tmp_path / "with_sentinels.json"
    vocab.tokenizer.save(str(path))
    again = HuggingFaceVocabulary(path, extra_ids=3)
    assert again.vocab_size == vocab.vocab_size
    assert again.encode("<extra_id_2>") == [vocab.vocab_size - 3]
    with pytest.raises(ValueError, match="has 5 sentinel tokens.*extra_ids=6"):
        HuggingFaceVocabulary(path, extra_ids=6)


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=40))
def test_byte_level_round_trip_is_exact(vocab, text):
    # Byte-level BPE has no normaliser, so every text (other than one spelling a
    # special token) survives exactly.
    ids = vocab.encode(text)
    assert all(0 < i < vocab.vocab_size for i in ids)
    if "<" not in text:
        assert vocab.decode(ids) == text


def test_decode_rules(vocab):
    ids = vocab.encode("hello world")
    assert vocab.decode([*ids, 1, *vocab.encode("more")]) == "hello world"
    assert vocab.decode([0, *ids, 0]) == "hello world"
    assert vocab.decode([*ids, vocab.vocab_size]) == vocab.decode([*ids, vocab.unk_id])
    assert vocab.decode_batch([[*ids, 1, 7], ids]) == ["hello world"] * 2


def test_equality_and_pickle(vocab, hf_tokenizer_file):
    assert vocab == HuggingFaceVocabulary(hf_tokenizer_file, extra_ids=5)
    assert hash(vocab) == hash(HuggingFaceVocabulary(hf_tokenizer_file, extra_ids=5))
    assert vocab != HuggingFaceVocabulary(hf_tokenizer_file)
    clone = pickle.loads(pickle.dumps(vocab))
    assert clone == vocab and clone.encode("a <extra_id_1>") == vocab.encode("a <extra_id_1>")


def test_explicit_tokens(hf_tokenizer_file):
    vocab = HuggingFaceVocabulary(hf_tokenizer_file, eos_token="<unk>", unk_token="</s>")
    assert (vocab.eos_id, vocab.unk_id) == (2, 1)
    with pytest.raises(ValueError, match="eos_token='<eos>' is not a token"):
        HuggingFaceVocabulary(hf_tokenizer_file, eos_token="<eos>")


def test_errors(tmp_path, hf_tokenizer_file):
    with pytest.raises(FileNotFoundError, match="missing/tokenizer.json"):
        HuggingFaceVocabulary(tmp_path / "missing" / "tokenizer.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="bad.json.*not a valid tokenizer.json"):
        HuggingFaceVocabulary(bad)
    with pytest.raises(TypeError, match="tokenizer_file"):
        HuggingFaceVocabulary(None)
    with pytest.raises(TypeError, match="extra_ids"):
        HuggingFaceVocabulary(hf_tokenizer_file, extra_ids="2")
    # A tokenizer whose id 0 is an ordinary token cannot pad with 0.
    spec = json.loads(hf_tokenizer_file.read_text())
    spec["added_tokens"] = [t for t in spec["added_tokens"] if t["content"] != "<pad>"]
    vocab_map = spec["model"]["vocab"]
    del vocab_map["<pad>"]
    vocab_map["zz"] = 0
    no_pad = tmp_path / "no_pad.json"
    no_pad.write_text(json.dumps(spec))
    with pytest.raises(ValueError, match="gives id 0 to 'zz'.*pads with 0"):
        HuggingFaceVocabulary(no_pad)


def test_missing_tokenizers_package(hf_tokenizer_file, monkeypatch):
    monkeypatch.setitem(sys.modules, "tokenizers", None)
    with pytest.raises(ImportError, match=r"t5x-vocabularies\[hf\]"):
        HuggingFaceVocabulary(hf_tokenizer_file)
