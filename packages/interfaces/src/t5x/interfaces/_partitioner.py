"""The Partitioner contract: placing arrays and programs on a device mesh."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from t5x.interfaces._values import DataLayout, PyTree


@runtime_checkable
class Partitioner(Protocol):
    """Compiles functions for a device mesh and moves data onto it.

    Shardings are given as trees of logical axis names or as ``jax.sharding``
    objects; the partitioner maps names to mesh axes with its rules. In such a
    tree a tuple of names and Nones (``("batch", "length")``, ``(None, "embed")``)
    is one leaf, one entry per array dimension; ``None`` and ``()`` mean fully
    replicated (not JAX's "unspecified").

    Attributes:
      mesh: the ``jax.sharding.Mesh`` in use.
    """

    mesh: Any

    def partition(
        self,
        fn: Callable[..., Any],
        in_shardings: PyTree,
        out_shardings: PyTree,
        static_argnums: int | Sequence[int] = (),
        donate_argnums: int | Sequence[int] = (),
    ) -> Callable[..., Any]:
        """Returns ``fn`` jitted with these shardings, the mesh and rules in force.

        ``in_shardings`` is a tuple with one sharding tree per positional
        argument of ``fn``; ``out_shardings`` is one tree like ``fn``'s result.
        """
        ...

    def compile(self, partitioned_fn: Callable[..., Any], *args: Any) -> Callable[..., Any]:
        """Compiles ``partitioned_fn`` ahead of time for arguments like ``args``."""
        ...

    def get_data_layout(self, batch_size: int | None = None) -> DataLayout:
        """Says which data shard this process reads and how large its part is.

        Raises:
          ValueError: ``batch_size`` is not divisible by the data-parallel size.
        """
        ...

    def get_sharding(self, logical_axes: PyTree) -> PyTree:
        """Maps a tree of logical axis names to ``jax.sharding.NamedSharding``s."""
        ...

    def host_local_to_global(
        self, batch: Mapping[str, np.ndarray], logical_axes: PyTree = None
    ) -> dict[str, Any]:
        """Turns this process's part of a batch into global ``jax.Array``s.

        Each process passes ``DataLayout.per_shard_batch_size`` examples; the
        result has ``DataLayout.batch_size`` rows sharded over the mesh.
        """
        ...

    def global_to_host_local(self, arrays: PyTree) -> PyTree:
        """Returns the full value of global arrays as numpy, on every process."""
        ...
