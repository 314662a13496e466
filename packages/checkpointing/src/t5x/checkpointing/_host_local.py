"""Host-local saves: every process writes its own part of each global array.

This is upstream t5x's save protocol for train states held as per-process
numpy chunks (``Checkpointer(..., use_gda=False)``): the processes are told
their index and count rather than asking ``jax`` (a caller may describe a
mesh's processes), each writes the chunks it owns into
``checkpoint_<step>.tmp-<stamp>``, and process 0, once all have written, adds
the index and the checksum manifest and renames the folder. The step folder is
the same T5X layout the ``Checkpointer`` writes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from t5x.checkpointing import _format, _integrity, _multihost, _specs, _tree
from t5x.checkpointing._checkpointer import commit_step


@dataclasses.dataclass(frozen=True)
class HostChunk:
    """One process's part of a global array, for :func:`save_host_local`.

    Attributes:
      data: the values this process holds (numpy), of the shape ``index`` selects.
      index: where ``data`` sits in the global array, one ``slice`` per dimension.
      global_shape: the whole array's shape.
      write: whether this process writes the part (False on all but one of the
        processes holding the same part, e.g. a replica id other than 0).
    """

    data: Any
    index: tuple[slice, ...]
    global_shape: tuple[int, ...]
    write: bool = True


def _concrete(index: Sequence[slice], shape: Sequence[int]) -> tuple[slice, ...]:
    return tuple(slice(*s.indices(n)[:2]) for s, n in zip(index, shape))


def _leaf(path: _tree.Path, value: Any, save_dtype: np.dtype | None) -> _format.HostLeaf:
    if value is None:  # an unused slot: kept in the index, as upstream writes it
        return _format.HostLeaf(path, (), np.dtype("float32"), None, [], inline=None)
    if isinstance(value, Mapping):  # an empty optax slot
        return _format.HostLeaf(path, (), np.dtype("float32"), None, [], inline={})
    if isinstance(value, HostChunk):
        data = np.asarray(value.data)
        shape = tuple(int(n) for n in value.global_shape)
        index = _concrete(value.index, shape)
        part = tuple(s.stop - s.start for s in index)
        if data.shape != part:
            raise ValueError(
                f"{_tree.slash_name(path)}: this process's chunk has shape {data.shape}, but its index "
                f"{index} of the global shape {shape} selects {part}"
            )
        dtype = _format._save_dtype_for(path, data.dtype, save_dtype)
        chunks = _specs.choose_chunk_shape(part, dtype.itemsize)
        return _format.HostLeaf(path, shape, dtype, chunks, [(index, data)] if value.write else [])
    if isinstance(value, str):
        return _format.HostLeaf(path, (), np.dtype("O"), None, [], inline=value)
    array = np.asarray(value)
    dtype = _format._save_dtype_for(path, array.dtype, save_dtype)
    return _format.HostLeaf(path, array.shape, dtype, None, [], inline=_format._cast(array, dtype))


def save_host_local(
    model_dir: str | os.PathLike[str],
    step: int,
    state: Mapping[str, Any],
    *,
    process_index: int,
    process_count: int,
    stamp: str,
    save_dtype: Any = None,
    compression: str = "gzip",
    before_commit: Callable[[str], None] | None = None,
) -> str:
    """Writes this process's part of ``state`` as step ``step``; process 0 completes the step.

    Every process calls this with the same ``step``, ``stamp`` and tree
    structure; process 0 calls it last or, in a ``jax.distributed`` job, at the
    same time (it waits at a barrier for the others).

    Args:
      model_dir: the folder of step folders.
      step: the step number.
      state: a T5X state dict: :class:`HostChunk` leaves are written to
        TensorStore arrays, other leaves (process 0's) inline in the index.
      process_index: this process's index among the writers.
      process_count: how many processes write.
      stamp: the temporary folder's suffix, the same on every process.
      save_dtype: floating parameters (``target``) are stored as this dtype.
      compression: ``"gzip"`` (upstream's), ``"zstd"`` or ``"none"``.
      before_commit: called with the temporary folder after this process's
        arrays are written (e.g. to add a dataset iterator checkpoint).

    Returns:
      The step folder (complete once process 0 returns).

    Raises:
      ValueError: a chunk's shape does not match its index.
      OSError: from TensorStore or the file system, naming the array.
    """
    model_dir = os.path.abspath(os.fspath(model_dir))
    final_dir = os.path.join(model_dir, f"checkpoint_{int(step)}")
    tmp_dir = f"{final_dir}.tmp-{stamp}"
    save_dt = None if save_dtype is None else np.dtype(save_dtype)
    flat = _tree.flatten(state, is_leaf=lambda x: x is None or isinstance(x, HostChunk))
    leaves = [_leaf(path, value, save_dt) for path, value in flat.items()]
    os.makedirs(tmp_dir, exist_ok=True)
    checksums = _integrity.WRITE_CHECKSUMS
    written = _format.write_arrays(tmp_dir, leaves, compression, checksums)
    if checksums and process_count > 1:
        _integrity.write_json(
            os.path.join(tmp_dir, _integrity.part_file(process_index, process_count)), written.digests
        )
    if before_commit is not None:
        before_commit(tmp_dir)
    tag = f"t5x_ckpt_host_local/{hashlib.sha1(model_dir.encode()).hexdigest()[:12]}/{step}/{stamp}"
    _multihost.barrier(f"{tag}/written")
    if process_index == 0:
        commit_step(tmp_dir, final_dir, leaves, written, compression, process_count, checksums)
    _multihost.barrier(f"{tag}/renamed")
    return final_dir
