"""A vocabulary for data that is already token ids."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from t5x.vocabularies._base import VocabularyBase, check_int, ids_array, type_error


class PassThroughVocabulary(VocabularyBase):
    """Ids in, the same ids out: for features that are tokenized already.

    Like ``seqio.PassThroughVocabulary``, ``encode`` and ``encode_tf`` return
    integer input unchanged. To honour the text side of the Vocabulary contract,
    text is the ids written in decimal, separated by whitespace: ``encode("5 17 3")``
    is ``[5, 17, 3]`` and ``decode([5, 17, 3, 1, 9])`` is ``"5 17 3"`` (with
    ``eos_id=1``). ``decode`` cuts at the first EOS and drops padding (0); every
    other id, in range or not, is written as it is.

    Args:
      size: the number of ids.
      eos_id: the end-of-sequence id, or None for none.

    Raises:
      TypeError: ``size`` or ``eos_id`` is not an int.
      ValueError: ``size`` < 1, or ``eos_id`` not in ``[1, size)``.
    """

    def __init__(self, size: int, eos_id: int | None = 1):
        self._size = check_int("size", size, minimum=1)
        if eos_id is not None:
            eos_id = check_int("eos_id", eos_id, minimum=1)
            if eos_id >= self._size:
                raise ValueError(f"eos_id must be None or in [1, size={self._size}), got {eos_id}")
        self._eos_id = eos_id

    @property
    def vocab_size(self) -> int:
        return self._size

    @property
    def size(self) -> int:
        """The number of ids (seqio's name for ``vocab_size``)."""
        return self._size

    @property
    def _base_vocab_size(self) -> int:
        return self._size

    @property
    def eos_id(self) -> int | None:
        return self._eos_id

    @property
    def unk_id(self) -> None:
        return None

    @property
    def extra_ids(self) -> int:
        return 0

    def encode(self, s: str | bytes | Sequence[int]) -> list[int]:  # type: ignore[override]
        """Parses decimal ids from text, or passes a sequence of ids through.

        Args:
          s: whitespace-separated decimal ids (str or bytes), or a sequence of ints.

        Returns:
          the ids as a list of ints.

        Raises:
          TypeError: ``s`` is neither text nor a sequence of ints.
          ValueError: a token is not a decimal integer, or an id is outside ``[0, size)``.
        """
        if not isinstance(s, str | bytes):
            if not isinstance(s, Sequence | np.ndarray) and not hasattr(s, "numpy"):
                raise type_error("s", "a str of decimal ids or a sequence of ints", s)
            return self._checked(ids_array("s", s).tolist(), s)
        return self._encode_one(s)

    def _encode_one(self, s: str | bytes) -> list[int]:
        text = s.decode("utf-8", "replace") if isinstance(s, bytes) else s
        ids = []
        for token in text.split():
            try:
                ids.append(int(token))
            except ValueError:
                raise ValueError(
                    f"PassThroughVocabulary.encode: {token!r} in {text[:60]!r} is not a decimal id"
                ) from None
        return self._checked(ids, s)

    def _checked(self, ids: list[int], source: Any) -> list[int]:
        bad = [i for i in ids if not 0 <= i < self._size]
        if bad:
            raise ValueError(
                f"PassThroughVocabulary.encode: ids {bad[:5]} of {source!r:.60} are outside [0, {self._size})"
            )
        return ids

    def _decode_clean(self, ids: np.ndarray) -> str:
        return " ".join(map(str, ids.tolist()))

    def _identity(self) -> tuple[Any, ...]:
        return (self._size, self._eos_id)

    def encode_tf(self, s: Any) -> Any:
        """Parses a string tensor of decimal ids; an integer tensor is returned unchanged.

        Args:
          s: ``tf.string`` tensor of any rank, or an integer tensor of ids.

        Returns:
          ``tf.int32`` ids: for strings, ``[length]`` for a scalar else a ragged
          ``s.shape + [(length)]``; for integers, ``s`` itself.
        """
        from t5x.vocabularies import _passthrough_tf

        return _passthrough_tf.encode(s, self._size)

    def decode_tf(self, ids: Any) -> Any:
        from t5x.vocabularies import _passthrough_tf

        return _passthrough_tf.decode(ids, self._eos_id)

    def __repr__(self) -> str:
        return f"PassThroughVocabulary(size={self._size}, eos_id={self._eos_id})"
