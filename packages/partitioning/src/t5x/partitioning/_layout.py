"""Which block of a sharded dimension each process holds."""

from __future__ import annotations

import dataclasses

import numpy as np
from jax.sharding import Mesh


@dataclasses.dataclass(frozen=True)
class ProcessChunks:
    """How one array dimension, sharded over some mesh axes, splits over processes.

    Attributes:
      mesh_size: the number of devices the dimension is split over (the product
        of the mesh axes' sizes).
      num_chunks: the number of distinct contiguous blocks processes hold.
      chunk_of_process: process index -> the block it holds, in ``[0, num_chunks)``.
    """

    mesh_size: int
    num_chunks: int
    chunk_of_process: dict[int, int]

    def first_process_of_chunk(self, chunk: int) -> int:
        """The lowest process index holding block ``chunk``."""
        return min(p for p, c in self.chunk_of_process.items() if c == chunk)


def process_chunks(mesh: Mesh, axes: tuple[str, ...]) -> ProcessChunks:
    """Works out how a dimension sharded over ``axes`` of ``mesh`` splits over processes.

    Args:
      mesh: the device mesh.
      axes: the mesh axes the dimension is sharded over, major first; empty for
        a replicated dimension.

    Returns:
      The split, with one block per distinct set of positions a process holds.

    Raises:
      ValueError: some process's devices do not hold one contiguous, equally
        sized block along those axes (the mesh is not tiled by host).
    """
    names = list(mesh.axis_names)
    # Move the sharded axes to the front, in order, and flatten them into one index.
    order = [names.index(a) for a in axes] + [i for i, n in enumerate(names) if n not in axes]
    grid = np.transpose(mesh.devices, order)
    mesh_size = int(np.prod([mesh.shape[a] for a in axes], dtype=int))
    grid = grid.reshape(mesh_size, -1)
    positions: dict[int, set[int]] = {}
    for index in range(mesh_size):
        for device in grid[index]:
            positions.setdefault(device.process_index, set()).add(index)
    blocks = {p: (min(s), max(s) + 1, len(s)) for p, s in positions.items()}
    sizes = {hi - lo for lo, hi, _ in blocks.values()}
    if len(sizes) != 1 or any(hi - lo != n for lo, hi, n in blocks.values()):
        raise ValueError(
            f"the processes' devices do not each hold one contiguous block along mesh axes {axes} of "
            f"mesh {dict(mesh.shape)}; build the mesh with get_mesh/default_mesh, which tile by host"
        )
    (block,) = sizes
    if any(lo % block for lo, _, _ in blocks.values()):
        raise ValueError(f"process blocks along mesh axes {axes} are not aligned to their size {block}")
    return ProcessChunks(
        mesh_size=mesh_size,
        num_chunks=mesh_size // block,
        chunk_of_process={p: lo // block for p, (lo, _, _) in blocks.items()},
    )
