"""seqio's Vocabulary base class and vocabularies: hooks, decode rules, use inside Tasks."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import t5x.seqio as seqio
import t5x.tasks as core
import t5x.vocabularies as core_vocab


class CharVocabulary(seqio.Vocabulary):
    """A custom vocabulary as a seqio user writes one: 0 pad, 1 EOS, 2 UNK, then 'a'..'z'."""

    def __init__(self, extra_ids=0):
        super().__init__(extra_ids=extra_ids)

    @property
    def eos_id(self):
        return 1

    @property
    def unk_id(self):
        return 2

    @property
    def _base_vocab_size(self):
        return 3 + 26

    def _encode(self, s):
        return [ord(c) - ord("a") + 3 if "a" <= c <= "z" else 2 for c in s]

    def _decode(self, ids):
        return "".join(chr(i - 3 + ord("a")) if 3 <= i < 29 else ("?" if i == 2 else "") for i in ids)

    def _encode_tf(self, s):
        codes = tf.strings.unicode_decode(s, "UTF-8")
        known = (codes >= ord("a")) & (codes <= ord("z"))
        return tf.where(known, codes - ord("a") + 3, 2)

    def _decode_tf(self, ids):
        letters = tf.where((ids >= 3) & (ids < 29), ids - 3 + ord("a"), ord("?"))
        letters = tf.boolean_mask(letters, ids > 1)  # padding and EOS print nothing
        return tf.strings.unicode_encode(letters, "UTF-8")


def test_custom_vocabulary_gets_seqio_semantics():
    vocab = CharVocabulary(extra_ids=2)
    assert vocab.vocab_size == 31 and vocab.extra_ids == 2 and vocab.pad_id == 0
    assert vocab.encode("cab") == [5, 3, 4]
    # Ids at or above the base size read as UNK; decoding stops after the first EOS.
    assert vocab.decode([5, 30, 1, 4]) == "c?"
    assert vocab.decode(tf.constant([5, 3, 1, 4])) == "ca"
    assert vocab.decode_tf(tf.constant([5, 3, 1, 4])).numpy() == b"ca"
    assert vocab.decode_tf(tf.constant([], tf.int32)).numpy() == b""
    with pytest.raises(NotImplementedError):
        _ = vocab.bos_id


def test_abstract_hooks_are_required():
    class Incomplete(seqio.Vocabulary):
        eos_id = property(lambda self: 1)
        unk_id = property(lambda self: 2)

    with pytest.raises(TypeError, match="abstract"):
        Incomplete()


def test_custom_vocabulary_runs_in_a_task_and_a_converter(clean_registry):
    vocab = CharVocabulary()
    seqio.TaskRegistry.add(
        "char_task",
        source=core.InMemoryDataSource({"train": [{"inputs": "ab", "targets": "cd"}]}),
        preprocessors=[seqio.preprocessors.tokenize, seqio.preprocessors.append_eos],
        output_features={"inputs": seqio.Feature(vocab), "targets": seqio.Feature(vocab)},
    )
    ds = seqio.get_dataset(
        "char_task", {"inputs": 4, "targets": 4}, seqio.EncDecFeatureConverter(pack=False), shuffle=False
    )
    ex = next(ds.as_numpy_iterator())
    np.testing.assert_array_equal(ex["encoder_input_tokens"], [3, 4, 1, 0])
    np.testing.assert_array_equal(ex["decoder_target_tokens"], [5, 6, 1, 0])


def test_facade_vocabularies_are_both_seqio_and_core_vocabularies(sp_model_file):
    byte = seqio.ByteVocabulary(extra_ids=3)
    assert isinstance(byte, seqio.Vocabulary) and isinstance(byte, core_vocab.ByteVocabulary)
    assert byte.vocab_size == 262 and byte.eos_id == 1 and byte.unk_id == 2 and byte.bos_id is None
    assert byte == core_vocab.ByteVocabulary(extra_ids=3)
    sp = seqio.SentencePieceVocabulary(sp_model_file, extra_ids=2, use_fast_tokenizer=True)
    core_sp = core_vocab.SentencePieceVocabulary(sp_model_file, extra_ids=2)
    assert isinstance(sp, seqio.Vocabulary) and isinstance(sp, core_vocab.SentencePieceVocabulary)
    assert sp.vocab_size == core_sp.vocab_size == sp._base_vocab_size
    ids = sp.encode("the cat sat")
    assert ids == core_sp.encode("the cat sat")
    assert sp.decode(ids) == "the cat sat"
    np.testing.assert_array_equal(sp.encode_tf(tf.constant("the cat sat")).numpy(), ids)
    assert sp.encode("<extra_id_0>") == [sp.vocab_size - 1]
    sp.load_model()


def test_unigram_vocabulary():
    vocab = seqio.UnigramVocabulary(["yes", "no"], split_on_space=True)
    assert vocab.vocab_size == 4 and vocab.unk_id == 3 and vocab.eos_id is None
    assert vocab.encode("no yes maybe") == [2, 1, 3]
    assert vocab.decode([2, 1]) == "no yes"
    np.testing.assert_array_equal(vocab.encode_tf(tf.constant("no yes maybe")).numpy(), [2, 1, 3])
    assert vocab.decode_tf(tf.constant([2, 1])).numpy() == b"no yes"
    whole = seqio.UnigramVocabulary(["yes", "no"])
    assert whole.encode("no") == [2] and whole.encode("no yes") == [3]


def test_passthrough_vocabulary_basics():
    vocab = seqio.PassThroughVocabulary(size=8)
    assert vocab.eos_id is None and vocab.vocab_size == 8 and vocab.size == 8
    assert vocab.encode([3, 4]) == [3, 4]
    assert vocab == seqio.PassThroughVocabulary(8) and vocab != seqio.PassThroughVocabulary(8, eos_id=1)


def test_codepoint_vocabularies():
    full = seqio.FullCodepointVocabulary()
    assert full.encode("hé") == [104, 233] and full.eos_id == 0xE005 and full.unk_id is None
    assert full.decode([104, 233, 0xE005, 120]) == "hé"
    assert full.decode_tf(tf.constant([104, 233])).numpy().decode() == "hé"
    partial = seqio.PartialCodepointVocabulary([ord("a"), ord("b")], extra_ids=1)
    assert partial.encode("abz") == [3, 4, 2] and partial.vocab_size == 6
    assert partial.decode([3, 4, 1, 3]) == "ab"
    np.testing.assert_array_equal(partial.encode_tf(tf.constant("abz")).numpy(), [3, 4, 2])
    assert partial.decode_tf(tf.constant([4, 3])).numpy() == b"ba"
    assert partial == seqio.PartialCodepointVocabulary([97, 98], extra_ids=1) != full
