"""Reading a step folder's checksum manifest (``checksums.json``; its layout is in ``_integrity``).

A reader sees every manifest in version 2's form: array records that point at
shared ``.zarray`` bodies. Version 1 manifests are converted on load
(``_manifest_v1``). The per-body facts every array of a body shares (its
stored dtype, its chunk file separator, the whole ``.zarray`` of one shape)
are worked out once per body, not once per array.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp
import numpy as np
import xxhash

from t5x.checkpointing import _manifest_v1
from t5x.checkpointing._errors import CheckpointIntegrityError

MANIFEST_FILE = "checksums.json"
MANIFEST_FORMAT = "t5x-checkpointing/checksums"
MANIFEST_VERSION = 2  # 2: .zarray bodies shared between arrays; 1: one whole .zarray per array
ALGORITHM = "xxh3_64"
ZARRAY = ".zarray"


def digest_bytes(data: bytes) -> str:
    """XXH3-64 (hex) of raw bytes."""
    return xxhash.xxh3_64_hexdigest(data)


def inside(path: str, root: str) -> bool:
    """Whether a resolved ``path`` is ``root`` or lies below it."""
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _zarr_dtype(value: Any) -> np.dtype | None:
    try:
        return np.dtype(value)
    except TypeError:
        try:
            return np.dtype(jnp.dtype(value))
        except TypeError:
            return None


@dataclasses.dataclass
class Body:
    """One shared ``.zarray`` body (everything but ``shape`` and ``chunks``) and what follows from it.

    Attributes:
      fields: the body as recorded.
      dtype: its stored dtype (None: not one numpy knows).
      separator: the chunk file names' separator.
    """

    fields: dict[str, Any]
    dtype: np.dtype | None
    separator: str

    def whole(self, shape: list[int], chunks: list[int]) -> dict[str, Any]:
        """The whole ``.zarray`` of an array of this body."""
        return {**self.fields, "shape": shape, "chunks": chunks}


@dataclasses.dataclass
class Manifest:
    """A step folder's loaded ``checksums.json``.

    Attributes:
      path: the manifest file.
      files: ``{file name: {"bytes", "digest"}}``.
      arrays: ``{array folder: {"zarray": body index, "shape", "chunk_shape", "chunks"}}``
        (version 2's records; version 1's are converted to them).
      zarrays: the shared ``.zarray`` bodies.
    """

    path: str
    files: dict[str, Any]
    arrays: dict[str, Any]
    zarrays: list[dict[str, Any]]
    _bodies: dict[int, Body] = dataclasses.field(default_factory=dict, repr=False)

    def body(self, record: Mapping[str, Any]) -> Body | None:
        """The body an array record points at (None: its index is not one)."""
        index = record.get("zarray")
        if type(index) is not int or not 0 <= index < len(self.zarrays):
            return None
        body = self._bodies.get(index)
        if body is None:
            fields = self.zarrays[index]
            body = self._bodies[index] = Body(
                fields, _zarr_dtype(fields.get("dtype")), fields.get("dimension_separator") or "."
            )
        return body

    def zarray(self, folder: str) -> dict[str, Any] | None:
        """The whole ``.zarray`` recorded for an array folder (None: no usable record)."""
        record = self.arrays.get(folder)
        if not isinstance(record, dict) or "shape" not in record or "chunk_shape" not in record:
            return None
        body = self.body(record)
        return None if body is None else body.whole(record["shape"], record["chunk_shape"])

    def check_file(self, name: str, data: bytes, path: str, *, required: bool) -> None:
        """Compares a file's bytes with its record.

        Raises:
          CheckpointIntegrityError: the digest or length differs, or a
            ``required`` file has no record.
        """
        record = self.files.get(name)
        if record is None:
            if required:
                raise CheckpointIntegrityError(
                    f"{path}: the checksum manifest {self.path} has no record of it", path=path
                )
            return
        found = digest_bytes(data)
        if found != record.get("digest") or len(data) != record.get("bytes"):
            raise CheckpointIntegrityError(
                f"{path} changed since it was written: expected {record.get('bytes')} bytes with "
                f"{ALGORITHM} {record.get('digest')}, found {len(data)} bytes with {ALGORITHM} {found}",
                path=path,
            )


# The last manifest parsed, with its path and bytes: reused only for identical bytes.
_last_manifest: tuple[str, bytes, Manifest] | None = None


def load_manifest(step_dir: str) -> Manifest | None:
    """The step folder's manifest, or None when it has none (upstream or older checkpoints).

    Raises:
      CheckpointIntegrityError: the manifest exists but cannot be used.
    """
    global _last_manifest
    path = os.path.join(step_dir, MANIFEST_FILE)
    if not os.path.lexists(path):
        return None
    step_real = os.path.realpath(step_dir)
    real = os.path.realpath(path)
    if not inside(real, step_real):
        raise CheckpointIntegrityError(
            f"the checksum manifest {path} resolves to {real}, outside the step folder {step_real}", path=path
        )
    try:
        with open(path, "rb") as handle:
            raw = handle.read()
    except OSError as error:
        raise CheckpointIntegrityError(
            f"cannot read the checksum manifest {path}: {error}", path=path
        ) from error
    last = _last_manifest
    if last is not None and last[0] == path and last[1] == raw:
        return last[2]  # the same bytes as last time (a restore reads it for arrays and input state)
    manifest = _parse_manifest(path, raw)
    _last_manifest = (path, raw, manifest)
    return manifest


def _parse_manifest(path: str, raw: bytes) -> Manifest:
    try:
        value = json.loads(raw)
        if not isinstance(value, dict):
            raise ValueError(f"expected a JSON object, found {type(value).__name__}")
    except ValueError as error:
        raise CheckpointIntegrityError(
            f"the checksum manifest {path} is damaged: {error}", path=path
        ) from error
    if value.get("format") != MANIFEST_FORMAT:
        raise CheckpointIntegrityError(
            f"{path}: expected format {MANIFEST_FORMAT!r}, found {value.get('format')!r}", path=path
        )
    version = value.get("version")
    if not isinstance(version, int) or version > MANIFEST_VERSION:
        raise CheckpointIntegrityError(
            f"{path}: checksum manifest version {version!r} is newer than this reader's "
            f"({MANIFEST_VERSION}); upgrade t5x-checkpointing or pass verify=False",
            path=path,
        )
    if value.get("algorithm") != ALGORITHM:
        raise CheckpointIntegrityError(
            f"{path}: expected checksum algorithm {ALGORITHM!r}, found {value.get('algorithm')!r}", path=path
        )
    files, arrays = value.get("files"), value.get("arrays")
    if not isinstance(files, dict) or not isinstance(arrays, dict):
        raise CheckpointIntegrityError(
            f"the checksum manifest {path} is damaged: no 'files' / 'arrays'", path=path
        )
    if version >= 2:
        bodies = value.get("zarrays")
        if not isinstance(bodies, list) or not all(isinstance(body, dict) for body in bodies):
            raise CheckpointIntegrityError(
                f"the checksum manifest {path} is damaged: 'zarrays' must be a list of objects", path=path
            )
    else:
        arrays, bodies = _manifest_v1.as_version_2(arrays)
    return Manifest(path=path, files=files, arrays=arrays, zarrays=bodies)
