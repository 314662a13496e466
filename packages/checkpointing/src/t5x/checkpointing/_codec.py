"""The msgpack encoding of the T5X ``checkpoint`` index file.

The index is a msgpack map. Arrays small enough to live inside it are msgpack
extension objects laid out the way ``flax.serialization`` lays them out, so
that upstream T5X (which reads the index with flax) and this package read each
other's files:

* ext code 1 (ndarray): the payload is itself msgpack of
  ``[shape list, dtype name, raw little-endian bytes]``;
* ext code 2 (complex): msgpack of ``[real, imag]``;
* ext code 3 (numpy scalar): like code 1 with an empty shape.

Arrays larger than 1 GiB are stored by flax as a map tagged
``__msgpack_chunked_array__``; those are reassembled on read. Nothing here can
execute code: unknown extension codes are an error, not a pickle fallback.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import msgpack
import numpy as np

from t5x.checkpointing._errors import CheckpointIntegrityError

_EXT_NDARRAY = 1
_EXT_COMPLEX = 2
_EXT_NPSCALAR = 3
_CHUNKED_TAG = "__msgpack_chunked_array__"


class CorruptIndexError(CheckpointIntegrityError):
    """The ``checkpoint`` index file cannot be decoded (a ``ValueError``)."""


def _dtype_from_name(name: str) -> np.dtype:
    # jnp.dtype knows the ml_dtypes names (bfloat16, float8_*) numpy lacks.
    return np.dtype(jnp.dtype(name))


def _array_payload(array: np.ndarray) -> bytes:
    # (np.ascontiguousarray would turn a 0-d array into shape [1].)
    array = np.asarray(array)
    if not array.flags.c_contiguous:
        array = array.copy(order="C")
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    return msgpack.packb([list(array.shape), array.dtype.name, array.tobytes()], use_bin_type=True)


def _default(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return msgpack.ExtType(_EXT_NDARRAY, _array_payload(value))
    if isinstance(value, np.generic):
        return msgpack.ExtType(_EXT_NPSCALAR, _array_payload(np.asarray(value)))
    if isinstance(value, complex):
        return msgpack.ExtType(_EXT_COMPLEX, msgpack.packb([value.real, value.imag]))
    if hasattr(value, "__array__") and hasattr(value, "dtype"):
        return msgpack.ExtType(_EXT_NDARRAY, _array_payload(np.asarray(value)))
    raise TypeError(f"cannot store a {type(value).__name__} in a T5X checkpoint index: {value!r}")


def _ext_hook(code: int, data: bytes) -> Any:
    if code in (_EXT_NDARRAY, _EXT_NPSCALAR):
        shape, dtype_name, buffer = msgpack.unpackb(data, raw=True)
        if isinstance(dtype_name, bytes):
            dtype_name = dtype_name.decode("ascii")
        array = np.frombuffer(buffer, dtype=_dtype_from_name(dtype_name)).reshape(tuple(shape)).copy()
        return array[()] if code == _EXT_NPSCALAR else array
    if code == _EXT_COMPLEX:
        real, imag = msgpack.unpackb(data)
        return complex(real, imag)
    raise CorruptIndexError(f"unknown msgpack extension type {code} in checkpoint index (expected 1, 2 or 3)")


def _unchunk(tree: Any) -> Any:
    if not isinstance(tree, dict):
        return tree
    if tree.get(_CHUNKED_TAG):
        shape = tuple(tree["shape"][str(i)] for i in range(len(tree["shape"])))
        chunks = [tree["chunks"][str(i)] for i in range(len(tree["chunks"]))]
        return np.concatenate([np.ravel(c) for c in chunks]).reshape(shape)
    return {key: _unchunk(value) for key, value in tree.items()}


def encode_index(tree: dict[str, Any]) -> bytes:
    """Encodes a nested dict of ints, floats, strings, lists and arrays.

    Args:
      tree: nested ``dict`` with string keys; leaves are Python scalars,
        strings, lists (kept as msgpack arrays, as for TensorStore specs) or
        numpy arrays of any shape.

    Returns:
      The msgpack bytes.

    Raises:
      TypeError: a leaf has a type that cannot be stored (names it).
    """
    return msgpack.packb(tree, default=_default, use_bin_type=True, strict_types=False)


def decode_index(data: bytes, source: str = "checkpoint") -> dict[str, Any]:
    """Decodes index bytes written by :func:`encode_index` or by flax.

    Args:
      data: the file's bytes.
      source: the file name, for error messages.

    Returns:
      The nested dict, arrays as numpy arrays.

    Raises:
      CorruptIndexError: the bytes are not a msgpack map (names ``source``).
    """
    if data.startswith(b"model_checkpoint_path"):
        raise CorruptIndexError(f"{source} is a TensorFlow checkpoint index, not a T5X msgpack index")
    try:
        tree = msgpack.unpackb(data, ext_hook=_ext_hook, raw=False, strict_map_key=False)
    except CorruptIndexError:
        raise
    except Exception as error:  # msgpack raises several unrelated types on bad input
        raise CorruptIndexError(f"{source} is not a valid msgpack checkpoint index: {error}") from error
    if not isinstance(tree, dict):
        raise CorruptIndexError(f"{source} must hold a msgpack map, found {type(tree).__name__}")
    return _unchunk(tree)
