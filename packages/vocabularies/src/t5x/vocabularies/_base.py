"""What every vocabulary here shares: argument checks, id cleaning, equality, tf plumbing."""

from __future__ import annotations

import abc
import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np

PAD_ID = 0


def type_error(name: str, expected: str, value: Any) -> TypeError:
    """Builds a TypeError naming the argument, what it should be and what it was."""
    shown = repr(value)
    if len(shown) > 60:
        shown = shown[:57] + "..."
    return TypeError(f"{name} must be {expected}, got {type(value).__name__}: {shown}")


def check_int(name: str, value: Any, *, minimum: int | None = None) -> int:
    """Returns ``value`` as an int, raising TypeError/ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise type_error(name, "an int", value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def check_text(name: str, value: Any) -> str | bytes:
    """Accepts a str or UTF-8 bytes (as tf.data hands strings to Python)."""
    if not isinstance(value, str | bytes):
        raise type_error(name, "a str (or UTF-8 bytes)", value)
    return value


def check_texts(name: str, values: Any) -> list[str | bytes]:
    """Accepts a sequence (list, tuple, 1-D numpy array) of str/bytes."""
    if isinstance(values, str | bytes) or not isinstance(values, Sequence | np.ndarray):
        raise type_error(name, "a sequence of str", values)
    out = list(values)
    for i, value in enumerate(out):
        if not isinstance(value, str | bytes):
            raise type_error(f"{name}[{i}]", "a str (or UTF-8 bytes)", value)
    return out


def ids_array(name: str, ids: Any) -> np.ndarray:
    """Converts ``ids`` (list, tuple, numpy array or eager tensor) to a 1-D int64 array.

    Raises:
      TypeError: ``ids`` is text, or holds something other than integers.
      ValueError: ``ids`` is not one-dimensional.
    """
    if isinstance(ids, str | bytes):
        raise type_error(name, "a sequence of ints", ids)
    if not isinstance(ids, np.ndarray) and hasattr(ids, "numpy"):
        ids = ids.numpy()  # an eager tf.Tensor; iterating it element-wise is very slow
    try:
        arr = np.asarray(ids)
    except (TypeError, ValueError) as e:
        raise type_error(name, "a sequence of ints", ids) from e
    if arr.size == 0 and arr.ndim <= 1:
        return np.zeros(0, np.int64)
    if arr.dtype.kind not in "iu":
        raise type_error(name, f"a sequence of ints (got dtype {arr.dtype})", ids)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional [length], got shape {arr.shape}")
    return arr.astype(np.int64, copy=False)


def ids_rows(name: str, ids_batch: Any) -> list[np.ndarray]:
    """Splits a batch of id sequences (2-D array or sequence of sequences) into rows."""
    if isinstance(ids_batch, str | bytes):
        raise type_error(name, "a sequence of id sequences", ids_batch)
    if not isinstance(ids_batch, np.ndarray) and hasattr(ids_batch, "numpy"):
        ids_batch = ids_batch.numpy()
    if isinstance(ids_batch, np.ndarray):
        if ids_batch.ndim != 2:
            raise ValueError(f"{name} must be two-dimensional [batch, length], got shape {ids_batch.shape}")
        return [ids_array(f"{name}[{i}]", row) for i, row in enumerate(ids_batch)]
    if not isinstance(ids_batch, Sequence):
        raise type_error(name, "a sequence of id sequences", ids_batch)
    return [ids_array(f"{name}[{i}]", row) for i, row in enumerate(ids_batch)]


def cut_at_eos(ids: np.ndarray, eos_id: int | None) -> np.ndarray:
    """Drops the first ``eos_id`` and everything after it."""
    if eos_id is None:
        return ids
    hits = np.flatnonzero(ids == eos_id)
    return ids[: hits[0]] if hits.size else ids


class VocabularyBase(abc.ABC):
    """Shared behaviour; subclasses supply the id mapping and an identity for ``==``.

    Subclasses implement ``_encode_one``, ``_decode_clean`` (ids already cut at
    EOS and without padding) and ``_identity``; they may override the batch and
    tf hooks with faster versions.
    """

    # -- the contract's properties -------------------------------------------------

    @property
    @abc.abstractmethod
    def vocab_size(self) -> int:
        """The number of ids, sentinels included."""

    @property
    def pad_id(self) -> int:
        """The padding id (always 0)."""
        return PAD_ID

    @property
    @abc.abstractmethod
    def eos_id(self) -> int | None:
        """The end-of-sequence id, or None."""

    @property
    @abc.abstractmethod
    def unk_id(self) -> int | None:
        """The unknown-piece id, or None."""

    @property
    def bos_id(self) -> int | None:
        """The beginning-of-sequence id (None: T5 vocabularies have none)."""
        return None

    @property
    @abc.abstractmethod
    def extra_ids(self) -> int:
        """How many sentinel ids sit at the top of the id range."""

    # -- hooks -----------------------------------------------------------------------

    @abc.abstractmethod
    def _encode_one(self, s: str | bytes) -> list[int]:
        """Ids of one already type-checked text."""

    @abc.abstractmethod
    def _decode_clean(self, ids: np.ndarray) -> str:
        """Text of ids that hold no EOS and no padding ([length] int64)."""

    @abc.abstractmethod
    def _identity(self) -> tuple[Any, ...]:
        """A hashable value equal for two vocabularies exactly when their ids agree."""

    def _encode_many(self, texts: list[str | bytes]) -> list[list[int]]:
        return [self._encode_one(t) for t in texts]

    def _decode_many(self, rows: list[np.ndarray]) -> list[str]:
        return [self._decode_clean(row) for row in rows]

    def _clean(self, ids: np.ndarray) -> np.ndarray:
        ids = cut_at_eos(ids, self.eos_id)
        return ids[ids != PAD_ID]

    # -- Python API ------------------------------------------------------------------

    def encode(self, s: str | bytes) -> list[int]:
        """Tokenizes one text, without appending EOS.

        Args:
          s: the text (``bytes`` are read as UTF-8, the way tf.data hands them over).

        Returns:
          the ids, a list of ints in ``(0, vocab_size)``.

        Raises:
          TypeError: ``s`` is not a str or bytes.
        """
        return self._encode_one(check_text("s", s))

    def encode_batch(self, texts: Sequence[str | bytes]) -> list[list[int]]:
        """Tokenizes many texts at once (faster than calling ``encode`` in a loop).

        Args:
          texts: the texts, ``[batch]``.

        Returns:
          one id list per text, ``[batch, (length)]``.

        Raises:
          TypeError: ``texts`` is not a sequence of str/bytes.
        """
        return self._encode_many(check_texts("texts", texts))

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        """Detokenizes ids up to (not including) the first EOS; padding is dropped.

        Args:
          ids: ``[length]`` integer ids (list, tuple, numpy array or eager tensor).

        Returns:
          the text.

        Raises:
          TypeError: ``ids`` does not hold integers.
          ValueError: ``ids`` is not one-dimensional.
        """
        return self._decode_clean(self._clean(ids_array("ids", ids)))

    def decode_batch(self, ids_batch: Sequence[Sequence[int]] | np.ndarray) -> list[str]:
        """Decodes many id sequences, each as ``decode`` would.

        Args:
          ids_batch: ``[batch, length]`` array, or a sequence of id sequences.

        Returns:
          ``[batch]`` texts.

        Raises:
          TypeError: a row does not hold integers.
          ValueError: ``ids_batch`` is not two-dimensional.
        """
        return self._decode_many([self._clean(row) for row in ids_rows("ids_batch", ids_batch)])

    # -- tf.data API (TensorFlow is imported here, on first use) -----------------------

    def encode_tf(self, s: Any) -> Any:
        """Tokenizes a string tensor inside or outside ``tf.data``.

        Args:
          s: ``tf.string`` scalar, or a tensor (dense or ragged) of strings of any rank.

        Returns:
          ``tf.int32`` ids: ``[length]`` for a scalar, else a ``tf.RaggedTensor``
          shaped ``s.shape + [(length)]``.

        Raises:
          TypeError: ``s`` is not a string tensor.
        """
        from t5x.vocabularies import _tf

        return _tf.encode_strings(s, _tf.numpy_encoder(self._encode_flat), owner=type(self).__name__)

    def decode_tf(self, ids: Any) -> Any:
        """Detokenizes an integer tensor whose last dimension is tokens.

        Args:
          ids: ``[..., length]`` integer tensor, dense or ragged.

        Returns:
          ``tf.string`` tensor shaped ``ids.shape[:-1]``, each as ``decode`` gives.

        Raises:
          TypeError: ``ids`` is not an integer tensor.
          ValueError: ``ids`` is a scalar.
        """
        from t5x.vocabularies import _tf

        return _tf.decode_ids(ids, _tf.numpy_decoder(self._decode_flat), owner=type(self).__name__)

    def _encode_flat(self, strings: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``[n]`` bytes -> (``[total]`` int32 ids, ``[n + 1]`` int64 row splits)."""
        if len(strings) == 1:  # the common Dataset.map-per-example case: skip the batch machinery
            ids = self._encode_one(strings[0])
            return np.asarray(ids, np.int32), np.array([0, len(ids)], np.int64)
        rows = self._encode_many(list(strings))
        lengths = np.fromiter((len(r) for r in rows), np.int64, count=len(rows))
        splits = np.zeros(len(rows) + 1, np.int64)
        np.cumsum(lengths, out=splits[1:])
        values = np.fromiter((i for r in rows for i in r), np.int32, count=int(splits[-1]))
        return values, splits

    def _decode_flat(self, values: np.ndarray, splits: np.ndarray) -> np.ndarray:
        """(``[total]`` ids, ``[n + 1]`` row splits) -> ``[n]`` UTF-8 bytes objects."""
        values = values.astype(np.int64, copy=False)
        rows = [self._clean(values[a:b]) for a, b in itertools.pairwise(splits)]
        texts = self._decode_many(rows)
        return np.array([t.encode("utf-8") for t in texts], dtype=object)

    # -- equality ------------------------------------------------------------------------

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return self._identity() == other._identity()  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash((type(self).__qualname__, self._identity()))
