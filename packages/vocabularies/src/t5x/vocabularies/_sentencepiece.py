"""SentencePiece vocabulary with the T5 sentinel layout, ids equal to seqio's."""

from __future__ import annotations

import hashlib
import os
import threading
from typing import Any, cast

import numpy as np
import sentencepiece

from t5x.vocabularies._base import PAD_ID, VocabularyBase, check_int, type_error
from t5x.vocabularies._model_proto import MalformedProto, check_normalizer_spec, edit_model_proto

# SentencePieceProcessor.LoadFromSerializedProto is not safe to run from several
# threads at once (upstream seqio saw crashes), so loads are serialised.
_LOAD_LOCK = threading.Lock()


def _read_model_file(path: str) -> bytes:
    """Reads a model file; ``scheme://`` paths (gs://, ...) go through tf.io.gfile."""
    if "://" in path:
        import tensorflow as tf  # only remote file systems need TensorFlow

        try:
            if not tf.io.gfile.exists(path):
                raise FileNotFoundError(f"SentencePiece model file {path!r} does not exist")
            with tf.io.gfile.GFile(path, "rb") as f:
                return f.read()
        except tf.errors.OpError as e:  # no network, no credentials, or no such file system here
            reason = e.message.splitlines()[0] if e.message else type(e).__name__
            raise FileNotFoundError(
                f"cannot read SentencePiece model file {path!r} from here ({reason}); copy it to this "
                "machine and point the vocabulary at the local copy"
            ) from None
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError as e:
        raise FileNotFoundError(f"SentencePiece model file {path!r} does not exist") from e
    except IsADirectoryError as e:
        raise IsADirectoryError(f"SentencePiece model file {path!r} is a directory, expected a file") from e


def _with_extra_ids(
    model: bytes, extra_ids: int, reverse_extra_ids: bool, normalizer_spec_overrides: bytes | None, where: str
) -> bytes:
    """Appends ``▁<extra_id_k>`` user-defined pieces and merges normalizer overrides.

    The pieces go after the model's own pieces, the way seqio adds them, so with
    ``reverse_extra_ids`` the sentinel ``<extra_id_k>`` gets id ``size - 1 - k``.
    The proto is edited on the wire format (``_model_proto``), not through
    SentencePiece's generated protobuf module, which only imports under the
    protobuf runtime it was generated for.
    """
    if not extra_ids and normalizer_spec_overrides is None:
        return model
    order = reversed(range(extra_ids)) if reverse_extra_ids else range(extra_ids)
    try:
        return edit_model_proto(model, [f"▁<extra_id_{k}>" for k in order], normalizer_spec_overrides)
    except MalformedProto as e:
        raise ValueError(f"{where} is not a valid SentencePiece model: {e}") from e


def _load_processor(model: bytes, where: str) -> sentencepiece.SentencePieceProcessor:
    processor = sentencepiece.SentencePieceProcessor()
    try:
        with _LOAD_LOCK:
            processor.LoadFromSerializedProto(model)
    except (RuntimeError, OSError, ValueError) as e:
        raise ValueError(f"{where} is not a valid SentencePiece model: {e}") from e
    # Padding with 0 is only safe when encode can never emit 0, i.e. when id 0 is a
    # control symbol (T5's <pad>). Models whose id 0 is <unk> or a word would have
    # real tokens silently treated as padding downstream.
    if processor.GetPieceSize() > 0 and processor.pad_id() != PAD_ID and not processor.IsControl(PAD_ID):
        raise ValueError(
            f"{where} gives id {PAD_ID} to {processor.IdToPiece(PAD_ID)!r}, expected a padding/control "
            f"symbol: every t5x vocabulary pads with {PAD_ID}. Train the model with "
            "--pad_id=0 --eos_id=1 --unk_id=2 --bos_id=-1, as T5's models are."
        )
    return processor


class SentencePieceVocabulary(VocabularyBase):
    """A SentencePiece model, optionally with T5 sentinels (``<extra_id_k>``) on top.

    Same constructor, ids and properties as ``seqio.SentencePieceVocabulary``:
    ``extra_ids`` user-defined pieces ``▁<extra_id_k>`` are added after the
    model's own pieces, so ``<extra_id_k>`` is ``vocab_size - 1 - k``
    (``reverse_extra_ids=True``, the default) and the text ``<extra_id_k>``
    encodes to that id. ``vocab_size`` counts them.

    Decoding rules (Python and tf paths alike): ids are cut at the first EOS
    (the EOS itself dropped), padding is dropped, sentinels decode to their
    ``<extra_id_k>`` text, and **every id outside ``[0, vocab_size)`` decodes as
    ``unk_id``**, which SentencePiece renders as `` ⁇ ``. (seqio does the same for
    ids >= vocab_size; it raises on negative ids, which this class never does.)

    The tf path (``encode_tf``/``decode_tf``) calls the same SentencePiece
    processor as the Python path through ``tf.numpy_function``, without
    tensorflow-text, so both paths give identical ids for every input, ties
    included. seqio's tf path runs tensorflow-text's own SentencePiece build
    instead. Because of ``tf.numpy_function``, a ``tf.data`` pipeline that uses
    these methods cannot be serialised (tf.data service, ``Dataset.save``
    of the graph); it runs in the process that built it.

    Args:
      sentencepiece_model_file: path of the ``.model`` file (``scheme://`` paths,
        e.g. ``gs://``, are read through ``tf.io.gfile``).
      extra_ids: number of sentinel ids to add.
      normalizer_spec_overrides: a ``sentencepiece_model_pb2.NormalizerSpec``, or
        its serialized bytes, merged into the model's normalizer and
        denormalizer specs (the fields it sets replace the model's). Bytes need
        no protobuf at all: this class edits the model proto on the wire format.
      reverse_extra_ids: number sentinels downwards from the top (T5's layout).
        With False, ``<extra_id_0>`` is the first added id.

    Raises:
      FileNotFoundError: the model file does not exist (the message names it).
      ValueError: the file is not a SentencePiece model, its pad id is not 0, or
        ``normalizer_spec_overrides`` bytes are not a serialized NormalizerSpec.
      TypeError: an argument has the wrong type (the message names it).
    """

    def __init__(
        self,
        sentencepiece_model_file: str | os.PathLike[str],
        extra_ids: int = 0,
        normalizer_spec_overrides: Any = None,
        reverse_extra_ids: bool = True,
    ):
        if not isinstance(sentencepiece_model_file, str | os.PathLike):
            raise type_error(
                "sentencepiece_model_file", "a path (str or os.PathLike)", sentencepiece_model_file
            )
        path = os.fspath(sentencepiece_model_file)
        raw = _read_model_file(path)
        self._init(raw, path, extra_ids, normalizer_spec_overrides, reverse_extra_ids)

    @classmethod
    def from_model_proto(
        cls,
        sp_model: bytes,
        extra_ids: int = 0,
        normalizer_spec_overrides: Any = None,
        reverse_extra_ids: bool = True,
    ) -> SentencePieceVocabulary:
        """Builds a vocabulary from serialized model bytes instead of a file.

        Args:
          sp_model: the bytes of a ``.model`` file.
          extra_ids: as for the constructor.
          normalizer_spec_overrides: as for the constructor.
          reverse_extra_ids: as for the constructor.

        Returns:
          the vocabulary; ``sentencepiece_model_file`` is None.
        """
        if not isinstance(sp_model, bytes):
            raise type_error("sp_model", "bytes", sp_model)
        vocab = cls.__new__(cls)
        vocab._init(sp_model, None, extra_ids, normalizer_spec_overrides, reverse_extra_ids)
        return vocab

    def _init(
        self, raw: bytes, path: str | None, extra_ids: Any, overrides: Any, reverse_extra_ids: Any
    ) -> None:
        extra_ids = check_int("extra_ids", extra_ids or 0, minimum=0)
        if not isinstance(reverse_extra_ids, bool):
            raise type_error("reverse_extra_ids", "a bool", reverse_extra_ids)
        if overrides is None or isinstance(overrides, bytes):
            serialized_overrides = overrides
        elif hasattr(overrides, "SerializeToString"):  # a protobuf message, made by the caller
            serialized_overrides = overrides.SerializeToString(deterministic=True)
        else:
            raise type_error(
                "normalizer_spec_overrides",
                "a sentencepiece_model_pb2.NormalizerSpec or its serialized bytes",
                overrides,
            )
        if serialized_overrides is not None:
            try:
                check_normalizer_spec(serialized_overrides)
            except MalformedProto as e:
                raise ValueError(
                    f"normalizer_spec_overrides is not a valid serialized NormalizerSpec: {e}"
                ) from e
        where = f"SentencePiece model file {path!r}" if path is not None else "sp_model"
        self._path = path
        self._extra_ids = extra_ids
        self._reverse_extra_ids = reverse_extra_ids
        self._overrides = serialized_overrides
        self._sp_model = _with_extra_ids(raw, extra_ids, reverse_extra_ids, serialized_overrides, where)
        self._processor = _load_processor(self._sp_model, where)
        self._digest = hashlib.sha256(self._sp_model).hexdigest()

    # Pickling (gin deep-copies arguments) carries the model bytes, not the file name,
    # so an unpickled copy needs no file access.
    def __getstate__(self) -> dict[str, Any]:
        return {
            "path": self._path,
            "extra_ids": self._extra_ids,
            "reverse_extra_ids": self._reverse_extra_ids,
            "overrides": self._overrides,
            "sp_model": self._sp_model,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._path = state["path"]
        self._extra_ids = state["extra_ids"]
        self._reverse_extra_ids = state["reverse_extra_ids"]
        self._overrides = state["overrides"]
        self._sp_model = state["sp_model"]
        self._processor = _load_processor(self._sp_model, "sp_model")
        self._digest = hashlib.sha256(self._sp_model).hexdigest()

    # -- properties ----------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        """All ids, the model's pieces plus the sentinels."""
        return self._processor.GetPieceSize()

    @property
    def _base_vocab_size(self) -> int:
        # seqio's name: for SentencePiece it already counts the added sentinel pieces.
        return self._processor.GetPieceSize()

    @property
    def eos_id(self) -> int | None:
        eos = self._processor.eos_id()
        return None if eos < 0 else eos

    @property
    def unk_id(self) -> int | None:
        unk = self._processor.unk_id()
        return None if unk < 0 else unk

    @property
    def bos_id(self) -> int | None:
        bos = self._processor.bos_id()
        return None if bos < 0 else bos

    @property
    def extra_ids(self) -> int:
        return self._extra_ids

    @property
    def sp_model(self) -> bytes:
        """The serialized model proto in use, sentinels and overrides included."""
        return self._sp_model

    @property
    def sentencepiece_model_file(self) -> str | None:
        """The path the model was read from (None for ``from_model_proto``)."""
        return self._path

    @property
    def tokenizer(self) -> sentencepiece.SentencePieceProcessor:
        """The underlying ``sentencepiece.SentencePieceProcessor``."""
        return self._processor

    # -- hooks -----------------------------------------------------------------------------

    def _encode_one(self, s: str | bytes) -> list[int]:
        return self._processor.EncodeAsIds(s)

    def _encode_many(self, texts: list[str | bytes]) -> list[list[int]]:
        # SentencePiece's batch call starts a thread pool each time; that pays off
        # only from a dozen or so texts.
        if len(texts) < 16:
            return [self._processor.EncodeAsIds(t) for t in texts]
        return self._processor.Encode(cast(list[str], texts), out_type=int)  # bytes are accepted too

    def _clean(self, ids: np.ndarray) -> np.ndarray:
        ids = super()._clean(ids)
        outside = (ids < 0) | (ids >= self.vocab_size)
        if outside.any():
            unk = self.unk_id
            ids = ids[~outside] if unk is None else np.where(outside, unk, ids)
        return ids

    def _decode_clean(self, ids: np.ndarray) -> str:
        return self._processor.DecodeIds(ids.tolist())

    def _decode_many(self, rows: list[np.ndarray]) -> list[str]:
        if not rows:
            return []
        return self._processor.Decode([row.tolist() for row in rows])

    def _identity(self) -> tuple[Any, ...]:
        return (self._digest,)

    def __repr__(self) -> str:
        return (
            f"SentencePieceVocabulary(sentencepiece_model_file={self._path!r}, extra_ids={self._extra_ids}, "
            f"vocab_size={self.vocab_size}, sha256={self._digest[:12]})"
        )
