"""``seqio.vocabularies``: the Vocabulary base class and seqio's vocabularies, with seqio's decode rules.

The classes here subclass both ``Vocabulary`` (seqio's hooks) and, where one
exists, the ``t5x.vocabularies`` class with the same ids, so they work in
``t5x.tasks`` Tasks and converters and pass ``isinstance`` checks of either side.
Where the core deliberately decodes differently, these follow seqio (see
docs/differences.md): ByteVocabulary drops invalid UTF-8 instead of replacing
it, PassThroughVocabulary decodes to the ids themselves and accepts any
``eos_id``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from t5x import vocabularies as _core
from t5x.vocabularies import PAD_ID, Vocabulary

_BYTE_OFFSET = 3  # 0 pad, 1 EOS, 2 UNK come before the bytes
_SHARED_PROCESSORS: dict[str, Any] = {}  # sha256 of the serialized model -> its processor


class ByteVocabulary(_core.ByteVocabulary, Vocabulary):  # type: ignore[misc]
    """UTF-8 bytes as ids (ByT5); decoding drops invalid UTF-8, as seqio does."""

    def __init__(self, extra_ids: int = 0):
        _core.ByteVocabulary.__init__(self, extra_ids)

    @property
    def bos_id(self) -> int | None:
        return None

    @property
    def vocab_size(self) -> int:
        return self._base_vocab_size + self.extra_ids

    def _encode(self, s: Any) -> list[int]:
        text = s.decode() if isinstance(s, bytes) else s
        return [b + _BYTE_OFFSET for b in text.encode("utf-8")]

    def _decode(self, ids: Sequence[int]) -> str:
        kept = [int(i) - _BYTE_OFFSET for i in ids if _BYTE_OFFSET <= int(i) < _BYTE_OFFSET + 256]
        return bytes(kept).decode("utf-8", errors="ignore")

    def _encode_tf(self, s: Any) -> Any:
        return _core.ByteVocabulary.encode_tf(self, s)

    def _decode_tf(self, ids: Any) -> Any:
        import tensorflow as tf

        in_range = tf.logical_and(ids >= _BYTE_OFFSET, ids < _BYTE_OFFSET + 256)
        kept = tf.ragged.boolean_mask(ids, in_range) - _BYTE_OFFSET
        table = tf.constant([bytes([b]) for b in range(256)])
        joined = tf.strings.reduce_join(tf.gather(table, kept), axis=-1)
        return tf.strings.unicode_transcode(joined, "UTF-8", "UTF-8", errors="ignore")

    encode = Vocabulary.encode  # type: ignore[assignment]
    decode = Vocabulary.decode  # type: ignore[assignment]
    encode_tf = Vocabulary.encode_tf  # type: ignore[assignment]
    decode_tf = Vocabulary.decode_tf  # type: ignore[assignment]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, _core.ByteVocabulary):
            return False
        return self.extra_ids == other.extra_ids

    __hash__ = _core.ByteVocabulary.__hash__


class SentencePieceVocabulary(_core.SentencePieceVocabulary, Vocabulary):  # type: ignore[misc]
    """A SentencePiece model with optional sentinels, seqio's constructor included.

    ``use_fast_tokenizer`` is accepted and has no effect: the tf path always runs
    the same SentencePiece processor as the Python path, so both give the same ids.
    """

    def __init__(
        self,
        sentencepiece_model_file: str,
        extra_ids: int = 0,
        normalizer_spec_overrides: Any = None,
        reverse_extra_ids: bool = True,
        use_fast_tokenizer: bool = False,
    ):
        self._use_fast_tokenizer = bool(use_fast_tokenizer)
        _core.SentencePieceVocabulary.__init__(
            self, sentencepiece_model_file, extra_ids, normalizer_spec_overrides, reverse_extra_ids
        )
        # As seqio: vocabularies with the same model (sentinels and overrides included) share one
        # processor, so ``tokenizer`` is the same object and the model is held in memory once.
        self._processor = _SHARED_PROCESSORS.setdefault(self._digest, self._processor)

    def load_model(self) -> None:
        """Loads the model now (it is loaded at construction already; kept for seqio code)."""
        _ = self.tokenizer

    def _encode(self, s: Any) -> list[int]:
        return _core.SentencePieceVocabulary.encode(self, s)

    def _decode(self, ids: Sequence[int]) -> str:
        return _core.SentencePieceVocabulary.decode(self, list(map(int, ids)))

    def _encode_tf(self, s: Any) -> Any:
        return _core.SentencePieceVocabulary.encode_tf(self, s)

    def _decode_tf(self, ids: Any) -> Any:
        return _core.SentencePieceVocabulary.decode_tf(self, ids)

    @property
    def vocab_size(self) -> int:
        return self._base_vocab_size

    @property
    def _base_vocab_size(self) -> int:
        # seqio counts the added sentinel pieces in the base size of a SentencePiece model.
        return _core.SentencePieceVocabulary.vocab_size.fget(self)  # type: ignore[attr-defined]


class PassThroughVocabulary(Vocabulary):
    """Ids in, ids out, as seqio's: ``decode`` returns the ids through the first EOS.

    Args:
      size: the number of ids.
      eos_id: the end-of-sequence id (any value seqio accepts, None for none).
    """

    def __init__(self, size: int, eos_id: Any | None = None):
        self._size = size
        self._eos_id = eos_id
        super().__init__()

    @property
    def _base_vocab_size(self) -> int:
        return self._size

    def _encode(self, s: Any) -> Any:
        return s

    def _decode(self, ids: Any) -> Any:
        return ids

    def _encode_tf(self, s: Any) -> Any:
        return s

    def _decode_tf(self, ids: Any) -> Any:
        return ids

    @property
    def eos_id(self) -> Any | None:
        return self._eos_id

    @property
    def unk_id(self) -> None:
        return None

    @property
    def size(self) -> int:
        return self._size

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PassThroughVocabulary):
            return False
        return self._size == other._size and self.eos_id == other.eos_id

    def __hash__(self) -> int:
        return hash((PassThroughVocabulary, self._size, self._eos_id))

    def __str__(self) -> str:
        return f"PassThroughVocabulary(size={self._size}, eos_id={self.eos_id})"


class UnigramVocabulary(Vocabulary):
    """One id per known token (PAD is 0, UNK the last id), as seqio's.

    Args:
      unigrams: the known tokens (without PAD and UNK).
      split_on_space: encode/decode split and join on spaces; otherwise the
        whole text is one token (decode still joins with spaces, decode_tf
        returns the first token).
    """

    def __init__(self, unigrams: Sequence[str], split_on_space: bool = False):
        super().__init__()
        self._unigram_by_id = ["PAD", *unigrams, "UNK"]
        self._id_by_unigram = {u: i for i, u in enumerate(self._unigram_by_id)}
        self._split_on_space = split_on_space
        self._tables: Any = None

    def _tf_tables(self) -> Any:
        import tensorflow as tf

        if self._tables is None:
            known = self._unigram_by_id[:-1]
            init = tf.lookup.KeyValueTensorInitializer(
                tf.constant(known), tf.constant(range(len(known)), dtype=tf.int64)
            )
            self._tables = (
                tf.lookup.StaticVocabularyTable(init, num_oov_buckets=1),
                tf.constant(self._unigram_by_id),
            )
        return self._tables

    def _encode(self, s: str) -> list[int]:
        tokens = s.split(" ") if self._split_on_space else [s]
        return [self._id_by_unigram.get(t, self.unk_id) for t in tokens]

    def _encode_tf(self, s: Any) -> Any:
        import tensorflow as tf

        table, _ = self._tf_tables()
        if self._split_on_space:
            return tf.cast(table.lookup(tf.strings.split(s, " ")), tf.int32)
        return tf.expand_dims(tf.cast(table.lookup(s), tf.int32), -1)

    def _decode(self, ids: Sequence[int]) -> str:
        return " ".join(self._unigram_by_id[int(i)] for i in ids)

    def _decode_tf(self, ids: Any) -> Any:
        import tensorflow as tf

        _, words = self._tf_tables()
        if self._split_on_space:
            return tf.strings.reduce_join(tf.gather(words, ids), axis=-1, separator=" ")
        return words[ids[0]]

    @property
    def _base_vocab_size(self) -> int:
        return len(self._unigram_by_id)

    @property
    def eos_id(self) -> None:
        return None

    @property
    def unk_id(self) -> int:
        return self._base_vocab_size - 1


class FullCodepointVocabulary(Vocabulary):
    """Every Unicode codepoint is its own id (no vocabulary file); EOS is U+E005, padding 0."""

    LARGEST_CODEPOINT = 0x10FFFF
    PAD_CODEPOINT = 0
    EOS_CODEPOINT = 0xE005

    @property
    def eos_id(self) -> int:
        return self.EOS_CODEPOINT

    @property
    def unk_id(self) -> None:
        return None

    @property
    def _base_vocab_size(self) -> int:
        return self.LARGEST_CODEPOINT

    def _encode(self, s: str) -> list[int]:
        return [ord(c) for c in s]

    def _decode(self, ids: Sequence[int]) -> str:
        return "".join(chr(int(i)) for i in ids if int(i) != self.EOS_CODEPOINT)

    def _encode_tf(self, s: Any) -> Any:
        import tensorflow as tf

        return tf.strings.unicode_decode(s, input_encoding="UTF-8")

    def _decode_tf(self, ids: Any) -> Any:
        import tensorflow as tf

        return tf.strings.unicode_encode(ids, output_encoding="UTF-8")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FullCodepointVocabulary)

    def __hash__(self) -> int:
        return hash(FullCodepointVocabulary)


class PartialCodepointVocabulary(Vocabulary):
    """A fixed set of codepoints: 0 pad, 1 EOS, 2 UNK, then the codepoints in the order given.

    Args:
      codepoints: the known codepoints (``ord`` of each character).
      extra_ids: sentinel ids above them.
    """

    PAD_CODEPOINT = 0
    EOS_CODEPOINT = 0xE005
    UNK_CODEPOINT = 0xE004
    PAD_ID, EOS_ID, UNK_ID = 0, 1, 2

    def __init__(self, codepoints: Sequence[int], extra_ids: int = 0):
        self._codepoint_to_id = {self.PAD_CODEPOINT: 0, self.EOS_CODEPOINT: 1, self.UNK_CODEPOINT: 2}
        for cp in codepoints:
            self._codepoint_to_id.setdefault(int(cp), len(self._codepoint_to_id))
        self._id_to_codepoint = {v: k for k, v in self._codepoint_to_id.items()}
        self._tables: Any = None
        super().__init__(extra_ids=extra_ids)

    @classmethod
    def create_from_file(cls, vocab_file: str, extra_ids: int = 0) -> PartialCodepointVocabulary:
        """Reads one decimal codepoint per line."""
        import tensorflow as tf

        with tf.io.gfile.GFile(vocab_file) as f:
            return cls([int(line.strip()) for line in f if line.strip()], extra_ids)

    @property
    def eos_id(self) -> int:
        return self.EOS_ID

    @property
    def unk_id(self) -> int:
        return self.UNK_ID

    @property
    def _base_vocab_size(self) -> int:
        return len(self._codepoint_to_id)

    def _lookup_tables(self) -> Any:
        import tensorflow as tf

        if self._tables is None:

            def table(d: dict[int, int], default: int) -> Any:
                init = tf.lookup.KeyValueTensorInitializer(
                    tf.constant(list(d)), tf.constant(list(d.values()))
                )
                return tf.lookup.StaticHashTable(init, default_value=default)

            self._tables = (
                table(self._codepoint_to_id, self.UNK_ID),
                table(self._id_to_codepoint, self.UNK_CODEPOINT),
            )
        return self._tables

    def _encode(self, s: str) -> list[int]:
        return [self._codepoint_to_id.get(ord(c), self.UNK_ID) for c in s]

    def _decode(self, ids: Sequence[int]) -> str:
        out = []
        for i in ids:
            cp = self._id_to_codepoint.get(int(i), self.UNK_CODEPOINT)
            if cp != self.EOS_CODEPOINT:
                out.append(chr(cp))
        return "".join(out)

    def _encode_tf(self, s: Any) -> Any:
        import tensorflow as tf

        to_id, _ = self._lookup_tables()
        return to_id[tf.strings.unicode_decode(s, input_encoding="UTF-8")]

    def _decode_tf(self, ids: Any) -> Any:
        import tensorflow as tf

        _, to_cp = self._lookup_tables()
        return tf.strings.unicode_encode(to_cp[ids], output_encoding="UTF-8")

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, PartialCodepointVocabulary)
            and self._codepoint_to_id == other._codepoint_to_id
            and self.extra_ids == other.extra_ids
        )

    def __hash__(self) -> int:
        return hash((PartialCodepointVocabulary, tuple(self._codepoint_to_id), self.extra_ids))


def _import_tensorflow_text() -> Any:
    try:
        import tensorflow_text
    except ImportError as error:
        raise ImportError(
            "BertWordPieceVocabulary needs tensorflow-text: pip install 't5x-seqio[bert]'"
        ) from error
    return tensorflow_text


class BertWordPieceVocabulary(Vocabulary):
    """BERT's WordPiece tokenizer (tensorflow-text's ``BertTokenizer``) as a seqio vocabulary.

    The arguments up to ``preserve_unused_token`` are ``BertTokenizer``'s;
    ``vocab_lookup_table`` is the path of a ``vocab.txt`` (one wordpiece per
    line, the line number is the id). ``pad_id``, ``start_of_sequence_id``
    ([CLS]) and ``end_of_sequence_id`` ([SEP]) name the special ids; the
    unknown id is looked up from ``unknown_token``. No extra ids. Decoding
    joins the wordpieces with spaces, as seqio does. Two vocabularies are equal
    when their vocab files have the same bytes and the same start id.
    """

    def __init__(
        self,
        vocab_lookup_table: str,
        suffix_indicator: str = "##",
        max_bytes_per_word: int = 100,
        max_chars_per_token: int | None = None,
        token_out_type: Any = None,
        unknown_token: str = "[UNK]",
        split_unknown_characters: bool = False,
        lower_case: bool = False,
        keep_whitespace: bool = False,
        normalization_form: str | None = None,
        preserve_unused_token: bool = False,
        pad_id: int = 0,
        start_of_sequence_id: int = 101,
        end_of_sequence_id: int = 102,
    ):
        import tensorflow as tf

        text = _import_tensorflow_text()
        self._tokenizer = text.BertTokenizer(
            vocab_lookup_table=vocab_lookup_table,
            suffix_indicator=suffix_indicator,
            max_bytes_per_word=max_bytes_per_word,
            max_chars_per_token=max_chars_per_token,
            token_out_type=tf.int64 if token_out_type is None else token_out_type,
            unknown_token=unknown_token,
            split_unknown_characters=split_unknown_characters,
            lower_case=lower_case,
            keep_whitespace=keep_whitespace,
            normalization_form=normalization_form,
            preserve_unused_token=preserve_unused_token,
        )
        # The wordpiece lookup table the tokenizer built from the file.
        self._table = self._tokenizer._wordpiece_tokenizer._vocab_lookup_table
        self._pad_id = pad_id
        self._unk_id = int(self._table.lookup(tf.constant(unknown_token)).numpy())
        self._sos_id = start_of_sequence_id
        self._eos_id = end_of_sequence_id
        with tf.io.gfile.GFile(vocab_lookup_table, "rb") as f:
            self._vocab_bytes = f.read()
        super().__init__()

    @property
    def sos_id(self) -> int:
        return self._sos_id

    @property
    def eos_id(self) -> int:
        return self._eos_id

    @property
    def unk_id(self) -> int:
        return self._unk_id

    @property
    def pad_id(self) -> int:
        return self._pad_id

    @property
    def _base_vocab_size(self) -> int:
        return int(self._table.size().numpy())

    @property
    def vocab_size(self) -> int:
        return self._base_vocab_size

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    @property
    def tf_tokenizer(self) -> Any:
        return self._tokenizer

    def _encode(self, s: str) -> Any:
        return self._encode_tf(s).numpy()

    def _decode(self, ids: Sequence[int]) -> str:
        import tensorflow as tf

        return self._decode_tf(tf.constant(ids)).numpy().decode("utf-8")

    def _encode_tf(self, s: Any) -> Any:
        import tensorflow as tf

        # [words, pieces] ragged -> one flat row of ids.
        return tf.reshape(self._tokenizer.tokenize(s).flat_values, [-1])

    def _decode_tf(self, ids: Any) -> Any:
        import tensorflow as tf

        pieces = self._tokenizer.detokenize(tf.RaggedTensor.from_tensor(tf.expand_dims(ids, axis=1)))
        return tf.strings.reduce_join(pieces.flat_values, separator=" ")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, BertWordPieceVocabulary):
            return False
        return self._vocab_bytes == other._vocab_bytes and self._sos_id == other._sos_id

    def __hash__(self) -> int:
        return hash((BertWordPieceVocabulary, self._vocab_bytes, self._sos_id))


__all__ = [
    "BertWordPieceVocabulary",
    "FullCodepointVocabulary",
    "PartialCodepointVocabulary",
    "PAD_ID",
    "ByteVocabulary",
    "PassThroughVocabulary",
    "SentencePieceVocabulary",
    "UnigramVocabulary",
    "Vocabulary",
]
