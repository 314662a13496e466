"""Checking one array folder of a step before TensorStore opens it, and its chunks as they are read.

Containment (every array folder and every link in it stays inside the step
folder) is checked with checksums or without. With a checksum manifest, an
array's shape, chunks and dtype come from its record; the facts its whole
dtype group shares (stored dtype, chunk file separator) are looked up once per
group (``_manifest.Body``), and the chunk grid once per shape and chunk shape,
so the per-array work is a few lookups and one listing of the folder.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import math
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from t5x.checkpointing._errors import CheckpointIntegrityError
from t5x.checkpointing._integrity import (
    Box,
    _chunk_slices,
    _grid_range,
    _normal,
    _read_small,
    all_chunk_keys,
    chunk_key,
    digest,
)
from t5x.checkpointing._manifest import ALGORITHM, ZARRAY, Manifest, _zarr_dtype, inside


def _show(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


@dataclasses.dataclass
class ArrayCheck:
    """What a reader checks of one array's chunks as TensorStore returns them.

    Attributes:
      name: the parameter's dotted state path.
      folder: the array folder (as named in the index, under the step folder).
      shape: the array shape.
      chunks: the chunk shape.
      separator: the chunk file names' separator.
      expected: ``{chunk key: digest}``, or None (no checksums: unverified).
      written: the ``.zarray`` recorded at save (None: no checksums). Readers
        hand it to TensorStore as the metadata the array must have, so the
        file is compared while TensorStore reads it anyway, not read twice.
    """

    name: str
    folder: str
    shape: tuple[int, ...]
    chunks: tuple[int, ...]
    separator: str
    expected: dict[str, str] | None
    written: dict[str, Any] | None = None

    def metadata_problem(self) -> CheckpointIntegrityError | None:
        """How the array's ``.zarray`` differs from the recorded one (None: it does not, or none recorded).

        Called when TensorStore refuses to open the array, to name what changed.
        """
        if self.written is None:
            return None
        path = os.path.join(self.folder, ZARRAY)
        try:
            found = json.loads(_read_small(path))
            if not isinstance(found, dict):
                raise ValueError(f"expected a JSON object, found {type(found).__name__}")
        except (OSError, ValueError) as error:
            return CheckpointIntegrityError(
                f"{self.name}: {path} is unreadable: {error}", name=self.name, path=path
            )
        if found == self.written:
            return None
        return _changed_zarray(self.name, path, self.written, found)

    def chunk_file(self, key: str) -> str:
        return os.path.join(self.folder, self.separator.join(key.split(".")))

    def aligned(self, index: Sequence[slice] | None) -> Box:
        """The smallest box of whole chunks covering ``index`` (the whole array for None)."""
        if index is None:
            return tuple(slice(0, n) for n in self.shape)
        out = []
        for s, n, c in zip(index, self.shape, self.chunks):
            start, stop, step = s.indices(n)
            if step != 1:
                start, stop = 0, n
            out.append(slice(start // c * c, min(n, -(-max(start, stop) // c) * c)))
        return tuple(out)

    def boxes(self) -> Iterator[tuple[str, Box]]:
        """Every chunk: ``(key, box)``."""
        ranges = [range(math.ceil(n / c)) for n, c in zip(self.shape, self.chunks)]
        for position in itertools.product(*ranges):
            yield chunk_key(position), _chunk_slices(position, self.shape, self.chunks)

    def verify(self, box: Box | None, data: np.ndarray) -> int:
        """Checks every chunk inside ``box`` (chunk-aligned; None: the whole array) against its digest.

        Returns:
          The number of chunks checked.

        Raises:
          CheckpointIntegrityError: a digest differs (names the chunk file).
        """
        if self.expected is None:
            return 0
        if len(self.expected) == 1 and data.shape == self.shape:  # the usual case: one chunk, read whole
            ((only, recorded),) = self.expected.items()
            found = digest(data)
            if found != recorded:
                self._mismatch(only, recorded, found)
            return 1
        bounds = _normal(self.aligned(None) if box is None else box, self.shape)
        ranges = [
            _grid_range(start, stop, n, c, whole=True)
            for (start, stop), n, c in zip(bounds, self.shape, self.chunks)
        ]
        count = 0
        for position in itertools.product(*ranges):
            chunk = _chunk_slices(position, self.shape, self.chunks)
            local = tuple(slice(b.start - start, b.stop - start) for b, (start, _) in zip(chunk, bounds))
            key = chunk_key(position)
            want = self.expected.get(key)
            found = digest(data[local])
            if found != want:
                self._mismatch(key, want, found)
            count += 1
        return count

    def _mismatch(self, key: str, want: str | None, found: str) -> None:
        path = self.chunk_file(key)
        raise CheckpointIntegrityError(
            f"{self.name}: chunk file {path} does not hold what was written: expected "
            f"{ALGORITHM} {want}, found {found} (the chunk's decoded values differ)",
            name=self.name,
            path=path,
        )


def _changed_zarray(name: str, path: str, written: Any, found: Mapping[str, Any]) -> CheckpointIntegrityError:
    written = written if isinstance(written, dict) else {}
    keys = sorted(set(found) | set(written), key=str)
    changes = [
        f"{key} expected {_show(written.get(key, '<absent>'))}, found {_show(found.get(key, '<absent>'))}"
        for key in keys
        if found.get(key, "<absent>") != written.get(key, "<absent>")
    ]
    return CheckpointIntegrityError(
        f"{name}: {path} differs from the metadata written with the checkpoint: " + "; ".join(changes),
        name=name,
        path=path,
    )


def _parse_zarray(name: str, path: str, real: str) -> dict[str, Any]:
    try:
        zarray = json.loads(_read_small(real))
        if not isinstance(zarray, dict):
            raise ValueError(f"expected a JSON object, found {type(zarray).__name__}")
    except (OSError, ValueError) as error:
        raise CheckpointIntegrityError(
            f"{name}: {path} is unreadable: {error}", name=name, path=path
        ) from error
    return zarray


_DTYPES: dict[str, np.dtype | None] = {}


def _stored_dtype(value: Any) -> np.dtype | None:
    if not isinstance(value, str):
        return _zarr_dtype(value)
    if value not in _DTYPES:
        _DTYPES[value] = _zarr_dtype(value)
    return _DTYPES[value]


@functools.lru_cache(maxsize=1024)
def _grid_of(
    shape: tuple[Any, ...], chunks: tuple[Any, ...]
) -> tuple[tuple[int, ...], tuple[int, ...], tuple[str, ...]]:
    ints, chunk_ints = tuple([int(n) for n in shape]), tuple([int(c) for c in chunks])
    if len(chunk_ints) != len(ints) or (chunk_ints and min(chunk_ints) < 1):
        raise ValueError(f"chunks {chunk_ints} do not fit shape {ints}")
    return ints, chunk_ints, tuple(all_chunk_keys(ints, chunk_ints))


def chunk_grid(shape: Any, chunks: Any) -> tuple[tuple[int, ...], tuple[int, ...], tuple[str, ...]]:
    """``(shape, chunk shape, every chunk key)`` of recorded shape / chunk lists (computed once per pair).

    Raises:
      ValueError: not lists of integers of one length, or a chunk size under 1.
    """
    try:
        return _grid_of(tuple(shape), tuple(chunks))
    except TypeError as error:  # not sequences, or unhashable entries
        raise ValueError(f"shape {shape!r} / chunks {chunks!r} are not lists of integers") from error


def _contained_listing(
    name: str,
    folder: str,
    step_real: str,
    step_entries: Mapping[str, os.DirEntry[str]] | None,
    verify: bool,
) -> dict[str, os.DirEntry[str]] | None:
    """The array folder's entries, once it and every link in it resolve inside the step folder.

    Returns None for a missing folder when not verifying (TensorStore reports it).
    """
    entry = None if step_entries is None else step_entries.get(os.path.basename(folder))
    if entry is not None and not entry.is_symlink() and entry.is_dir():
        real = os.path.join(step_real, entry.name)  # a plain folder right in the step folder
    else:
        real = os.path.realpath(folder)
    if not inside(real, step_real):
        raise CheckpointIntegrityError(
            f"{name}: array folder {folder} resolves to {real}, outside the step folder {step_real}",
            name=name,
            path=folder,
        )
    try:
        with os.scandir(real) as scan:
            entries = {entry.name: entry for entry in scan}
    except (FileNotFoundError, NotADirectoryError) as error:
        if not verify:
            return None
        raise CheckpointIntegrityError(
            f"{name}: array folder {folder} is missing (expected the zarr array written with the checkpoint)",
            name=name,
            path=folder,
        ) from error
    for entry in entries.values():
        if entry.is_symlink():
            target = os.path.realpath(entry.path)
            if not inside(target, step_real):
                path = os.path.join(folder, entry.name)
                raise CheckpointIntegrityError(
                    f"{name}: {path} is a link to {target}, outside the step folder {step_real}",
                    name=name,
                    path=path,
                )
    return entries


def check_array(
    name: str,
    folder: str,
    step_real: str,
    *,
    index_shape: tuple[int, ...] | None,
    index_dtype: np.dtype | None,
    record: Mapping[str, Any] | None,
    verify: bool,
    manifest: Manifest | None = None,
    step_entries: Mapping[str, os.DirEntry[str]] | None = None,
) -> ArrayCheck | None:
    """Checks one array folder before TensorStore opens it.

    Always: the folder and every link inside it resolve inside the step folder.
    With ``verify``: the ``.zarray`` is there, its shape and dtype agree with
    the index, and every recorded chunk file exists. With a ``record``, the
    shape, chunks and dtype are the recorded ``.zarray``'s, and the file itself
    is compared with it when TensorStore opens the array (see
    :attr:`ArrayCheck.written`); without one, the file is read here.

    Args:
      name: the parameter's dotted state path (for messages).
      folder: the array folder (under the step folder, as the index names it).
      step_real: the step folder's resolved path.
      index_shape / index_dtype: what the index declares (None: not declared).
      record: the manifest's entry for this array, or None (unverified).
      verify: run the metadata and file checks.
      manifest: the manifest ``record`` comes from (its shared ``.zarray`` bodies).
      step_entries: the step folder's entries by name (from one scan), when
        ``folder`` is directly inside it: a plain folder there needs no resolving.

    Returns:
      What to check of the chunks as they are read (None without ``verify``).

    Raises:
      CheckpointIntegrityError: names the parameter, the file, expected and found.
    """
    folder = folder.rstrip("/")
    entries = _contained_listing(name, folder, step_real, step_entries, verify)
    if entries is None or not verify:
        return None
    zarray_path = folder + os.sep + ZARRAY
    if ZARRAY not in entries:
        raise CheckpointIntegrityError(
            f"{name}: {zarray_path} is missing (expected the array's zarr metadata)",
            name=name,
            path=zarray_path,
        )
    if record is None or manifest is None:
        return _check_unrecorded(name, folder, zarray_path, index_shape, index_dtype, entries)
    body = manifest.body(record) if isinstance(record, dict) else None
    if body is None or "shape" not in record or "chunk_shape" not in record:
        raise CheckpointIntegrityError(
            f"{name}: the checksum manifest has no .zarray record for {folder}", name=name, path=folder
        )
    try:
        shape, chunks, keys = chunk_grid(record["shape"], record["chunk_shape"])
    except ValueError as error:
        raise CheckpointIntegrityError(
            f"{name}: the checksum manifest's record of {zarray_path} has no valid shape / chunks: {error}",
            name=name,
            path=zarray_path,
        ) from error
    _check_index_fit(name, zarray_path, index_shape, index_dtype, shape, body.dtype, body.fields.get("dtype"))
    expected = record.get("chunks")
    if not isinstance(expected, dict):
        raise CheckpointIntegrityError(
            f"{name}: the checksum manifest has no chunk list for {folder}", name=name, path=folder
        )
    if len(expected) != len(keys) or not (
        keys[0] in expected if len(keys) == 1 else expected.keys() >= set(keys)
    ):
        raise CheckpointIntegrityError(
            f"{name}: the checksum manifest records {len(expected)} chunks for {folder}, "
            f"its shape {shape} and chunks {chunks} make {len(keys)}",
            name=name,
            path=folder,
        )
    separator = body.separator
    for key in keys:
        file_name = key if separator == "." else key.replace(".", separator)
        chunk_entry = entries.get(file_name)
        if chunk_entry is None or not chunk_entry.is_file():
            path = os.path.join(folder, file_name)
            missing = sum(1 for k in keys if k.replace(".", separator) not in entries)
            more = f" ({missing} of {len(keys)} chunk files are missing)" if missing > 1 else ""
            raise CheckpointIntegrityError(
                f"{name}: chunk file {path} is missing: expected the chunk written with "
                f"{ALGORITHM} {expected[key]}, found no file{more}",
                name=name,
                path=path,
            )
    written = body.whole(list(shape), list(chunks))
    return ArrayCheck(name, folder, shape, chunks, separator, expected, written=written)


def _check_index_fit(
    name: str,
    zarray_path: str,
    index_shape: tuple[int, ...] | None,
    index_dtype: np.dtype | None,
    shape: tuple[int, ...],
    dtype: np.dtype | None,
    dtype_field: Any,
) -> None:
    """Refuses an array whose shape or dtype is not what the index declares."""
    if index_shape is not None and tuple(index_shape) != shape:
        raise CheckpointIntegrityError(
            f"{name}: shape mismatch between the index and {zarray_path}: the index expects "
            f"{tuple(index_shape)}, the array has {shape}",
            name=name,
            path=zarray_path,
        )
    if index_dtype is not None and dtype != index_dtype:
        raise CheckpointIntegrityError(
            f"{name}: dtype mismatch between the index and {zarray_path}: the index expects "
            f"{np.dtype(index_dtype).name}, the array has {dtype_field!r}",
            name=name,
            path=zarray_path,
        )


def _check_unrecorded(
    name: str,
    folder: str,
    zarray_path: str,
    index_shape: tuple[int, ...] | None,
    index_dtype: np.dtype | None,
    entries: Mapping[str, os.DirEntry[str]],
) -> ArrayCheck:
    """An array without checksums (no manifest): its own ``.zarray`` must fit the index."""
    zarray = _parse_zarray(name, zarray_path, entries[ZARRAY].path)
    try:
        shape, chunks, _ = chunk_grid(zarray["shape"], zarray["chunks"])
    except (KeyError, ValueError) as error:
        raise CheckpointIntegrityError(
            f"{name}: {zarray_path} has no valid shape / chunks: {error}", name=name, path=zarray_path
        ) from error
    dtype_field = zarray.get("dtype")
    _check_index_fit(
        name, zarray_path, index_shape, index_dtype, shape, _stored_dtype(dtype_field), dtype_field
    )
    return ArrayCheck(name, folder, shape, chunks, zarray.get("dimension_separator") or ".", None)


def check_tree_contained(root: str, step_real: str) -> None:
    """Refuses any link under ``root`` that resolves outside the step folder (Orbax layout).

    Raises:
      CheckpointIntegrityError: names the link and where it leads.
    """
    real = os.path.realpath(root)
    if not inside(real, step_real):
        raise CheckpointIntegrityError(
            f"{root} resolves to {real}, outside the step folder {step_real}", path=root
        )
    pending = [root]
    while pending:
        folder = pending.pop()
        with os.scandir(folder) as entries:
            for entry in entries:
                if entry.is_symlink():
                    target = os.path.realpath(entry.path)
                    if not inside(target, step_real):
                        raise CheckpointIntegrityError(
                            f"{entry.path} is a link to {target}, outside the step folder {step_real}",
                            path=entry.path,
                        )
                elif entry.is_dir():
                    pending.append(entry.path)
