"""The Vocabulary contract: text <-> integer ids, in Python and in tf.data."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable


@runtime_checkable
class Vocabulary(Protocol):
    """Maps text to token ids and back.

    Id layout, shared by every implementation:

    * ``pad_id`` is 0 and is never produced by ``encode``.
    * ids are in ``[0, vocab_size)``; the last ``extra_ids`` of them are sentinel
      ids, where sentinel ``k`` (``<extra_id_k>`` in T5) is ``vocab_size - 1 - k``.
    * ``encode`` never appends EOS; tasks add it when a feature asks for it.
    * ``decode`` stops at the first ``eos_id`` (dropping it and everything after),
      drops ``pad_id``, and never raises on an in-range id. What it makes of ids
      outside ``[0, vocab_size)`` is documented by each implementation.

    Two vocabularies compare equal (``==``) exactly when they map every text to
    the same ids; tasks use this to check a model's vocabulary against theirs.

    The ``*_tf`` methods work on ``tf.Tensor``s inside ``tf.data`` (graph mode,
    ``Dataset.map(..., num_parallel_calls=AUTOTUNE)``) and agree with the Python
    methods. TensorFlow is imported only when one of them is first called.
    """

    @property
    def vocab_size(self) -> int:
        """The number of ids, sentinels included."""
        ...

    @property
    def pad_id(self) -> int:
        """The padding id (0)."""
        ...

    @property
    def eos_id(self) -> int | None:
        """The end-of-sequence id, or None when the vocabulary has none."""
        ...

    @property
    def unk_id(self) -> int | None:
        """The id of unknown pieces, or None when the vocabulary has none."""
        ...

    @property
    def extra_ids(self) -> int:
        """How many sentinel ids sit at the top of the id range."""
        ...

    def encode(self, s: str) -> list[int]:
        """Returns the ids of ``s``, without EOS."""
        ...

    def decode(self, ids: Sequence[int]) -> str:
        """Returns the text of ``ids``, stopping at the first EOS."""
        ...

    def encode_tf(self, s: Any) -> Any:
        """Encodes a string tensor.

        Args:
          s: a ``tf.string`` scalar, or a tensor of strings of any rank.

        Returns:
          ``tf.int32`` ids: a 1-D tensor for a scalar, else a ``tf.RaggedTensor``
          with one more (ragged) dimension than ``s``.
        """
        ...

    def decode_tf(self, ids: Any) -> Any:
        """Decodes an id tensor (dense or ragged) whose last dimension is tokens.

        Returns:
          a ``tf.string`` tensor with the last dimension removed.
        """
        ...
