"""A base class to subclass with seqio's hooks, so a vocabulary written for seqio ports unchanged.

A subclass supplies ``_encode``/``_decode`` (Python), ``_encode_tf``/``_decode_tf``
(TensorFlow), ``_base_vocab_size``, ``eos_id`` and ``unk_id``; this class adds
the public methods with seqio's rules:

* ``vocab_size`` is ``_base_vocab_size + extra_ids``;
* ``decode`` maps ids ``>= _base_vocab_size`` to ``unk_id`` (when there is one),
  keeps ids up to and including the first EOS and hands them to ``_decode``;
* ``decode_tf`` does the same on tensors (ids after the first EOS become padding)
  and returns ``b""`` for an empty ``[0]`` tensor;
* ``encode``/``encode_tf`` call the hooks as they are (no EOS is added).

TensorFlow is imported only by the ``*_tf`` methods and ``decode`` of an eager tensor.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Sequence
from typing import Any

from t5x.vocabularies._base import PAD_ID


class Vocabulary(metaclass=abc.ABCMeta):
    """Subclassable vocabulary with seqio's hooks and semantics.

    Args:
      extra_ids: how many sentinel ids sit above ``_base_vocab_size``.
    """

    def __init__(self, extra_ids: int = 0):
        self._extra_ids = extra_ids or 0

    @property
    def bos_id(self) -> int | None:
        raise NotImplementedError(f"{type(self).__name__} does not define bos_id")

    @property
    @abc.abstractmethod
    def eos_id(self) -> int | None:
        """The end-of-sequence id, or None."""

    @property
    def pad_id(self) -> int:
        return PAD_ID

    @property
    @abc.abstractmethod
    def unk_id(self) -> int | None:
        """The unknown-piece id, or None."""

    @property
    def extra_ids(self) -> int:
        return self._extra_ids

    @property
    def vocab_size(self) -> int:
        """Ids including the sentinels."""
        return self._base_vocab_size + self.extra_ids

    @property
    @abc.abstractmethod
    def _base_vocab_size(self) -> int:
        """Ids without the sentinels, padding, EOS and UNK included."""

    @abc.abstractmethod
    def _encode(self, s: str) -> Sequence[int]: ...

    @abc.abstractmethod
    def _decode(self, ids: Sequence[int]) -> Any: ...

    @abc.abstractmethod
    def _encode_tf(self, s: Any) -> Any: ...

    @abc.abstractmethod
    def _decode_tf(self, ids: Any) -> Any: ...

    def encode(self, s: Any) -> Sequence[int]:
        """The ids of ``s``, without EOS."""
        return self._encode(s)

    def decode(self, ids: Iterable[int]) -> Any:
        """The text of ``ids`` up to the first EOS (ids past the base vocabulary read as UNK)."""
        if not isinstance(ids, list | tuple) and hasattr(ids, "numpy"):
            ids = ids.numpy().tolist()  # iterating an eager tensor element-wise is very slow
        clean = list(ids)
        if self.unk_id is not None:
            limit = self._base_vocab_size
            clean = [self.unk_id if i >= limit else i for i in clean]
        if self.eos_id is not None and self.eos_id in clean:
            clean = clean[: clean.index(self.eos_id) + 1]
        return self._decode(clean)

    def encode_tf(self, s: Any) -> Any:
        """Ids of a string tensor, without EOS (whatever ``_encode_tf`` returns)."""
        return self._encode_tf(s)

    def decode_tf(self, ids: Any) -> Any:
        """Text of an id tensor whose last axis is tokens, through the first EOS."""
        import tensorflow as tf

        if ids.shape == (0,):
            return tf.constant(b"", dtype=tf.string)
        clean = ids
        if self.unk_id is not None:
            clean = tf.where(tf.less(clean, self._base_vocab_size), clean, self.unk_id)
        if self.eos_id is not None:
            seen_eos = tf.cumsum(tf.cast(tf.equal(clean, self.eos_id), tf.int32), exclusive=True, axis=-1)
            clean = tf.where(tf.cast(seen_eos, tf.bool), self.pad_id, clean)
        return self._decode_tf(clean)
