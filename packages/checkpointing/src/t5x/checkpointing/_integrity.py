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
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np
import xxhash

from t5x.checkpointing._errors import CheckpointIntegrityError

MANIFEST_FILE = "checksums.json"
MANIFEST_FORMAT = "t5x-checkpointing/checksums"
MANIFEST_VERSION = 2  # 2: .zarray bodies shared between arrays; 1: one whole .zarray per array
ALGORITHM = "xxh3_64"
ZARRAY = ".zarray"

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


def digest_bytes(data: bytes) -> str:
    """XXH3-64 (hex) of raw bytes."""
    return xxhash.xxh3_64_hexdigest(data)


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


# ---- reading the manifest ---------------------------------------------------


def inside(path: str, root: str) -> bool:
    """Whether a resolved ``path`` is ``root`` or lies below it."""
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


@dataclasses.dataclass
class Manifest:
    """A step folder's loaded ``checksums.json``."""

    path: str
    files: dict[str, Any]
    arrays: dict[str, Any]

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
        arrays = _whole_records(arrays, bodies)
    return Manifest(path=path, files=files, arrays=arrays)


def _whole_records(arrays: Mapping[str, Any], bodies: list[dict[str, Any]]) -> dict[str, Any]:
    """Version-2 records with each array's whole ``.zarray`` put back (as version 1 stored them).

    A record whose body index, shape or chunk shape is unusable gets no
    ``.zarray``, which the array's check reports, naming the parameter.
    """
    out: dict[str, Any] = {}
    for folder, record in arrays.items():
        if not isinstance(record, dict):
            out[folder] = record
            continue
        index = record.get("zarray")
        whole = None
        if (
            isinstance(index, int)
            and 0 <= index < len(bodies)
            and "shape" in record
            and "chunk_shape" in record
        ):
            whole = {**bodies[index], "shape": record["shape"], "chunks": record["chunk_shape"]}
        out[folder] = {"zarray": whole, "chunks": record.get("chunks")}
    return out


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


# ---- checking arrays ----------------------------------------------------------


def _zarr_dtype(value: Any) -> np.dtype | None:
    try:
        return np.dtype(value)
    except TypeError:
        try:
            return np.dtype(jnp.dtype(value))
        except TypeError:
            return None


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


def check_array(
    name: str,
    folder: str,
    step_real: str,
    *,
    index_shape: tuple[int, ...] | None,
    index_dtype: np.dtype | None,
    record: Mapping[str, Any] | None,
    verify: bool,
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
      step_entries: the step folder's entries by name (from one scan), when
        ``folder`` is directly inside it: a plain folder there needs no resolving.

    Returns:
      What to check of the chunks as they are read (None without ``verify``).

    Raises:
      CheckpointIntegrityError: names the parameter, the file, expected and found.
    """
    folder = folder.rstrip("/")
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
        entries = {entry.name: entry for entry in os.scandir(real)}
    except (FileNotFoundError, NotADirectoryError) as error:
        if not verify:
            return None  # TensorStore reports it, as before
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
    if not verify:
        return None
    zarray_path = folder + os.sep + ZARRAY
    if ZARRAY not in entries:
        raise CheckpointIntegrityError(
            f"{name}: {zarray_path} is missing (expected the array's zarr metadata)",
            name=name,
            path=zarray_path,
        )
    zarray: Any
    if record is None:
        zarray = _parse_zarray(name, zarray_path, os.path.join(real, ZARRAY))
    else:
        zarray = record.get("zarray")
        if not isinstance(zarray, dict):
            raise CheckpointIntegrityError(
                f"{name}: the checksum manifest has no .zarray record for {folder}", name=name, path=folder
            )
    try:
        shape = tuple([int(n) for n in zarray["shape"]])
        chunks = tuple([int(c) for c in zarray["chunks"]])
        if len(chunks) != len(shape) or (chunks and min(chunks) < 1):
            raise ValueError(f"chunks {chunks} do not fit shape {shape}")
    except (KeyError, TypeError, ValueError) as error:
        source = zarray_path if record is None else f"the checksum manifest's record of {zarray_path}"
        raise CheckpointIntegrityError(
            f"{name}: {source} has no valid shape / chunks: {error}", name=name, path=zarray_path
        ) from error
    if index_shape is not None and index_shape != shape and tuple(index_shape) != shape:
        raise CheckpointIntegrityError(
            f"{name}: shape mismatch between the index and {zarray_path}: the index expects "
            f"{tuple(index_shape)}, the array has {shape}",
            name=name,
            path=zarray_path,
        )
    if index_dtype is not None and _stored_dtype(zarray.get("dtype")) != index_dtype:
        raise CheckpointIntegrityError(
            f"{name}: dtype mismatch between the index and {zarray_path}: the index expects "
            f"{np.dtype(index_dtype).name}, the array has {zarray.get('dtype')!r}",
            name=name,
            path=zarray_path,
        )
    separator = zarray.get("dimension_separator") or "."
    if record is None:
        return ArrayCheck(name, folder, shape, chunks, separator, None)
    expected = record.get("chunks")
    if not isinstance(expected, dict):
        raise CheckpointIntegrityError(
            f"{name}: the checksum manifest has no chunk list for {folder}", name=name, path=folder
        )
    check = ArrayCheck(name, folder, shape, chunks, separator, expected, written=zarray)
    count = 1
    for n, c in zip(shape, chunks):
        count *= -(-n // c)
    grid = expected.keys() if count == len(expected) else all_chunk_keys(shape, chunks)
    if count != len(expected) or (count > 1 and set(grid) != set(all_chunk_keys(shape, chunks))):
        raise CheckpointIntegrityError(
            f"{name}: the checksum manifest records {len(expected)} chunks for {folder}, "
            f"its shape {shape} and chunks {chunks} make {count}",
            name=name,
            path=folder,
        )
    for key in grid:
        file_name = key if separator == "." else key.replace(".", separator)
        chunk_entry = entries.get(file_name)
        if chunk_entry is None or not chunk_entry.is_file():
            path = os.path.join(folder, file_name)
            missing = sum(1 for k in grid if k.replace(".", separator) not in entries)
            more = f" ({missing} of {len(grid)} chunk files are missing)" if missing > 1 else ""
            raise CheckpointIntegrityError(
                f"{name}: chunk file {path} is missing: expected the chunk written with "
                f"{ALGORITHM} {expected[key]}, found no file{more}",
                name=name,
                path=path,
            )
    return check


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
