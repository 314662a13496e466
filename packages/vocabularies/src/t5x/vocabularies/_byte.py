"""Byte-level vocabulary in the ByT5 layout."""

from __future__ import annotations

from typing import Any

import numpy as np

from t5x.vocabularies._base import VocabularyBase, check_int

_SPECIALS = 3  # 0 pad, 1 EOS, 2 UNK come before the 256 bytes
_BYTES = 256


class ByteVocabulary(VocabularyBase):
    """UTF-8 bytes as ids, as ByT5 and ``seqio.ByteVocabulary`` lay them out.

    Byte ``b`` is id ``b + 3``; 0 is padding, 1 EOS, 2 UNK; ``extra_ids``
    sentinels follow the 256 bytes, ``<extra_id_k>`` being ``vocab_size - 1 - k``
    (``encode`` never emits them: the text ``<extra_id_0>`` is just its bytes).

    Decoding rules (Python and tf paths alike): ids are cut at the first EOS,
    then **every id that is not a byte (padding, UNK, sentinels, anything outside
    ``[3, 259)``) is dropped**, and byte sequences that are not valid UTF-8 become
    U+FFFD replacement characters (one per maximal invalid subsequence, Python's
    ``errors="replace"``). seqio drops invalid bytes instead of replacing them.

    Args:
      extra_ids: number of sentinel ids above the bytes.

    Raises:
      TypeError: ``extra_ids`` is not an int.
      ValueError: ``extra_ids`` is negative.
    """

    def __init__(self, extra_ids: int = 0):
        self._extra_ids = check_int("extra_ids", extra_ids or 0, minimum=0)

    @property
    def vocab_size(self) -> int:
        return _SPECIALS + _BYTES + self._extra_ids

    @property
    def _base_vocab_size(self) -> int:
        # seqio's name: the ids below the sentinels.
        return _SPECIALS + _BYTES

    @property
    def eos_id(self) -> int:
        return 1

    @property
    def unk_id(self) -> int:
        return 2

    @property
    def extra_ids(self) -> int:
        return self._extra_ids

    def _encode_one(self, s: str | bytes) -> list[int]:
        data = s.encode("utf-8") if isinstance(s, str) else s
        return [b + _SPECIALS for b in data]

    def _clean(self, ids: np.ndarray) -> np.ndarray:
        ids = super()._clean(ids)
        return ids[(ids >= _SPECIALS) & (ids < _SPECIALS + _BYTES)]

    def _decode_clean(self, ids: np.ndarray) -> str:
        return (ids - _SPECIALS).astype(np.uint8).tobytes().decode("utf-8", "replace")

    def _identity(self) -> tuple[Any, ...]:
        return (self._extra_ids,)

    def encode_tf(self, s: Any) -> Any:
        from t5x.vocabularies import _byte_tf

        return _byte_tf.encode(s, _SPECIALS)

    def decode_tf(self, ids: Any) -> Any:
        from t5x.vocabularies import _byte_tf

        return _byte_tf.decode(ids, eos_id=self.eos_id, first_byte_id=_SPECIALS)

    def __repr__(self) -> str:
        return f"ByteVocabulary(extra_ids={self._extra_ids})"
