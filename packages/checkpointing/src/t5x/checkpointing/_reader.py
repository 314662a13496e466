"""Reading step folders: the T5X msgpack + zarr layout and Orbax's layout."""

from __future__ import annotations

import ast
import json
import os
import re
from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np
import tensorstore as ts

from t5x.checkpointing import _codec, _format, _specs, _tree

_STEP_DIR = re.compile(r"^checkpoint_(\d+)$")
ORBAX_ITEM = "state"
ORBAX_METADATA = "_METADATA"


class LazyArray:
    """A checkpoint leaf that is read only when asked for.

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
    ) -> None:
        self.name = name
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)
        self._spec = spec
        self._value = value
        self._context = context
        self._store: Any = None

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    def astype(self, dtype: Any) -> LazyArray:
        """A lazy view of this leaf that reads as ``dtype``."""
        view = LazyArray(
            self.name, self.shape, np.dtype(jnp.dtype(dtype)), self._spec, self._value, self._context
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

    def _opened(self) -> Any:
        if self._store is None:
            try:
                self._store = self.open_future().result()
            except Exception as error:
                raise FileNotFoundError(f"cannot open the array of {self.name}: {error}") from error
        return self._store

    def read_future(self, index: tuple[slice, ...] | None = None) -> Any:
        """Starts reading ``index`` (the whole array when None); ``.result()`` gives numpy."""
        if self._spec is None:
            value = np.asarray(self._value) if index is None else np.asarray(self._value)[index]
            return _Done(value)
        store = self._opened()
        return store.read() if index is None else store[index].read()

    def finish(self, raw: np.ndarray) -> np.ndarray:
        """Casts a read result to ``dtype``."""
        raw = np.asarray(raw)
        return raw if raw.dtype == self.dtype else raw.astype(self.dtype)

    def get(self) -> np.ndarray:
        """Reads the whole leaf into memory."""
        try:
            return self.finish(self.read_future().result())
        except FileNotFoundError:
            raise
        except Exception as error:
            raise FileNotFoundError(f"cannot read the array of {self.name}: {error}") from error

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


def _t5x_sources(step_dir: str, context: ts.Context) -> dict[_tree.Path, Any]:
    index_path = os.path.join(step_dir, _format.INDEX_FILE)
    with open(index_path, "rb") as handle:
        contents = _codec.decode_index(handle.read(), index_path)
    tree = contents.get("optimizer", contents) if "version" in contents else contents
    if not isinstance(tree, dict):
        raise _codec.CorruptIndexError(
            f"{index_path}: 'optimizer' must be a map, found {type(tree).__name__}"
        )
    flat = _tree.flatten(tree, is_leaf=_specs.is_spec)
    sources: dict[_tree.Path, Any] = {}
    for path, value in flat.items():
        name = _tree.dotted_name(path)
        if _specs.is_spec(value):
            spec = _specs.resolve_spec(value, step_dir, name)
            shape, dtype = _specs.spec_shape(value), _specs.spec_dtype(value)
            if shape is None or dtype is None:
                store = _open_or_fail(spec, context, name, step_dir)
                shape, dtype = tuple(store.shape), np.dtype(store.dtype.numpy_dtype)
            sources[path] = LazyArray(name, shape, dtype, spec, context=context)
        elif isinstance(value, np.ndarray | np.generic | int | float | bool):
            array = np.asarray(value)
            sources[path] = LazyArray(name, array.shape, array.dtype, None, value=array)
        else:
            sources[path] = value  # strings, empty slots
    return sources


def _open_or_fail(spec: dict[str, Any], context: ts.Context, name: str, step_dir: str) -> Any:
    try:
        return ts.open(spec, open=True, read=True, context=context).result()
    except Exception as error:
        raise FileNotFoundError(
            f"array file of {name} missing or unreadable in {step_dir}: {error}"
        ) from error


def _orbax_sources(item_dir: str, context: ts.Context) -> dict[_tree.Path, Any]:
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
        if metadata.get("use_ocdbt", True):
            kvstore: dict[str, Any] = {"driver": "ocdbt", "base": f"file://{base}", "path": name + "/"}
        else:
            kvstore = {"driver": "file", "path": base + name + "/"}
        spec = {"driver": driver, "kvstore": kvstore}
        store = _open_or_fail(spec, context, name, item_dir)
        sources[path] = LazyArray(
            name, tuple(store.shape), np.dtype(store.dtype.numpy_dtype), spec, context=context
        )
        sources[path].set_store(store)
    tree = _tree.unflatten(sources)
    if "optimizer" in tree and isinstance(tree["optimizer"], dict):
        tree = tree["optimizer"]
    return _tree.flatten(tree, is_leaf=lambda x: isinstance(x, LazyArray))


def read_sources(step_dir: str) -> dict[_tree.Path, Any]:
    """Every leaf of a step folder as a :class:`LazyArray` (or an inline value).

    Args:
      step_dir: a ``checkpoint_<step>`` folder in either layout.

    Returns:
      ``{("target", ...): LazyArray}``; nothing is read from array files yet.

    Raises:
      FileNotFoundError: neither layout's index is there.
      CorruptIndexError: the index cannot be decoded.
    """
    context = _format.ts_context()
    if os.path.isfile(os.path.join(step_dir, _format.INDEX_FILE)):
        return _t5x_sources(step_dir, context)
    item = os.path.join(step_dir, ORBAX_ITEM)
    if os.path.isfile(os.path.join(item, ORBAX_METADATA)):
        return _orbax_sources(item, context)
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
                raise FileNotFoundError(
                    f"array file of {source.name} missing or unreadable: {error}"
                ) from error
    reads = [(s, s.read_future()) for s in sources]
    out = []
    for source, future in reads:
        try:
            out.append(source.finish(future.result()))
        except Exception as error:
            raise FileNotFoundError(f"cannot read the array of {source.name}: {error}") from error
    return out
