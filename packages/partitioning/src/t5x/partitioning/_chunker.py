"""``LocalChunker``: which slice of a globally sharded array this process holds."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
from jax.sharding import Mesh


@dataclasses.dataclass(frozen=True)
class LocalChunkInfo:
    """This process's part of a global array.

    Attributes:
      slice: one ``slice`` per dimension of the global array (``slice(None)`` when that
        dimension is not split over processes).
      replica_id: which copy this process holds among the processes that hold the same
        slice (0 for exactly one of them).
    """

    slice: tuple[slice, ...]
    replica_id: int


class LocalChunker:
    """Splits global arrays into the per-process chunks a mesh implies.

    A mesh tiled by host (as ``get_mesh`` / ``default_mesh`` build it) gives each process a
    block of every mesh axis. Along axis ``a`` there are ``num_chunks[a]`` such blocks and this
    process holds block ``chunk_ids[a]``.

    Args:
      global_mesh: the device mesh.
      process_index: the process to describe; by default this one (the owner of
        ``global_mesh.local_mesh``).

    Raises:
      ValueError: that process's devices do not form one block of the mesh.
    """

    def __init__(self, global_mesh: Mesh, process_index: int | None = None):
        self.global_mesh = global_mesh
        if process_index is None:
            process_index = global_mesh.local_mesh.devices.flat[0].process_index
        owned = np.vectorize(lambda d: d.process_index == process_index, otypes=[bool])(global_mesh.devices)
        if not owned.any():
            raise ValueError(f"process {process_index} has no devices in mesh {dict(global_mesh.shape)}")
        positions = np.argwhere(owned)
        start, stop = positions.min(axis=0), positions.max(axis=0) + 1
        self.num_chunks: dict[str, int] = {}
        self.chunk_ids: dict[str, int] = {}
        for axis, name in enumerate(global_mesh.axis_names):
            block = int(stop[axis] - start[axis])
            if (
                int(owned.sum()) != int(np.prod(stop - start))
                or global_mesh.shape[name] % block
                or start[axis] % block
            ):
                raise ValueError(
                    f"the devices of process {process_index} do not form one aligned block of mesh "
                    f"{dict(global_mesh.shape)} along axis {name!r}; build the mesh with get_mesh/default_mesh, "
                    "which tile by host"
                )
            self.num_chunks[name] = global_mesh.shape[name] // block
            self.chunk_ids[name] = int(start[axis]) // block

    def _linear(self, axes: Sequence[str]) -> tuple[int, int]:
        """``(chunk id, chunk count)`` over several mesh axes, the first one major."""
        chunk, count = 0, 1
        for name in axes:
            chunk = chunk * self.num_chunks[name] + self.chunk_ids[name]
            count *= self.num_chunks[name]
        return chunk, count

    def get_local_chunk_info(self, global_shape: Sequence[int], mesh_axes: Sequence[Any]) -> LocalChunkInfo:
        """This process's slice of an array of ``global_shape`` sharded as ``mesh_axes``.

        As upstream: ``mesh_axes`` may be shorter than the shape (the remaining
        dimensions are not split, as in a ``PartitionSpec``), and a split
        dimension's chunk size is ``size // chunks`` (callers that need an even
        split check it; ``t5x.checkpoints`` does).

        Args:
          global_shape: the global array's shape.
          mesh_axes: one entry per leading dimension: a mesh axis name, a tuple of
            them, or None.

        Returns:
          The slice and the replica id (counted over the mesh axes the array does not use).

        Raises:
          ValueError: ``mesh_axes`` has more entries than the shape, or names an unknown axis.
        """
        if len(mesh_axes) > len(global_shape):
            raise ValueError(
                f"mesh_axes {tuple(mesh_axes)} has more entries than shape {tuple(global_shape)} has dimensions"
            )
        used: list[str] = []
        slices = [slice(None)] * len(global_shape)
        for dim, (size, axes) in enumerate(zip(global_shape, mesh_axes)):
            if axes is None:
                continue
            names = (axes,) if isinstance(axes, str) else tuple(axes)
            unknown = [n for n in names if n not in self.num_chunks]
            if unknown:
                raise ValueError(f"mesh axes {unknown} are not in the mesh axes {tuple(self.num_chunks)}")
            used.extend(names)
            chunk, count = self._linear(names)
            step = size // count
            slices[dim] = slice(chunk * step, (chunk + 1) * step)
        replica_id, _ = self._linear([n for n in self.global_mesh.axis_names if n not in used])
        return LocalChunkInfo(slice=tuple(slices), replica_id=replica_id)
