"""``BasePartitioner``: upstream t5x's abstract partitioner, for users' own subclasses.

Upstream code subclasses it to plug a custom placement into the trainer and
the host-local checkpointer (``t5x.checkpoints``). A subclass provides the mesh,
its ``LocalChunker``, the train state's mesh axes and the partition / compile
steps; the data layout and per-process chunks follow from the mesh here.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from typing import Any

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from t5x.interfaces import DataLayout
from t5x.partitioning._chunker import LocalChunker, LocalChunkInfo


class BasePartitioner(metaclass=abc.ABCMeta):
    """Upstream's partitioner contract.

    Args:
      num_partitions: the size of the model-parallel axis.
      model_parallel_submesh: a hardware tile for one model replica
        (``(x, y, z, cores)``); one of this and ``num_partitions`` is required.
      params_on_devices: whether restored parameters are moved to the devices
        (``move_params_to_devices``) or left in host memory.
      backend: the JAX platform to use (None: the default one).
      ici_mesh_shape, dcn_mesh_shape: multi-slice mesh sizes, kept for subclasses.

    Raises:
      ValueError: neither ``num_partitions`` nor ``model_parallel_submesh`` is given.
    """

    _data_axis: str | None = "data"

    def __init__(
        self,
        num_partitions: int | None = None,
        model_parallel_submesh: Sequence[int] | None = None,
        params_on_devices: bool = True,
        backend: str | None = None,
        ici_mesh_shape: Sequence[int] | None = None,
        dcn_mesh_shape: Sequence[int] | None = None,
    ):
        if not num_partitions and not model_parallel_submesh:
            raise ValueError("BasePartitioner needs num_partitions or model_parallel_submesh; got neither")
        if model_parallel_submesh is not None and len(model_parallel_submesh) != 4:
            raise ValueError(
                f"model_parallel_submesh must have 4 entries (x, y, z, cores), got {tuple(model_parallel_submesh)}"
            )
        self._num_partitions = num_partitions
        self._model_parallel_submesh = model_parallel_submesh
        self._params_on_devices = params_on_devices
        self._backend = backend
        self._ici_mesh_shape = ici_mesh_shape
        self._dcn_mesh_shape = dcn_mesh_shape

    # ---- what a subclass provides -------------------------------------------
    @property
    @abc.abstractmethod
    def _mesh(self) -> Mesh:
        """The device mesh."""

    @property
    @abc.abstractmethod
    def _local_chunker(self) -> LocalChunker:
        """This process's chunks of ``_mesh``."""

    @abc.abstractmethod
    def get_mesh_axes(self, train_state: Any) -> Any:
        """The train state's ``PartitionSpec`` per leaf (None: not partitioned)."""

    @abc.abstractmethod
    def partition(
        self,
        fn: Callable[..., Any],
        in_axis_resources: Any,
        out_axis_resources: Any,
        static_argnums: int | Sequence[int] = (),
        donate_argnums: int | Sequence[int] = (),
    ) -> Any:
        """``fn`` partitioned over the mesh."""

    @abc.abstractmethod
    def compile(self, partitioned_fn: Any, *args: Any) -> Any:
        """``partitioned_fn`` compiled for arguments like ``args``."""

    # ---- derived from the mesh ----------------------------------------------
    @property
    def mesh(self) -> Mesh:
        return self._mesh

    @property
    def data_partition_spec(self) -> PartitionSpec:
        return PartitionSpec(self._data_axis)

    @property
    def data_mesh_size(self) -> int:
        """How many devices split the batch."""
        return 1 if self._data_axis is None else int(self._mesh.shape[self._data_axis])

    @property
    def data_shards(self) -> int:
        """How many distinct batch shards the processes read."""
        return 1 if self._data_axis is None else self._local_chunker.num_chunks[self._data_axis]

    @property
    def data_shard_id(self) -> int:
        """The batch shard this process reads."""
        return 0 if self._data_axis is None else self._local_chunker.chunk_ids[self._data_axis]

    def get_data_layout(self, batch_size: int | None = None, host_index: int | None = None) -> DataLayout:
        """This process's part of a global batch of ``batch_size`` (default: the data mesh size).

        Raises:
          NotImplementedError: ``host_index`` is given (as upstream).
          ValueError: ``batch_size`` does not split over the data axis.
        """
        if host_index is not None:
            raise NotImplementedError(
                "get_data_layout(host_index=...) is not supported; it describes this process"
            )
        if self._data_axis is None:
            size = batch_size or 1
            return DataLayout(size, 0, 1, is_first_host_in_replica_set=jax.process_index() == 0)
        batch_size = batch_size or self.data_mesh_size
        if batch_size % self.data_mesh_size:
            raise ValueError(
                f"batch size {batch_size} is not divisible by the data mesh size {self.data_mesh_size} "
                f"(mesh {dict(self._mesh.shape)})"
            )
        replica_id = self.get_local_chunk_info((batch_size,), [self._data_axis]).replica_id
        return DataLayout(
            batch_size=int(batch_size),
            shard_id=int(self.data_shard_id),
            num_shards=int(self.data_shards),
            is_first_host_in_replica_set=replica_id == 0,
        )

    def get_local_chunk_info(self, global_shape: Sequence[int], mesh_axes: Sequence[Any]) -> LocalChunkInfo:
        """This process's slice of an array of ``global_shape`` split as ``mesh_axes``."""
        return self._local_chunker.get_local_chunk_info(global_shape, mesh_axes)

    @property
    def params_on_devices(self) -> bool:
        return self._params_on_devices

    @params_on_devices.setter
    def params_on_devices(self, value: bool) -> None:
        self._params_on_devices = value

    def get_logical_axes(self, train_state: Any) -> Any:
        """The train state's logical axes (an upstream train state knows them)."""
        return train_state.as_logical_axes()

    def move_params_to_devices(self, train_state: Any, train_state_axes: Any) -> Any:
        """Places the train state on the mesh as ``train_state_axes`` (``PartitionSpec``s) say."""
        shardings = jax.tree.map(
            lambda spec: NamedSharding(self._mesh, spec if spec is not None else PartitionSpec()),
            train_state_axes,
            is_leaf=lambda x: x is None or isinstance(x, PartitionSpec),
        )
        return jax.device_put(train_state, shardings)
