"""Device meshes, logical-axis rules and a jit-based Partitioner for t5x."""

from jax.sharding import PartitionSpec

from t5x.partitioning._base import BasePartitioner
from t5x.partitioning._chunker import LocalChunker, LocalChunkInfo
from t5x.partitioning._context import axis_rules, with_sharding_constraint
from t5x.partitioning._layout import ProcessChunks, process_chunks
from t5x.partitioning._mesh import MeshError, default_mesh, get_cpu_mesh, get_gpu_mesh, get_mesh, make_mesh
from t5x.partitioning._multihost import (
    assert_same_across_processes,
    barrier,
    broadcast_seed,
    initialize_distributed,
    is_process_zero,
    on_process_zero,
)
from t5x.partitioning._partitioner import ModelBasedPjitPartitioner, PartitionedFunction, PjitPartitioner
from t5x.partitioning._rules import (
    AxisNames,
    LogicalAxisRules,
    MeshAxes,
    get_logical_axes,
    is_axes_leaf,
    logical_to_mesh_axes,
    logical_to_partition_specs,
    logical_to_shardings,
    standard_logical_axis_rules,
    update_logical_axis_rules,
)
from t5x.partitioning._topology import bounds_from_last_device, get_coords

__all__ = [
    "AxisNames",
    "BasePartitioner",
    "LocalChunkInfo",
    "LocalChunker",
    "PartitionSpec",
    "bounds_from_last_device",
    "get_coords",
    "update_logical_axis_rules",
    "LogicalAxisRules",
    "MeshAxes",
    "MeshError",
    "ModelBasedPjitPartitioner",
    "PartitionedFunction",
    "PjitPartitioner",
    "ProcessChunks",
    "assert_same_across_processes",
    "axis_rules",
    "barrier",
    "broadcast_seed",
    "default_mesh",
    "get_cpu_mesh",
    "get_gpu_mesh",
    "get_logical_axes",
    "get_mesh",
    "initialize_distributed",
    "is_axes_leaf",
    "is_process_zero",
    "logical_to_mesh_axes",
    "logical_to_partition_specs",
    "logical_to_shardings",
    "make_mesh",
    "on_process_zero",
    "process_chunks",
    "standard_logical_axis_rules",
    "with_sharding_constraint",
]
