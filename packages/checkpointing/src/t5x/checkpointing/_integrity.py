"""Checksums of a step folder's arrays: written with every save, checked on every read.

A save writes ``checkpoint_<step>/checksums.json`` (the *manifest*) next to the
index, before the folder is renamed into place::

    {"format": "t5x-checkpointing/checksums", "version": 2, "algorithm": "xxh3_64",
     "files": {"checkpoint": {"bytes": 1234, "digest": "0f1e..."},
               "train_ds-000-of-001.json": {...}},
     "zarrays": [{... a .zarray as TensorStore wrote it, without shape and chunks ...}],
     "arrays": {"target.encoder.layers_0.attention.query.kernel": {
                   "zarray": 0, "shape": [512, 512], "chunk_shape": [512, 512],
                   "chunks": {"0.0": "9a3c...", "0.1": "..."}}}}

An array's ``.zarray`` is ``zarrays[zarray]`` with its ``shape`` and
``chunk_shape`` as ``shape`` and ``chunks``: the arrays of one dtype share one
body, so the manifest holds a few ``.zarray`` bodies, not one per array.
Version 1 (still read) recorded each array's whole ``.zarray`` as ``"zarray":
{...}`` with ``"zarray_digest"``, the digest of its file, which no reader used.

Arrays are keyed by their folder (the index spec's path); chunks by their grid
position joined with ``.`` (the file name uses the ``.zarray``'s separator). A
chunk's digest is XXH3-64 of its *decoded* contents: the chunk's elements inside
the array's bounds, C order, in the stored dtype, little-endian. Digesting the
decoded values (not the compressed file) lets a reader check what TensorStore
hands back without reading any file twice, and any change to a file that alters
a value (or stops it decoding) is caught. Files are keyed by name and digested
as bytes.

This module digests chunks and writes the manifest; ``_manifest`` reads it
(``_manifest_v1`` converts version 1), ``_array_checks`` checks each array
folder against it and each chunk as it is read.

The cost is kept to what only checksums need. The writer records each
``.zarray`` without reading every one back (see ``_Zarrays``). A reader hands
the recorded ``.zarray`` to TensorStore as the metadata the array must have:
TensorStore reads the file anyway and refuses the array if any field that
decides how chunks decode differs; only then is the file read here, to name
what changed. Chunk files are checked against one listing per array folder
(taken for the containment check anyway), and digests are compared as the reads
finish, while TensorStore goes on with the others.

Neither the index nor the zarr arrays change: upstream T5X and TensorStore never
look at the manifest. Every chunk is written, even one equal to the fill value,
so the recorded chunk list is exactly the files that must exist.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import math
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import xxhash

from t5x.checkpointing._manifest import ALGORITHM, MANIFEST_FORMAT, MANIFEST_VERSION, ZARRAY, digest_bytes

# Whether saves write the manifest (only tools/bench_checkpoint.py turns it off, to measure its cost).
WRITE_CHECKSUMS = True

Box = tuple[slice, ...]


# ---- digests and the chunk grid --------------------------------------------


# Below this many bytes per contiguous run, a strided chunk is copied before digesting;
# above it, its runs are fed to a streaming digest (same result, no copy).
_STREAM_RUN_BYTES = 1 << 14


def digest(array: np.ndarray) -> str:
    """XXH3-64 (hex) of an array's C-order, little-endian bytes."""
    if array.dtype.byteorder == ">" or (sys.byteorder == "big" and array.dtype.byteorder == "="):
        array = array.astype(array.dtype.newbyteorder("<"))
    if array.flags.c_contiguous:
        return xxhash.xxh3_64_hexdigest(array)
    # A chunk cut out of a larger read: its trailing axes are contiguous runs.
    inner = array.ndim
    while inner > 0 and array[(0,) * (inner - 1)].flags.c_contiguous:
        inner -= 1
    run = array[(0,) * inner] if inner < array.ndim else array
    if inner == array.ndim or run.nbytes < _STREAM_RUN_BYTES:
        return xxhash.xxh3_64_hexdigest(np.ascontiguousarray(array))
    state = xxhash.xxh3_64()
    for position in np.ndindex(*array.shape[:inner]):
        state.update(array[position])
    return state.hexdigest()


def _grid_range(start: int, stop: int, size: int, chunk: int, whole: bool) -> range:
    """Chunk positions along one axis: touching ``[start, stop)``, or (``whole``) inside it."""
    if whole:
        last = math.ceil(size / chunk) if stop >= size else stop // chunk
        return range(math.ceil(start / chunk), max(math.ceil(start / chunk), last))
    return range(start // chunk, math.ceil(stop / chunk))


def _chunk_slices(position: Sequence[int], shape: Sequence[int], chunks: Sequence[int]) -> Box:
    return tuple(slice(p * c, min((p + 1) * c, n)) for p, c, n in zip(position, chunks, shape))


def chunk_key(position: Sequence[int]) -> str:
    """The manifest's key for a chunk: its grid position joined with ``.``."""
    return ".".join(str(p) for p in position)


def all_chunk_keys(shape: Sequence[int], chunks: Sequence[int]) -> list[str]:
    """Every chunk of an array, in C order."""
    ranges = [range(math.ceil(n / c)) for n, c in zip(shape, chunks)]
    return [chunk_key(p) for p in itertools.product(*ranges)]


def _normal(index: Sequence[slice], shape: Sequence[int]) -> list[tuple[int, int]]:
    out = []
    for s, n in zip(index, shape):
        start, stop, step = s.indices(n)
        if step != 1:
            start, stop = 0, n
        out.append((start, max(start, stop)))
    return out


def piece_digests(
    shape: Sequence[int], chunks: Sequence[int], index: Sequence[slice], data: np.ndarray
) -> dict[str, str]:
    """Digests of the chunks lying wholly inside one written piece.

    Args:
      shape: the array's global shape.
      chunks: its chunk shape.
      index: where ``data`` sits in the array (slices).
      data: the values written there, in the stored dtype.

    Returns:
      ``{chunk key: digest}``; chunks only partly inside the piece are left out
      (the manifest's writer reads those back once every piece is on disk).
    """
    if data.shape == tuple(shape) and all(0 < n <= c for n, c in zip(shape, chunks)):
        return {chunk_key((0,) * len(shape)): digest(data)}  # the usual case: one chunk, written whole
    bounds = _normal(index, shape)
    ranges = [
        _grid_range(start, stop, n, c, whole=True) for (start, stop), n, c in zip(bounds, shape, chunks)
    ]
    out = {}
    for position in itertools.product(*ranges):
        box = _chunk_slices(position, shape, chunks)
        local = tuple(slice(b.start - start, b.stop - start) for b, (start, _) in zip(box, bounds))
        out[chunk_key(position)] = digest(data[local])
    return out


# ---- writing the manifest ---------------------------------------------------


def part_file(process_index: int, process_count: int) -> str:
    """Where one process of a multi-process save leaves its chunk digests for process 0."""
    return f"checksums-{process_index:03d}-of-{process_count:03d}.json"


def write_json(path: str, value: Any) -> None:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"))  # one write, not one per token
    with open(path, "w") as handle:
        handle.write(text)


@dataclasses.dataclass
class Written:
    """What one process learnt while writing its pieces.

    Attributes:
      digests: ``{array folder: {chunk key: digest}}`` of the chunks it wrote whole.
    """

    digests: dict[str, dict[str, str]] = dataclasses.field(default_factory=dict)


def _read_small(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        parts = []
        while part := os.read(fd, 1 << 16):
            parts.append(part)
        return b"".join(parts)
    finally:
        os.close(fd)


def read_zarray(folder: str) -> bytes:
    """The ``.zarray`` file of an array folder, as bytes."""
    return _read_small(os.path.join(folder, ZARRAY))


def zarray_text(zarray: Mapping[str, Any]) -> bytes:
    """A ``.zarray`` as TensorStore formats it: sorted keys, no spaces."""
    return json.dumps(zarray, sort_keys=True, separators=(",", ":")).encode()


@dataclasses.dataclass
class StoredArray:
    """What the manifest's writer knows of one array.

    Attributes:
      folder: the array folder under the step folder.
      shape: the array shape.
      chunks: the chunk shape.
      kind: arrays of one kind get the same ``.zarray`` up to shape and chunks
        (the stored dtype's name: one save uses one compressor).
    """

    folder: str
    shape: tuple[int, ...]
    chunks: tuple[int, ...]
    kind: str = ""


class _Zarrays:
    """The ``.zarray`` records of a step's arrays, reading one file per kind of array.

    TensorStore's ``.zarray`` differs between arrays of one dtype and compressor
    only in ``shape`` and ``chunks``. The first array of each kind is read; when
    it is formatted as expected and describes its array, the other arrays of
    that kind share its body and are not read. Otherwise every file of that kind
    is read (and bodies are still shared where they are equal).
    """

    def __init__(self, step_dir: str) -> None:
        self._step_dir = step_dir
        self._kinds: dict[str, int | None] = {}  # kind -> its shared body, when the others need no read
        self._by_text: dict[str, int] = {}
        self.bodies: list[dict[str, Any]] = []

    def _body_of(self, zarray: Mapping[str, Any]) -> int:
        body = {key: value for key, value in zarray.items() if key not in ("shape", "chunks")}
        text = json.dumps(body, sort_keys=True)
        found = self._by_text.get(text)
        if found is None:
            found = self._by_text[text] = len(self.bodies)
            self.bodies.append(body)
        return found

    def record(self, array: StoredArray) -> dict[str, Any]:
        """The manifest's record of one array (without its chunk digests)."""
        shared = self._kinds.get(array.kind)
        if shared is not None:
            return {"zarray": shared, "shape": list(array.shape), "chunk_shape": list(array.chunks)}
        raw = read_zarray(os.path.join(self._step_dir, array.folder))
        zarray = json.loads(raw)
        body = self._body_of(zarray)
        if array.kind not in self._kinds:
            exact = (
                zarray_text(zarray) == raw
                and zarray.get("shape") == list(array.shape)
                and zarray.get("chunks") == list(array.chunks)
            )
            self._kinds[array.kind] = body if exact else None
        return {"zarray": body, "shape": zarray.get("shape"), "chunk_shape": zarray.get("chunks")}


def build_manifest(
    step_dir: str,
    arrays: Sequence[StoredArray],
    digests: Mapping[str, Mapping[str, str]],
    files: Mapping[str, bytes],
    context: Any = None,
) -> dict[str, Any]:
    """The manifest of a step folder whose arrays are all written.

    Args:
      step_dir: the (temporary) step folder.
      arrays: every TensorStore array of the step.
      digests: ``{folder: {chunk key: digest}}`` gathered from the writers;
        a chunk no writer could digest alone is read back here.
      files: other files to record, by name (the index, the input states).
      context: the TensorStore context for read-backs.

    Raises:
      OSError: an array's ``.zarray`` or one of its chunk files was not written.
    """
    zarrays = _Zarrays(step_dir)
    entries: dict[str, Any] = {}
    for array in arrays:
        record = zarrays.record(array)
        known = digests.get(array.folder, {})
        count = 1
        for n, c in zip(array.shape, array.chunks):
            count *= -(-n // c)
        if count == 1 and len(known) == 1:
            record["chunks"] = known  # one chunk, digested by its writer
        else:
            separator = zarrays.bodies[record["zarray"]].get("dimension_separator") or "."
            record["chunks"] = _all_chunk_digests(step_dir, array, separator, known, context)
        entries[array.folder] = record
    return {
        "format": MANIFEST_FORMAT,
        "version": MANIFEST_VERSION,
        "algorithm": ALGORITHM,
        "files": {name: {"bytes": len(data), "digest": digest_bytes(data)} for name, data in files.items()},
        "zarrays": zarrays.bodies,
        "arrays": entries,
    }


def _all_chunk_digests(
    step_dir: str, array: StoredArray, separator: str, known: Mapping[str, str], context: Any
) -> dict[str, str]:
    """Every chunk's digest: the writers' ones, and those of chunks split between writers read back."""
    chunks: dict[str, str] = {}
    missing = []
    for key in all_chunk_keys(array.shape, array.chunks):
        if key in known:
            chunks[key] = known[key]
        else:
            missing.append(key)
    if not missing:
        return chunks
    import tensorstore as ts

    folder = os.path.join(step_dir, array.folder)
    store = ts.open(
        {"driver": "zarr", "kvstore": {"driver": "file", "path": folder + "/"}},
        open=True,
        read=True,
        context=context,
    ).result()
    for key in missing:
        name = separator.join(key.split("."))
        if not os.path.isfile(os.path.join(folder, name)):
            raise OSError(f"chunk {name} of {folder} was not written")
        position = [int(p) for p in key.split(".")]
        box = _chunk_slices(position, array.shape, array.chunks)
        chunks[key] = digest(np.asarray(store[box].read().result()))
    return chunks


logger = logging.getLogger("t5x.checkpointing")
_warned: set[str] = set()
# verify_checkpoint reports unverified checkpoints itself.
quiet = False


def warn_unverified(step_dir: str, why: str) -> None:
    """Logs a warning (once per step folder and process) that a checkpoint is read unverified."""
    real = os.path.realpath(step_dir)
    if quiet or real in _warned:
        return
    _warned.add(real)
    logger.warning("checkpoint %s is read UNVERIFIED: %s", step_dir, why)
