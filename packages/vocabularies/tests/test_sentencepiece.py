"""SentencePieceVocabulary: sentinel layout, decoding rules, round trips, errors, equality."""

from __future__ import annotations

import pickle
import shutil

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from t5x.interfaces.testing import check_vocabulary
from t5x.vocabularies import SentencePieceVocabulary

from .corpora import ALPHABET, generate_lines, train_sentencepiece

try:  # SentencePiece's generated protobuf module imports only under the protobuf runtime it was built for
    from sentencepiece import sentencepiece_model_pb2
except Exception:
    sentencepiece_model_pb2 = None


@pytest.fixture(scope="module")
def vocab(sp_model_file):
    return SentencePieceVocabulary(sp_model_file, extra_ids=10)


@pytest.fixture(scope="module")
def plain(sp_model_file):
    return SentencePieceVocabulary(sp_model_file)


def test_conformance(vocab, plain):
    check_vocabulary(vocab)
    check_vocabulary(plain)


def test_t5_special_ids(plain):
    assert (plain.pad_id, plain.eos_id, plain.unk_id, plain.bos_id) == (0, 1, 2, None)
    assert plain.extra_ids == 0
    assert plain.vocab_size == plain.tokenizer.GetPieceSize()


@pytest.mark.parametrize("extra_ids", [1, 10, 100])
def test_sentinel_layout(sp_model_file, plain, extra_ids):
    vocab = SentencePieceVocabulary(sp_model_file, extra_ids=extra_ids)
    assert vocab.vocab_size == plain.vocab_size + extra_ids
    assert vocab.extra_ids == extra_ids
    for k in range(extra_ids):
        sentinel = vocab.vocab_size - 1 - k
        assert vocab.tokenizer.IdToPiece(sentinel) == f"▁<extra_id_{k}>"
        assert vocab.encode(f"<extra_id_{k}>") == [sentinel]
        assert vocab.decode([sentinel]) == f"<extra_id_{k}>"
    # Sentinels inside text are single pieces, so span-corrupted text round trips.
    text = f"abc <extra_id_0> def <extra_id_{extra_ids - 1}>"
    ids = vocab.encode(text)
    assert vocab.vocab_size - 1 in ids and vocab.vocab_size - extra_ids in ids
    assert vocab.decode(ids) == text
    # The model's own ids do not move.
    assert vocab.encode("hello world") == plain.encode("hello world")


def test_sentinels_in_increasing_order(sp_model_file, plain):
    vocab = SentencePieceVocabulary(sp_model_file, extra_ids=3, reverse_extra_ids=False)
    assert [vocab.encode(f"<extra_id_{k}>") for k in range(3)] == [[plain.vocab_size + k] for k in range(3)]
    assert vocab != SentencePieceVocabulary(sp_model_file, extra_ids=3)


def test_decode_stops_at_eos_and_drops_padding(plain):
    ids = plain.encode("hello world")
    assert plain.decode([*ids, 0, 0]) == plain.decode(ids)
    assert plain.decode([0, *ids]) == plain.decode(ids)
    assert plain.decode([*ids, plain.eos_id, *plain.encode("more text")]) == plain.decode(ids)
    assert plain.decode([plain.eos_id, *ids]) == ""
    assert plain.decode_batch([[*ids, 1, 5], ids, []]) == [plain.decode(ids), plain.decode(ids), ""]


def test_ids_outside_vocab_decode_as_unk(vocab):
    ids = vocab.encode("ab cd")
    unk_text = vocab.decode([vocab.unk_id])
    assert "⁇" in unk_text
    for bad in (vocab.vocab_size, vocab.vocab_size + 1000, -1, -(2**40)):
        assert vocab.decode([*ids, bad]) == vocab.decode([*ids, vocab.unk_id])


def test_decode_accepts_arrays_and_batches(plain):
    rows = [plain.encode(t) for t in ("hello world", "the cat", "")]
    length = max(map(len, rows)) + 2
    dense = np.zeros((3, length), np.int32)
    for i, row in enumerate(rows):
        dense[i, : len(row)] = row
        dense[i, len(row)] = plain.eos_id
    expected = [plain.decode(r) for r in rows]
    assert plain.decode_batch(dense) == expected
    assert [plain.decode(row) for row in dense] == expected
    assert plain.decode(np.asarray(rows[0], np.uint16)) == expected[0]
    assert plain.encode_batch(["hello world", "the cat", ""]) == rows
    assert plain.encode_batch([]) == []
    assert plain.decode_batch([]) == []


def test_bytes_input_equals_str_input(plain):
    text = "Grüße, 世界!"
    assert plain.encode(text.encode("utf-8")) == plain.encode(text)
    assert plain.encode_batch([text.encode("utf-8"), text]) == [plain.encode(text)] * 2


# Characters the fixture model knows, plus whitespace of several kinds.
KNOWN_TEXT = st.text(alphabet=st.sampled_from(ALPHABET + " \t\n"), max_size=60)


def _normalized(vocab: SentencePieceVocabulary, text: str) -> str:
    # What SentencePiece's normaliser makes of the text (NFKC, whitespace runs
    # collapsed to one space, none leading or trailing), with spaces shown as spaces.
    return vocab.tokenizer.normalize(text).replace("▁", " ").removeprefix(" ")


@settings(max_examples=150, deadline=None)
@given(KNOWN_TEXT)
def test_round_trip_known_text(plain, text):
    """decode(encode(t)) is t with whitespace runs collapsed, ends stripped."""
    ids = plain.encode(text)
    assert plain.unk_id not in ids
    assert plain.decode(ids) == " ".join(text.split())
    assert plain.encode(plain.decode(ids)) == ids


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=40))
def test_round_trip_any_unicode(vocab, text):
    """For any text: ids are valid; without UNK, decode gives the normalised text and re-encodes the same."""
    ids = vocab.encode(text)
    assert all(0 < i < vocab.vocab_size and i != vocab.eos_id for i in ids)
    decoded = vocab.decode(ids)
    assert isinstance(decoded, str)
    if vocab.unk_id not in ids:
        assert decoded == _normalized(vocab, text)
        assert vocab.encode(decoded) == ids


@settings(max_examples=50, deadline=None)
@given(st.lists(st.text(alphabet=st.sampled_from(" \t\n\r\u3000\xa0"), max_size=8), max_size=5))
def test_whitespace_only_and_empty_texts_encode_to_nothing(plain, texts):
    assert plain.encode_batch(texts) == [[] for _ in texts]
    assert plain.decode([]) == ""


def test_normalizer_spec_overrides(sp_model_file, plain):
    # A serialized NormalizerSpec with remove_extra_whitespaces=False (field 4, varint 0).
    vocab = SentencePieceVocabulary(sp_model_file, normalizer_spec_overrides=b"\x20\x00")
    assert plain.decode(plain.encode("a  b")) == "a b"
    assert vocab.decode(vocab.encode("a  b")) == "a  b"
    assert vocab != plain
    # The overrides reach the denormalizer spec too, and survive pickling.
    clone = pickle.loads(pickle.dumps(vocab))
    assert clone == vocab and clone.decode(clone.encode("a  b")) == "a  b"
    if sentencepiece_model_pb2 is not None:  # the message object gives the same model
        overrides = sentencepiece_model_pb2.NormalizerSpec(remove_extra_whitespaces=False)
        same = SentencePieceVocabulary(sp_model_file, normalizer_spec_overrides=overrides)
        assert same == vocab and same.sp_model == vocab.sp_model


def test_malformed_normalizer_spec_overrides(sp_model_file):
    with pytest.raises(
        ValueError, match="normalizer_spec_overrides is not a valid serialized NormalizerSpec"
    ):
        SentencePieceVocabulary(sp_model_file, extra_ids=3, normalizer_spec_overrides=b"\x20")


def test_equality_and_hash(sp_model_file, tmp_path, vocab, plain):
    copy = tmp_path / "copy.model"
    shutil.copy(sp_model_file, copy)
    same = SentencePieceVocabulary(copy, extra_ids=10)
    assert same == vocab and hash(same) == hash(vocab)
    assert vocab != plain
    assert vocab != SentencePieceVocabulary(sp_model_file, extra_ids=11)
    assert vocab != "not a vocabulary"
    assert len({vocab, same, plain}) == 2
    from_bytes = SentencePieceVocabulary.from_model_proto(sp_model_file.read_bytes(), extra_ids=10)
    assert from_bytes == vocab and from_bytes.sentencepiece_model_file is None
    assert vocab.sp_model == from_bytes.sp_model


def test_different_models_are_unequal(tmp_path, plain):
    other_file = train_sentencepiece(tmp_path, "other", vocab_size=300, lines=generate_lines(5, 500))
    assert SentencePieceVocabulary(other_file) != plain


def test_pickle_needs_no_file(sp_model_file, tmp_path):
    copy = tmp_path / "gone.model"
    shutil.copy(sp_model_file, copy)
    vocab = SentencePieceVocabulary(copy, extra_ids=4)
    copy.unlink()
    clone = pickle.loads(pickle.dumps(vocab))
    assert clone == vocab
    assert clone.encode("hello <extra_id_3>") == vocab.encode("hello <extra_id_3>")
    assert clone.sentencepiece_model_file == str(copy)


def test_missing_file_names_path(tmp_path):
    missing = tmp_path / "nowhere" / "spm.model"
    with pytest.raises(FileNotFoundError, match="nowhere/spm.model"):
        SentencePieceVocabulary(missing)
    with pytest.raises(IsADirectoryError, match=str(tmp_path)):
        SentencePieceVocabulary(tmp_path)


@pytest.mark.parametrize("content", [b"", b"not a model", bytes(range(256)) * 3, b"\x0a\x05abc"])
@pytest.mark.parametrize(("extra_ids", "overrides"), [(0, None), (5, None), (0, b"\x20\x00"), (100, b"")])
def test_corrupt_file_names_path(tmp_path, content, extra_ids, overrides):
    path = tmp_path / "corrupt.model"
    path.write_bytes(content)
    with pytest.raises(ValueError, match="corrupt.model.*not a valid SentencePiece model"):
        SentencePieceVocabulary(path, extra_ids=extra_ids, normalizer_spec_overrides=overrides)
    with pytest.raises(ValueError, match="sp_model is not a valid SentencePiece model"):
        SentencePieceVocabulary.from_model_proto(
            content, extra_ids=extra_ids, normalizer_spec_overrides=overrides
        )


def test_model_whose_id_0_is_a_token_is_rejected(tmp_path):
    # SentencePiece's default layout: 0 <unk>, 1 <s>, 2 </s>, no padding.
    path = train_sentencepiece(
        tmp_path,
        "defaults",
        vocab_size=200,
        lines=generate_lines(2, 300),
        pad_id=-1,
        unk_id=0,
        bos_id=1,
        eos_id=2,
    )
    with pytest.raises(ValueError, match="gives id 0 to '<unk>'.*pads with 0"):
        SentencePieceVocabulary(path)


def test_model_with_control_id_0_is_accepted(tmp_path):
    path = train_sentencepiece(
        tmp_path,
        "bos0",
        vocab_size=200,
        lines=generate_lines(3, 300),
        pad_id=-1,
        bos_id=0,
        eos_id=1,
        unk_id=2,
    )
    vocab = SentencePieceVocabulary(path)
    assert 0 not in vocab.encode("abc def")
    check_vocabulary(vocab, check_tf=False)


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"sentencepiece_model_file": 3}, "sentencepiece_model_file"),
        ({"extra_ids": "10"}, "extra_ids"),
        ({"extra_ids": 1.5}, "extra_ids"),
        ({"reverse_extra_ids": "yes"}, "reverse_extra_ids"),
        ({"normalizer_spec_overrides": {"remove_extra_whitespaces": False}}, "normalizer_spec_overrides"),
    ],
)
def test_wrong_argument_types(sp_model_file, kwargs, argument):
    kwargs = {"sentencepiece_model_file": sp_model_file, **kwargs}
    with pytest.raises(TypeError, match=argument):
        SentencePieceVocabulary(**kwargs)


def test_negative_extra_ids(sp_model_file):
    with pytest.raises(ValueError, match="extra_ids must be >= 0, got -1"):
        SentencePieceVocabulary(sp_model_file, extra_ids=-1)


def test_wrong_method_argument_types(plain):
    with pytest.raises(TypeError, match="s must be a str"):
        plain.encode(5)
    with pytest.raises(TypeError, match="s must be a str"):
        plain.encode(["a list"])
    with pytest.raises(TypeError, match="texts must be a sequence of str"):
        plain.encode_batch("one string")
    with pytest.raises(TypeError, match=r"texts\[1\]"):
        plain.encode_batch(["ok", 3])
    with pytest.raises(TypeError, match="ids must be a sequence of ints"):
        plain.decode("5 6")
    with pytest.raises(TypeError, match="ids must be a sequence of ints"):
        plain.decode([1.5, 2])
    with pytest.raises(ValueError, match=r"ids must be one-dimensional.*\(2, 2\)"):
        plain.decode([[5, 6], [7, 8]])
    with pytest.raises(ValueError, match="ids_batch must be two-dimensional"):
        plain.decode_batch(np.zeros(3, np.int32))
