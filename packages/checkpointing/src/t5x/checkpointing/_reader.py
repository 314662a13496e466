"""Reading step folders: the T5X msgpack + zarr layout and Orbax's layout."""

from __future__ import annotations

import ast
import collections
import json
import os
import re
from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np
import tensorstore as ts

from t5x.checkpointing import _array_checks, _codec, _format, _integrity, _manifest, _specs, _tree
from t5x.checkpointing._errors import CheckpointIntegrityError

_STEP_DIR = re.compile(r"^checkpoint_(\d+)$")
ORBAX_ITEM = "state"
ORBAX_METADATA = "_METADATA"


class LazyArray:
    """A checkpoint leaf that is read only when asked for.

    Reads are verified when the leaf was opened with ``verify`` (the default):
    each read covers whole chunks, whose digests are compared with the step's
    checksum manifest before any value is returned, and a chunk that does not
    decode raises :class:`CheckpointIntegrityError` too.

    Attributes:
      name: the leaf's dotted state path.
      shape: the stored shape.
      dtype: the dtype ``get`` returns (after any requested cast).
    """

    def __init__(
        self,
        name: str,
        shape: tuple[int, ...],
        dtype: np.dtype,
        spec: dict[str, Any] | None,
        value: np.ndarray | None = None,
        context: ts.Context | None = None,
        *,
        check: _array_checks.ArrayCheck | None = None,
    ) -> None:
        self.name = name
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)
        self._spec = spec
        self._value = value
        self._context = context
        self._store: Any = None
        self._check = check

    @property
    def stored_inline(self) -> bool:
        """Whether the value lives inside the index (no array folder)."""
        return self._spec is None

    @property
    def verifies_chunks(self) -> bool:
        """Whether reads are checked against recorded chunk digests."""
        return self._check is not None and self._check.expected is not None

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    def astype(self, dtype: Any) -> LazyArray:
        """A lazy view of this leaf that reads as ``dtype``."""
        view = LazyArray(
            self.name,
            self.shape,
            np.dtype(jnp.dtype(dtype)),
            self._spec,
            self._value,
            self._context,
            check=self._check,
        )
        view._store = self._store
        return view

    def open_future(self) -> Any:
        """Starts opening the TensorStore (None for inline leaves)."""
        if self._spec is None or self._store is not None:
            return None
        return ts.open(self._spec, open=True, read=True, context=self._context)

    def set_store(self, store: Any) -> None:
        self._store = store

    def failure(self, what: str, error: BaseException) -> Exception:
        """The error to raise for a failed open or read: an integrity error when verifying."""
        if isinstance(error, CheckpointIntegrityError):
            return error
        if self._check is not None:
            problem = self._check.metadata_problem() if what == "open" else None
            if problem is not None:
                return problem  # TensorStore refused the recorded metadata: say what changed
            return CheckpointIntegrityError(
                f"{self.name}: cannot {what} the zarr array {self._check.folder}: {error}",
                name=self.name,
                path=self._check.folder,
            )
        return FileNotFoundError(f"cannot {what} the array of {self.name}: {error}")

    def metadata_problem(self) -> CheckpointIntegrityError | None:
        """How the array's ``.zarray`` differs from the one recorded at save, read now (None: it does not).

        Reads compare only what decides the values (TensorStore checks every
        such field on open); this compares the whole file's contents.
        """
        return None if self._check is None else self._check.metadata_problem()

    def _opened(self) -> Any:
        if self._store is None:
            try:
                self._store = self.open_future().result()
            except Exception as error:
                raise self.failure("open", error) from error
        return self._store

    def _covers_all(self, index: tuple[slice, ...]) -> bool:
        return len(index) == len(self.shape) and all(
            s.step in (None, 1) and s.start in (None, 0) and s.stop is not None and s.stop >= n
            for s, n in zip(index, self.shape)
        )

    def read_future(self, index: tuple[slice, ...] | None = None) -> Any:
        """Starts reading ``index`` (the whole array when None); ``.result()`` gives numpy.

        When verifying, the whole chunks around ``index`` are read and checked
        when ``.result()`` is called (so checks overlap other reads in flight).
        """
        if self._spec is None:
            value = np.asarray(self._value) if index is None else np.asarray(self._value)[index]
            return _Done(value)
        store = self._opened()
        if index is not None and self._covers_all(index):
            index = None  # reading everything: no box to cut, and no indexing transform to build
        if self._check is None:
            return store.read() if index is None else store[index].read()
        if index is None:
            return _Checked(self, store.read(), None, None)
        box = self._check.aligned(index) if self.verifies_chunks else index
        future = store.read() if box is None else store[box].read()
        inner = None
        if index is not None and box is not None and box != tuple(index):
            inner = tuple(
                slice(s.start - b.start, s.stop - b.start) for s, b in zip(_concrete(index, self.shape), box)
            )
        return _Checked(self, future, box, inner)

    def finish(self, raw: np.ndarray) -> np.ndarray:
        """Casts a read result to ``dtype``."""
        raw = np.asarray(raw)
        return raw if raw.dtype == self.dtype else raw.astype(self.dtype)

    def get(self) -> np.ndarray:
        """Reads the whole leaf into memory.

        Raises:
          CheckpointIntegrityError: (verifying) a chunk is missing, changed or undecodable.
          FileNotFoundError: (not verifying) the array cannot be read.
        """
        try:
            return self.finish(self.read_future().result())
        except (FileNotFoundError, CheckpointIntegrityError):
            raise
        except Exception as error:
            raise self.failure("read", error) from error

    def read_chunkwise(self, max_bytes_in_flight: int = 256 << 20) -> tuple[int, int]:
        """Reads the whole leaf chunk by chunk, checking each, without keeping any.

        Memory stays near ``max_bytes_in_flight`` however large the array.

        Returns:
          ``(chunks compared with a checksum, bytes read)``.

        Raises:
          CheckpointIntegrityError: (verifying) a chunk is changed or undecodable.
          FileNotFoundError: (not verifying) the array cannot be read.
        """
        check = self._check
        if self._spec is None or check is None:
            value = self.read_future().result()
            return 0, int(np.asarray(value).nbytes)
        store = self._opened()
        pending: collections.deque[tuple[tuple[slice, ...], Any, int]] = collections.deque()
        in_flight = checked = total = 0

        def finish_one() -> None:
            nonlocal in_flight, checked, total
            box, future, size = pending.popleft()
            in_flight -= size
            try:
                data = np.asarray(future.result())
            except Exception as error:
                raise self.failure("read", error) from error
            checked += check.verify(box, data)
            total += int(data.nbytes)

        itemsize = np.dtype(store.dtype.numpy_dtype).itemsize
        for _, box in check.boxes():
            size = itemsize * int(np.prod([b.stop - b.start for b in box], dtype=np.int64))
            pending.append((box, store[box].read(), size))
            in_flight += size
            while in_flight > max_bytes_in_flight and len(pending) > 1:
                finish_one()
        while pending:
            finish_one()
        return checked, total

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        value = self.get()
        return value if dtype is None else value.astype(dtype)

    def __repr__(self) -> str:
        return f"LazyArray({self.name!r}, shape={self.shape}, dtype={self.dtype})"


class _Done:
    def __init__(self, value: np.ndarray) -> None:
        self._value = value

    def result(self) -> np.ndarray:
        return self._value


def _concrete(index: tuple[slice, ...], shape: tuple[int, ...]) -> tuple[slice, ...]:
    return tuple(slice(*s.indices(n)[:2]) for s, n in zip(index, shape))


class _Checked:
    """A verified read in flight: ``result()`` checks the chunks, then cuts out what was asked."""

    def __init__(
        self, source: LazyArray, future: Any, box: tuple[slice, ...] | None, inner: tuple[slice, ...] | None
    ) -> None:
        self._source = source
        self._future = future
        self._box = box
        self._inner = inner

    def result(self) -> np.ndarray:
        source = self._source
        try:
            data = np.asarray(self._future.result())
        except Exception as error:
            raise source.failure("read", error) from error
        check = source._check
        if check is not None and check.expected is not None:
            check.verify(self._box, data)
        return data if self._inner is None else data[self._inner]


def is_complete_t5x_step(step_dir: str) -> bool:
    """A step folder counts once its index (T5X) or Orbax item is committed."""
    if os.path.isfile(os.path.join(step_dir, _format.INDEX_FILE)):
        return True
    item = os.path.join(step_dir, ORBAX_ITEM)
    return os.path.isfile(os.path.join(item, ORBAX_METADATA)) or os.path.isfile(
        os.path.join(item, "checkpoint")
    )


def list_steps(model_dir: str) -> list[int]:
    """Complete steps under ``model_dir``, ascending (temporary folders ignored)."""
    try:
        names = os.listdir(model_dir)
    except FileNotFoundError:
        return []
    steps = []
    for name in names:
        match = _STEP_DIR.match(name)
        if match and is_complete_t5x_step(os.path.join(model_dir, name)):
            steps.append(int(match.group(1)))
    return sorted(steps)


def locate(path: str, step: int | None = None) -> tuple[str, int | None]:
    """Finds the step folder meant by ``path``.

    Args:
      path: a model folder (holding ``checkpoint_<step>/``), a step folder, the
        ``checkpoint`` index file itself, or an Orbax ``state`` item folder.
      step: which step of a model folder (the latest when None).

    Returns:
      ``(step folder, step number or None when the name does not say)``.

    Raises:
      FileNotFoundError: no checkpoint there (names the path and, for a model
        folder, the newest complete step).
    """
    path = os.path.abspath(os.fspath(path))
    if os.path.isfile(path) and os.path.basename(path) == _format.INDEX_FILE:
        path = os.path.dirname(path)
    if os.path.basename(path) == ORBAX_ITEM and os.path.isfile(os.path.join(path, ORBAX_METADATA)):
        path = os.path.dirname(path)
    match = _STEP_DIR.match(os.path.basename(path))
    if step is None and is_complete_t5x_step(path):
        return path, int(match.group(1)) if match else None
    steps = list_steps(path)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"no checkpoint at {path}: the path does not exist")
    if step is None:
        if not steps:
            raise FileNotFoundError(
                f"no complete checkpoint in {path} (no checkpoint_<step>/checkpoint inside)"
            )
        step = steps[-1]
    step_dir = os.path.join(path, f"checkpoint_{step}")
    if step not in steps:
        newest = f"the newest complete step is {steps[-1]}" if steps else "there is no complete step"
        raise FileNotFoundError(f"no complete checkpoint for step {step} at {step_dir}; {newest}")
    return step_dir, step


def _t5x_sources(
    step_dir: str,
    context: ts.Context,
    verify: bool,
    problems: list[CheckpointIntegrityError] | None = None,
) -> dict[_tree.Path, Any]:
    """The leaves of a T5X step folder; see :func:`read_sources`.

    ``problems``: collect per-array integrity errors there (the array is left
    out) instead of raising the first.
    """
    index_path = os.path.join(step_dir, _format.INDEX_FILE)
    step_real = os.path.realpath(step_dir)
    if not _manifest.inside(os.path.realpath(index_path), step_real):
        raise CheckpointIntegrityError(
            f"{index_path} resolves to {os.path.realpath(index_path)}, outside the step folder {step_real}",
            path=index_path,
        )
    with open(index_path, "rb") as handle:
        raw = handle.read()
    contents = _codec.decode_index(raw, index_path)
    tree = contents.get("optimizer", contents) if "version" in contents else contents
    if not isinstance(tree, dict):
        raise _codec.CorruptIndexError(
            f"{index_path}: 'optimizer' must be a map, found {type(tree).__name__}"
        )
    flat = _tree.flatten(tree, is_leaf=_specs.is_spec)
    # Paths escaping the folder are refused first, checksums or not.
    specs = {
        path: _specs.resolve_spec(value, step_dir, _tree.dotted_name(path))
        for path, value in flat.items()
        if _specs.is_spec(value)
    }
    manifest = _manifest.load_manifest(step_dir) if verify else None
    if manifest is not None:
        manifest.check_file(_format.INDEX_FILE, raw, index_path, required=True)
    elif verify:
        _integrity.warn_unverified(
            step_dir,
            f"it has no {_manifest.MANIFEST_FILE} (written by upstream T5X or before checksums), "
            "so missing or changed chunks cannot be detected",
        )
    with os.scandir(step_dir) as scan:
        step_entries = {entry.name: entry for entry in scan}
    sources: dict[_tree.Path, Any] = {}
    for path, value in flat.items():
        name = _tree.dotted_name(path)
        if _specs.is_spec(value):
            spec = specs[path]
            shape, dtype = _specs.spec_shape(value), _specs.spec_dtype(value)
            relative = _specs.relative_path(value, name)
            record = None
            try:
                if manifest is not None:
                    record = manifest.arrays.get(relative)
                    if record is None:
                        raise CheckpointIntegrityError(
                            f"{name}: the checksum manifest {manifest.path} has no record of its array "
                            f"folder {relative}",
                            name=name,
                            path=manifest.path,
                        )
                check = _array_checks.check_array(
                    name,
                    spec["kvstore"]["path"],
                    step_real,
                    index_shape=shape,
                    index_dtype=dtype,
                    record=record,
                    verify=verify,
                    manifest=manifest,
                    step_entries=None if "/" in relative else step_entries,
                )
            except CheckpointIntegrityError as error:
                if problems is None:
                    raise
                problems.append(error)
                continue
            if check is not None and (shape is None or dtype is None):
                shape = shape if shape is not None else check.shape
            if check is not None and check.written is not None:
                # TensorStore opens the array only if its .zarray describes this very array.
                spec = {**spec, "metadata": check.written}
            if shape is None or dtype is None:
                store = _open_or_fail(spec, context, name, step_dir, verify)
                shape, dtype = tuple(store.shape), np.dtype(store.dtype.numpy_dtype)
            sources[path] = LazyArray(name, shape, dtype, spec, context=context, check=check)
        elif isinstance(value, np.ndarray | np.generic | int | float | bool):
            array = np.asarray(value)
            sources[path] = LazyArray(name, array.shape, array.dtype, None, value=array)
        else:
            sources[path] = value  # strings, empty slots
    return sources


def _open_or_fail(spec: dict[str, Any], context: ts.Context, name: str, where: str, verify: bool) -> Any:
    try:
        return ts.open(spec, open=True, read=True, context=context).result()
    except Exception as error:
        if verify:
            raise CheckpointIntegrityError(
                f"{name}: cannot open its zarr array in {where}: {error}", name=name, path=where
            ) from error
        raise FileNotFoundError(f"array file of {name} missing or unreadable in {where}: {error}") from error


def _orbax_sources(item_dir: str, context: ts.Context, verify: bool) -> dict[_tree.Path, Any]:
    metadata_path = os.path.join(item_dir, ORBAX_METADATA)
    try:
        with open(metadata_path) as handle:
            metadata = json.load(handle)
    except (OSError, ValueError) as error:
        raise _codec.CorruptIndexError(
            f"{metadata_path} is not a readable Orbax metadata file: {error}"
        ) from error
    aggregate: dict[_tree.Path, Any] = {}
    aggregate_path = os.path.join(item_dir, "checkpoint")
    if os.path.isfile(aggregate_path):
        with open(aggregate_path, "rb") as handle:
            aggregate = _tree.flatten(_codec.decode_index(handle.read(), aggregate_path))
    driver = "zarr3" if metadata.get("use_zarr3") else "zarr"
    base = os.path.abspath(item_dir) + "/"
    step_real = os.path.realpath(os.path.dirname(os.path.abspath(item_dir)))
    _array_checks.check_tree_contained(item_dir, step_real)
    if verify:
        _integrity.warn_unverified(
            os.path.dirname(os.path.abspath(item_dir)),
            "the Orbax layout carries no checksums, so missing or changed chunks cannot be detected",
        )
    sources: dict[_tree.Path, Any] = {}
    for key, entry in metadata.get("tree_metadata", {}).items():
        keys = entry.get("key_metadata")
        path = tuple(str(k["key"]) for k in keys) if keys else tuple(str(k) for k in ast.literal_eval(key))
        name = _tree.dotted_name(path)
        stored = aggregate.get(path)
        if stored is not None and not (isinstance(stored, str) and stored.startswith("PLACEHOLDER://")):
            array = np.asarray(stored)
            sources[path] = LazyArray(name, array.shape, array.dtype, None, value=array)
            continue
        relative = _specs.relative_path({"path": name}, name)  # refuses "..", absolute, URLs
        if metadata.get("use_ocdbt", True):
            kvstore: dict[str, Any] = {"driver": "ocdbt", "base": f"file://{base}", "path": relative + "/"}
        else:
            kvstore = {"driver": "file", "path": base + relative + "/"}
            _array_checks.check_array(
                name,
                base + relative,
                step_real,
                index_shape=None,
                index_dtype=None,
                record=None,
                verify=False,
            )
        spec = {"driver": driver, "kvstore": kvstore}
        store = _open_or_fail(spec, context, name, item_dir, verify)
        sources[path] = LazyArray(
            name, tuple(store.shape), np.dtype(store.dtype.numpy_dtype), spec, context=context
        )
        sources[path].set_store(store)
    tree = _tree.unflatten(sources)
    if "optimizer" in tree and isinstance(tree["optimizer"], dict):
        tree = tree["optimizer"]
    return _tree.flatten(tree, is_leaf=lambda x: isinstance(x, LazyArray))


def read_sources(
    step_dir: str, *, verify: bool = True, problems: list[CheckpointIntegrityError] | None = None
) -> dict[_tree.Path, Any]:
    """Every leaf of a step folder as a :class:`LazyArray` (or an inline value).

    Every array folder, and every link inside one, must resolve inside the step
    folder. With ``verify`` the index is compared with the checksum manifest and
    each array's ``.zarray`` and chunk files are checked (no chunk data is read
    yet; the returned leaves check their chunks as they read them). A step
    folder without a manifest is read unverified, with a warning once.

    Args:
      step_dir: a ``checkpoint_<step>`` folder in either layout.
      verify: check metadata and files here and chunk digests on reads.
      problems: collect per-array integrity errors there instead of raising.

    Returns:
      ``{("target", ...): LazyArray}``; nothing is read from array files yet.

    Raises:
      FileNotFoundError: neither layout's index is there.
      CorruptIndexError: the index cannot be decoded.
      CheckpointIntegrityError: the step folder is not what was written.
    """
    context = _format.ts_context()
    if os.path.isfile(os.path.join(step_dir, _format.INDEX_FILE)):
        return _t5x_sources(step_dir, context, verify, problems)
    item = os.path.join(step_dir, ORBAX_ITEM)
    if os.path.isfile(os.path.join(item, ORBAX_METADATA)):
        return _orbax_sources(item, context, verify)
    raise FileNotFoundError(
        f"{step_dir} holds neither a T5X 'checkpoint' index nor an Orbax 'state/_METADATA'"
    )


def read_all(sources: Sequence[LazyArray]) -> list[np.ndarray]:
    """Reads several leaves fully, with all opens and reads in flight together."""
    opens = [(s, s.open_future()) for s in sources]
    for source, future in opens:
        if future is not None:
            try:
                source.set_store(future.result())
            except Exception as error:
                raise source.failure("open", error) from error
    reads = [(s, s.read_future()) for s in sources]
    out = []
    for source, future in reads:
        try:
            out.append(source.finish(future.result()))
        except CheckpointIntegrityError:
            raise
        except Exception as error:
            raise source.failure("read", error) from error
    return out
