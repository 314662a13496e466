"""Output features of a task: which vocabulary, EOS, dtype and rank."""

from __future__ import annotations

import dataclasses
from typing import Any

from t5x.interfaces import Vocabulary
from t5x.tasks._lazy_tf import tf

# Names checked without TensorFlow; any other dtype is left to tf.as_dtype.
_COMMON_DTYPES = frozenset(
    {"int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "bool", "string"}
    | {"float16", "bfloat16", "float32", "float64", "complex64", "complex128"}
)


def _dtype_name(value: Any) -> str:
    """The canonical name of a dtype given as a name, a numpy dtype / type or a ``tf.DType``."""
    name = value if isinstance(value, str) else getattr(value, "name", None)  # np.dtype, tf.DType
    if isinstance(value, type):
        name = getattr(value, "__name__", None)  # np.int32, bool, ...
    if name in _COMMON_DTYPES:
        return name
    return tf.as_dtype(value).name  # rare dtypes: TensorFlow decides (TypeError when unknown)


class _LazyDType:
    """The ``dtype`` field: stored as a name, returned as a ``tf.DType`` (TensorFlow loads on first read)."""

    def __init__(self, default: str):
        self._default = default

    def __get__(self, obj: Any, owner: Any = None) -> Any:
        if obj is None:
            return self._default  # dataclasses read the default from the class
        return tf.as_dtype(obj.__dict__["_dtype_name"])

    def __set__(self, obj: Any, value: Any) -> None:
        obj.__dict__["_dtype_name"] = _dtype_name(value)


@dataclasses.dataclass(frozen=True, eq=False, repr=False)
class Feature:
    """An output feature of a Task (seqio's ``Feature``).

    Attributes:
      vocabulary: the Vocabulary that encodes and decodes this feature.
      add_eos: whether EOS is appended (by ``append_eos`` and friends).
      required: whether every example must hold this feature.
      dtype: the ``tf.DType`` of the tokenized feature (pass a ``tf.DType``,
        numpy dtype or name; ``int32`` by default).
      rank: the rank of the feature (1 for token sequences).
    """

    vocabulary: Vocabulary
    add_eos: bool = True
    required: bool = True
    dtype: Any = _LazyDType("int32")
    rank: int = 1

    def __post_init__(self) -> None:
        for member in ("vocab_size", "eos_id", "encode_tf", "decode"):
            if not hasattr(self.vocabulary, member):
                raise TypeError(
                    f"Feature.vocabulary must implement the t5x.interfaces.Vocabulary contract; "
                    f"{type(self.vocabulary).__name__} lacks {member!r}"
                )
        if not isinstance(self.rank, int) or self.rank < 0:
            raise ValueError(f"Feature.rank must be an int >= 0, got {self.rank!r}")

    @property
    def dtype_name(self) -> str:
        """The dtype's name (``"int32"``), without importing TensorFlow."""
        return self.__dict__["_dtype_name"]

    # Equality, hashing and repr go by the dtype's name, so comparing features
    # (as mixtures do when they are registered) needs no TensorFlow.
    def _key(self) -> tuple[Any, ...]:
        return (self.vocabulary, self.add_eos, self.required, self.dtype_name, self.rank)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._key() == other._key()  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return (
            f"Feature(vocabulary={self.vocabulary!r}, add_eos={self.add_eos}, required={self.required}, "
            f"dtype={self.dtype_name}, rank={self.rank})"
        )
