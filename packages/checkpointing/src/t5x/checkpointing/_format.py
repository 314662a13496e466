"""One step folder of the T5X format: snapshot, write, and read back.

Layout of ``checkpoint_<step>/`` (format version 3):

* ``checkpoint`` — msgpack index ``{"version": 3, "optimizer": {"target": ...,
  "state": {"step": ..., "param_states": ...}}}``; scalars inline, every other
  array replaced by a relative TensorStore zarr spec;
* ``<dotted state path>/`` — one zarr v2 array per non-scalar leaf, e.g.
  ``target.encoder.layers_0.attention.query.kernel/`` or
  ``state.param_states.encoder.layers_0.attention.query.kernel.v_row/``;
* ``train_ds-<process>-of-<count>.json`` — each process's input-iterator state;
* ``checksums.json`` — digests of every chunk and file (see ``_integrity``);
* ``PINNED`` — optional; a pinned step is never deleted by retention.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
import tensorstore as ts

from t5x.checkpointing import _codec, _integrity, _specs, _tree

FORMAT_VERSION = 3
INDEX_FILE = "checkpoint"
PINNED_FILE = "PINNED"
INPUT_STATE_PREFIX = "train_ds"

Index = tuple[slice, ...]


@dataclasses.dataclass
class HostLeaf:
    """One leaf of a train state, copied to host memory for writing.

    Attributes:
      path: the leaf's key path, e.g. ``("target", "encoder", "kernel")``.
      shape: the global shape.
      dtype: the dtype to store.
      chunks: zarr chunk shape, or None for an inline (scalar) leaf.
      pieces: ``(global index, array)`` pairs this process writes (numpy, or
        a private single-device copy read into numpy by the writer).
      inline: the value stored inside the index (inline leaves only).
      device_copy: a private copy of a ``jax.Array`` whose replica-0 shards
        this process writes (split into pieces by the background writer).
    """

    path: _tree.Path
    shape: tuple[int, ...]
    dtype: np.dtype
    chunks: list[int] | None
    pieces: list[tuple[Index, Any]]
    inline: Any = None
    device_copy: Any = None

    def host_pieces(self) -> list[tuple[Index, Any]]:
        """``pieces``, plus the replica-0 shards of ``device_copy`` when there is one."""
        if self.device_copy is None:
            return self.pieces
        return [(s.index, s.data) for s in self.device_copy.addressable_shards if s.replica_id == 0]


def input_state_file(process_index: int, process_count: int) -> str:
    """The per-process input-state file name, e.g. ``train_ds-000-of-002.json``."""
    return f"{INPUT_STATE_PREFIX}-{process_index:03d}-of-{process_count:03d}.json"


def ts_context() -> ts.Context:
    """A TensorStore context with enough parallelism for many small files."""
    return ts.Context(
        {
            "file_io_concurrency": {"limit": 128},
            "data_copy_concurrency": {"limit": max(2, os.cpu_count() or 2)},
        }
    )


def _cast(array: np.ndarray, dtype: np.dtype | None) -> np.ndarray:
    # jax.dtypes.issubdtype: numpy does not count bfloat16 as floating, and an uncast bfloat16
    # host copy would be digested as bfloat16 while TensorStore stores the converted values.
    if dtype is None or array.dtype == dtype or not jax.dtypes.issubdtype(array.dtype, np.floating):
        return array
    return array.astype(dtype)


def _save_dtype_for(path: _tree.Path, dtype: np.dtype, save_dtype: np.dtype | None) -> np.dtype:
    # Only parameters are cast (as upstream): optimizer slots keep full precision.
    if save_dtype is not None and path[0] == "target" and jax.dtypes.issubdtype(dtype, np.floating):
        return np.dtype(save_dtype)
    return np.dtype(dtype)


# Below this size a host copy (a few microseconds) is cheaper than queuing a
# device copy; above it the asynchronous device copy keeps ``save`` short.
_SMALL_BYTES = 1 << 16


def _all_on_cpu(arrays: list[jax.Array]) -> bool:
    return all(getattr(d, "platform", None) == "cpu" for x in arrays for d in x.sharding.device_set)


def _private_copies(arrays: list[jax.Array]) -> list[Any]:
    """Copies that the caller cannot donate or delete under the background writer.

    On the CPU backend large arrays get an asynchronous device-side copy (host
    memory already), so the caller blocks only while it is dispatched; small,
    fully addressable ones are copied to numpy at once. On accelerators the
    replica-0 shards are copied to host memory: the device-to-host transfer is
    the part a caller must wait for.

    Returns:
      Per array: a numpy copy of the whole array, a ``jax.Array`` copy, or a
      list of ``(index, numpy copy)`` of its replica-0 shards.
    """
    if not arrays:
        return []
    if not _all_on_cpu(arrays):
        shards = [[s for s in array.addressable_shards if s.replica_id == 0] for array in arrays]
        for shard_list in shards:
            for shard in shard_list:
                shard.data.copy_to_host_async()  # all transfers in flight before waiting on any
        return [[(s.index, np.asarray(s.data)) for s in shard_list] for shard_list in shards]
    out: list[Any] = [None] * len(arrays)
    large = []
    for i, array in enumerate(arrays):
        if array.is_fully_addressable and array.size * array.dtype.itemsize < _SMALL_BYTES:
            out[i] = np.array(array)
        else:
            large.append(i)
    copies = jax.device_put([arrays[i] for i in large], [arrays[i].sharding for i in large], may_alias=False)
    for i, copy in zip(large, copies):
        out[i] = copy
    return out


def snapshot(state: Mapping[str, Any], save_dtype: Any = None) -> list[HostLeaf]:
    """Takes what this process must write out of the caller's hands.

    This is the only blocking part of an asynchronous save. Device arrays are
    copied (see ``_private_copies``); numpy arrays are copied so the caller may
    mutate them afterwards. Of a ``jax.Array`` only the shards with
    ``replica_id == 0`` are kept, so every element is written by exactly one
    process. Non-jax leaves are written by process 0.

    Args:
      state: a T5X state dict.
      save_dtype: optional float dtype for ``target`` leaves.

    Returns:
      One :class:`HostLeaf` per leaf; pieces may still be device arrays, which
      ``write_arrays`` turns into numpy.
    """
    flat = _tree.flatten(state)
    save_dt = None if save_dtype is None else np.dtype(save_dtype)
    is_writer = jax.process_index() == 0
    device_paths = [p for p, v in flat.items() if isinstance(v, jax.Array) and v.ndim > 0]
    copies = dict(zip(device_paths, _private_copies([flat[p] for p in device_paths])))
    leaves = []
    for path, value in flat.items():
        if isinstance(value, Mapping):  # an empty slot (optax EmptyState)
            leaves.append(HostLeaf(path, (), np.dtype("float32"), None, [], inline={}))
            continue
        if isinstance(value, jax.Array):
            dtype = _save_dtype_for(path, value.dtype, save_dt)
            shape = tuple(value.shape)
            if value.ndim == 0:
                local = np.array(value.addressable_shards[0].data)
                leaves.append(HostLeaf(path, shape, dtype, None, [], inline=_cast(local, dtype)))
                continue
            chunks = _specs.choose_chunk_shape(value.sharding.shard_shape(value.shape), dtype.itemsize)
            copy = copies[path]
            if isinstance(copy, list):
                leaves.append(HostLeaf(path, shape, dtype, chunks, copy))
            elif isinstance(copy, np.ndarray):
                pieces = [(tuple(slice(0, n) for n in shape), copy)] if is_writer else []
                leaves.append(HostLeaf(path, shape, dtype, chunks, pieces))
            else:
                leaves.append(HostLeaf(path, shape, dtype, chunks, [], device_copy=copy))
            continue
        if isinstance(value, str):
            leaves.append(HostLeaf(path, (), np.dtype("O"), None, [], inline=value))
            continue
        array = np.array(value, copy=True)
        dtype = _save_dtype_for(path, array.dtype, save_dt)
        if array.ndim == 0:
            leaves.append(HostLeaf(path, (), dtype, None, [], inline=_cast(array, dtype)))
            continue
        full = tuple(slice(0, s) for s in array.shape)
        chunks = _specs.choose_chunk_shape(array.shape, dtype.itemsize)
        leaves.append(HostLeaf(path, array.shape, dtype, chunks, [(full, array)] if is_writer else []))
    return leaves


def write_arrays(
    step_dir: str, leaves: list[HostLeaf], compression: str, checksums: bool = True
) -> _integrity.Written:
    """Writes this process's pieces of every TensorStore leaf under ``step_dir``.

    Every chunk is stored, including one equal to the fill value, so that the
    chunk files of a step are exactly its chunk grid. With ``checksums`` the
    chunks lying wholly inside a piece are digested while TensorStore writes.

    Returns:
      The digests (empty without ``checksums``).

    Raises:
      OSError / ValueError: from TensorStore, naming the leaf's folder.
    """
    context = ts_context()
    opening = []
    for leaf in leaves:
        chunks = leaf.chunks
        pieces = leaf.host_pieces() if chunks is not None else []
        if chunks is None or not pieces:
            continue
        spec = _specs.make_spec(_tree.dotted_name(leaf.path), leaf.shape, leaf.dtype, chunks, compression)
        spec = _specs.resolve_spec(spec, step_dir, _tree.dotted_name(leaf.path))
        spec["metadata"] = _specs.make_spec("x", leaf.shape, leaf.dtype, chunks, compression)["metadata"]
        spec["store_data_equal_to_fill_value"] = True
        opening.append((leaf, pieces, ts.open(spec, create=True, open=True, context=context)))
    # Every future is awaited before an error is raised: a write still in
    # flight would otherwise recreate files in a folder being cleaned up.
    writes: list[tuple[HostLeaf, Any]] = []
    out = _integrity.Written()
    first_error: Exception | None = None
    for leaf, pieces, future in opening:
        try:
            store = future.result()
        except Exception as error:
            first_error = first_error or OSError(
                f"cannot create TensorStore array for {_tree.dotted_name(leaf.path)}: {error}"
            )
            continue
        folder = array_folder(leaf)
        for index, piece in pieces:
            host = _cast(np.asarray(piece), leaf.dtype)
            writes.append((leaf, store[index].write(host)))
            if checksums:
                # Digested at once while TensorStore compresses and writes (xxhash releases the
                # GIL), so that no host copy outlives its write for the sake of the checksums.
                assert leaf.chunks is not None
                found = _integrity.piece_digests(leaf.shape, leaf.chunks, index, host)
                out.digests.setdefault(folder, {}).update(found)
    for leaf, future in writes:
        try:
            future.result()
        except Exception as error:
            first_error = first_error or OSError(
                f"cannot write {_tree.dotted_name(leaf.path)} in {step_dir}: {error}"
            )
    if first_error is not None:
        raise first_error
    return out


def array_folder(leaf: HostLeaf) -> str:
    """A leaf's array folder under the step folder, as the index's spec names it (normalised)."""
    name = _tree.dotted_name(leaf.path)
    return _specs.relative_path({"path": name}, name)


def stored_arrays(leaves: list[HostLeaf]) -> list[_integrity.StoredArray]:
    """The TensorStore arrays of a step (every process knows all of them)."""
    return [
        _integrity.StoredArray(
            array_folder(leaf), tuple(leaf.shape), tuple(leaf.chunks), np.dtype(leaf.dtype).name
        )
        for leaf in leaves
        if leaf.chunks is not None
    ]


def build_index(leaves: list[HostLeaf], compression: str) -> bytes:
    """The msgpack ``checkpoint`` index for ``leaves`` (written by process 0)."""
    flat: dict[_tree.Path, Any] = {}
    for leaf in leaves:
        if leaf.chunks is None:
            flat[leaf.path] = leaf.inline
        else:
            flat[leaf.path] = _specs.make_spec(
                _tree.dotted_name(leaf.path), leaf.shape, leaf.dtype, leaf.chunks, compression
            )
    return _codec.encode_index({"version": FORMAT_VERSION, "optimizer": _tree.unflatten(flat)})


def leaf_nbytes(leaves: list[HostLeaf]) -> int:
    """Bytes this process holds for ``leaves`` (for throughput figures)."""
    return sum(
        int(np.prod(piece.shape)) * leaf.dtype.itemsize for leaf in leaves for _, piece in leaf.host_pieces()
    )
