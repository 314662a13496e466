"""TensorStore zarr specs as stored in (and read from) a T5X index."""

from __future__ import annotations

import functools
import math
import os
import posixpath
from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np

from t5x.checkpointing._errors import CheckpointIntegrityError

# Chunks of at most 64 MiB: big enough for few files, small enough that a
# chunk never spans two devices' shards (each process writes whole chunks).
DESIRED_CHUNK_BYTES = 64 * 1024 * 1024

COMPRESSORS = ("gzip", "zstd", "none")


class UnsafeSpecError(CheckpointIntegrityError):
    """A TensorStore spec in an index points outside its checkpoint folder (a ``ValueError``)."""


@functools.lru_cache(maxsize=4096)
def _divisors(size: int) -> tuple[int, ...]:
    small = [d for d in range(1, math.isqrt(size) + 1) if size % d == 0]
    return tuple(sorted(set(small + [size // d for d in small])))


def choose_chunk_shape(
    write_shape: Sequence[int], itemsize: int, max_bytes: int = DESIRED_CHUNK_BYTES
) -> list[int]:
    """Largest chunk that evenly divides ``write_shape`` and fits ``max_bytes``.

    Repeatedly replaces the currently largest chunk dimension with its next
    smaller divisor, so chunks tile each shard exactly.

    Args:
      write_shape: the shape one device writes (a shard), ``[d0, d1, ...]``.
      itemsize: bytes per element.
      max_bytes: the chunk size limit.

    Returns:
      The chunk shape, same rank as ``write_shape`` (every entry >= 1).
    """
    return list(_chunk_shape(tuple(int(n) for n in write_shape), int(itemsize), int(max_bytes)))


@functools.lru_cache(maxsize=4096)
def _chunk_shape(write_shape: tuple[int, ...], itemsize: int, max_bytes: int) -> tuple[int, ...]:
    limit = max(1, max_bytes // max(1, itemsize))
    divisors = [list(_divisors(max(1, int(size)))) for size in write_shape]
    while math.prod(d[-1] for d in divisors) > limit:
        largest = max(range(len(divisors)), key=lambda i: divisors[i][-1])
        divisors[largest].pop()
    return tuple(d[-1] for d in divisors)


def compressor_json(compression: str) -> dict[str, Any] | None:
    """The zarr v2 ``compressor`` entry for ``compression``.

    Raises:
      ValueError: unknown name.
    """
    if compression == "gzip":
        return {"id": "gzip", "level": 1}
    if compression == "zstd":
        return {"id": "zstd", "level": 1}
    if compression == "none":
        return None
    raise ValueError(f"compression must be one of {COMPRESSORS}, got {compression!r}")


def make_spec(
    dir_name: str, shape: Sequence[int], dtype: Any, chunks: Sequence[int], compression: str
) -> dict[str, Any]:
    """The relative spec that the index stores for one TensorStore leaf.

    Args:
      dir_name: the leaf's folder inside the step folder (dotted state path).
      shape: the global array shape.
      dtype: the stored dtype (``bfloat16`` is stored natively, as in version 3).
      chunks: the zarr chunk shape.
      compression: ``"gzip"``, ``"zstd"`` or ``"none"``.

    Returns:
      A JSON-able dict with ``driver``, ``dtype``, ``kvstore`` and ``metadata``.
    """
    return {
        "driver": "zarr",
        "dtype": jnp.dtype(dtype).name,
        "kvstore": {"driver": "file", "path": dir_name},
        "metadata": {
            "chunks": [int(c) for c in chunks],
            "compressor": compressor_json(compression),
            "shape": [int(s) for s in shape],
        },
    }


def is_spec(value: Any) -> bool:
    """Whether an index leaf is a TensorStore spec (rather than an inline value)."""
    return isinstance(value, dict) and {"driver", "kvstore"} <= value.keys()


def _safe_relative(path: str, where: str) -> str:
    if not isinstance(path, str) or not path:
        raise UnsafeSpecError(
            f"{where}: TensorStore path must be a non-empty string, got {path!r}", name=where
        )
    if "/" not in path and "\\" not in path and path not in (".", ".."):
        return path  # a plain folder name (the usual dotted state path): already normal and inside
    normal = posixpath.normpath(path.replace("\\", "/"))
    if posixpath.isabs(normal) or normal == ".." or normal.startswith("../") or "://" in path:
        raise UnsafeSpecError(
            f"{where}: TensorStore path {path!r} escapes the checkpoint folder", name=where, path=path
        )
    return normal


def relative_path(spec: dict[str, Any], where: str) -> str:
    """The array folder a stored spec names, relative to the step folder (normalised).

    Raises:
      UnsafeSpecError: the path is absolute, a URL, or climbs out with ``..``.
      ValueError: the spec has no path at all.
    """
    kvstore = spec.get("kvstore")
    if isinstance(kvstore, dict) and "path" in kvstore:
        relative = kvstore["path"]
    elif "path" in spec:
        relative = spec["path"]
    else:
        raise ValueError(f"{where}: TensorStore spec has neither kvstore.path nor path: {spec!r}")
    return _safe_relative(relative, where)


def resolve_spec(spec: dict[str, Any], step_dir: str, where: str) -> dict[str, Any]:
    """Turns a stored relative spec into one that opens files under ``step_dir``.

    Accepts the current layout (``kvstore.path``) and the one written by
    TensorStore < 0.1.14 (top-level ``path``). Any kvstore driver (``file``,
    ``gfile``, ``gcs``) is read from the local folder: the bucket name in a
    spec is a placeholder, the files sit next to the index.

    Args:
      spec: the spec dict from the index.
      step_dir: the checkpoint step folder.
      where: the leaf's name, for error messages.

    Returns:
      A new spec dict with an absolute ``file`` kvstore.

    Raises:
      UnsafeSpecError: the path is absolute, a URL, or climbs out with ``..``.
      ValueError: the spec has no path at all.
    """
    resolved = {key: value for key, value in spec.items() if key not in ("path", "kvstore")}
    relative = relative_path(spec, where)
    resolved["kvstore"] = {"driver": "file", "path": os.path.join(os.path.abspath(step_dir), relative) + "/"}
    resolved.pop("transform", None)
    if "metadata" in resolved:
        # Only the fields that identify the array: let the stored .zarray win.
        resolved["metadata"] = {k: v for k, v in resolved["metadata"].items() if k in ("shape",)}
    return resolved


def spec_shape(spec: dict[str, Any]) -> tuple[int, ...] | None:
    """The array shape a spec declares, when it declares one."""
    shape = spec.get("metadata", {}).get("shape")
    return None if shape is None else tuple(int(s) for s in shape)


def spec_dtype(spec: dict[str, Any]) -> np.dtype | None:
    """The dtype a spec declares, when it declares one."""
    name = spec.get("dtype")
    return None if name is None else np.dtype(jnp.dtype(name))
