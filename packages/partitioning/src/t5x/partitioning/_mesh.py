"""Device meshes with a ``data`` and a ``model`` axis (and optionally ``replica``)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import AxisType, Mesh

# Upstream t5x's default model-parallel tiles (x, y, z, cores) per TPU generation,
# keyed by num_partitions; used so that a user's num_partitions gives the same
# layout here as there.
_TPU_V3_SUBMESH = {1: (1, 1, 1, 1), 2: (1, 1, 1, 2), 4: (2, 1, 1, 2), 8: (2, 2, 1, 2), 16: (4, 2, 1, 2)}


class MeshError(ValueError):
    """Mesh options that do not fit the devices or each other (each message names both)."""


def make_mesh(devices: np.ndarray, axis_names: Sequence[str]) -> Mesh:
    """Wraps a device array into a ``Mesh`` whose axes shard automatically (GSPMD).

    Args:
      devices: an object array of devices, one dimension per axis name.
      axis_names: the mesh axis names.

    Returns:
      A ``jax.sharding.Mesh`` with ``AxisType.Auto`` on every axis.
    """
    return Mesh(devices, tuple(axis_names), axis_types=(AxisType.Auto,) * len(axis_names))


def _sorted_devices(devices: Sequence[Any] | None) -> list[Any]:
    devices = list(jax.devices() if devices is None else devices)
    if not devices:
        raise MeshError("no devices given to build a mesh from")
    return sorted(devices, key=lambda d: (d.process_index, d.id))


def _check_partitions(num_partitions: int, num_devices: int) -> None:
    if not isinstance(num_partitions, int) or num_partitions < 1:
        raise MeshError(f"num_partitions must be a positive int, got {num_partitions!r}")
    if num_devices % num_partitions:
        raise MeshError(
            f"num_partitions={num_partitions} does not divide the device count {num_devices}; "
            f"choose one of {[p for p in range(1, num_devices + 1) if num_devices % p == 0]}"
        )


def _process_major_mesh(num_partitions: int, devices: Sequence[Any] | None) -> Mesh:
    """A (data, model) mesh with the model axis inside a process where it fits.

    Processes are the slow links (DCN between hosts, or between local CPU
    processes); devices of one process share the fast one (NVLink, memory).
    The model axis takes fast links first and spans processes only when it is
    larger than one process's device count.
    """
    ordered = _sorted_devices(devices)
    _check_partitions(num_partitions, len(ordered))
    processes = sorted({d.process_index for d in ordered})
    per_process = len(ordered) // len(processes)
    if any(sum(d.process_index == p for d in ordered) != per_process for p in processes):
        raise MeshError("every process must contribute the same number of devices to the mesh")
    inner_model = min(num_partitions, per_process)
    if per_process % inner_model or num_partitions % inner_model:
        raise MeshError(
            f"num_partitions={num_partitions} must be a factor or a multiple of the "
            f"{per_process} devices per process"
        )
    outer_model = num_partitions // inner_model
    if len(processes) % outer_model:
        raise MeshError(
            f"num_partitions={num_partitions} spans {outer_model} processes, which does not divide "
            f"the {len(processes)} processes"
        )
    grid: np.ndarray = np.empty((len(processes), per_process), dtype=object)
    for i, device in enumerate(ordered):
        grid[i // per_process, i % per_process] = device
    # [outer_data, outer_model, inner_data, inner_model] -> data = outer x inner.
    grid = grid.reshape(len(processes) // outer_model, outer_model, per_process // inner_model, inner_model)
    grid = grid.transpose(0, 2, 1, 3).reshape(-1, num_partitions)
    return make_mesh(grid, ("data", "model"))


def get_cpu_mesh(num_partitions: int = 1, devices: Sequence[Any] | None = None) -> Mesh:
    """A ``('data', 'model')`` mesh over CPU devices (real or virtual).

    Args:
      num_partitions: the size of the ``model`` axis.
      devices: the devices to use; all of ``jax.devices()`` by default.

    Returns:
      A mesh of shape ``[num_devices // num_partitions, num_partitions]``.

    Raises:
      ValueError: ``num_partitions`` does not divide the device count.
    """
    return _process_major_mesh(num_partitions, devices)


def get_gpu_mesh(num_partitions: int = 1, devices: Sequence[Any] | None = None) -> Mesh:
    """A hybrid ``('data', 'model')`` mesh for GPUs: model on NVLink, data over nodes.

    The ``model`` axis uses the GPUs of one process (node) first and spans
    several nodes only when ``num_partitions`` exceeds the GPUs per node.

    Args:
      num_partitions: the size of the ``model`` axis; a factor or a multiple of
        the GPUs per process.
      devices: the devices to use; all of ``jax.devices()`` by default.

    Returns:
      A mesh of shape ``[num_devices // num_partitions, num_partitions]``.

    Raises:
      ValueError: the partition count does not fit the devices.
    """
    return _process_major_mesh(num_partitions, devices)


def _hardware_coords(device: Any, local_index: int) -> tuple[int, ...]:
    if hasattr(device, "coords"):
        return (*device.coords, getattr(device, "core_on_chip", 0))
    return (device.process_index, local_index)


def _device_grid(devices: Sequence[Any]) -> np.ndarray:
    """Places devices at their physical coordinates: (x, y, z, core) on TPU, (process, local) otherwise."""
    ordered = _sorted_devices(devices)
    local_rank: dict[int, int] = {}
    coords = []
    for device in ordered:
        index = local_rank.get(device.process_index, 0)
        local_rank[device.process_index] = index + 1
        coords.append(_hardware_coords(device, index))
    if not hasattr(ordered[0], "coords"):
        processes = sorted(local_rank)
        coords = [(processes.index(c[0]), c[1]) for c in coords]
    lows = np.min(coords, axis=0)
    shape = tuple(int(s) for s in np.max(coords, axis=0) - lows + 1)
    if math.prod(shape) != len(ordered):
        raise MeshError(f"the {len(ordered)} devices do not fill a hardware grid of shape {shape}")
    grid = np.empty(shape, dtype=object)
    for device, c in zip(ordered, coords):
        grid[tuple(np.subtract(c, lows))] = device
    return grid


def _local_block(grid: np.ndarray, process_index: int) -> tuple[int, ...]:
    """The bounding-box shape of one process's devices in the hardware grid."""
    positions = np.argwhere(np.vectorize(lambda d: d.process_index == process_index)(grid))
    return tuple(int(s) for s in positions.max(axis=0) - positions.min(axis=0) + 1)


def get_mesh(
    model_parallel_submesh: Sequence[int],
    input_devices: Sequence[Any] | None = None,
    input_local_devices: Sequence[Any] | None = None,
    tile_by_host_if_needed: bool = True,
    backend: str | None = None,
    *,
    devices: Sequence[Any] | None = None,
) -> Mesh:
    """A ``('data', 'model')`` mesh whose model axis is a tile of the physical topology.

    ``model_parallel_submesh`` is one model replica's tile of the hardware
    grid, ``(x, y, z, cores)`` on TPU (``(processes, devices)`` elsewhere). The
    tile is repeated over the grid; the tiles form the ``data`` axis. The
    assignment is tiled by host so that each process's devices hold a
    contiguous block of every data-sharded array.

    Args:
      model_parallel_submesh: one size per hardware-grid dimension; each must
        divide the grid's size there.
      input_devices: the devices to use (upstream's name); all of
        ``jax.devices(backend)`` by default.
      input_local_devices: one process's devices, whose block of the grid
        sets the host tiling (default: the block of the first device's process).
      tile_by_host_if_needed: accepted for upstream's signature; the mesh is
        always tiled by host.
      backend: the platform whose devices to use when none are given.
      devices: the same as ``input_devices``.

    Returns:
      A mesh of shape ``[num_devices // prod(submesh), prod(submesh)]``.

    Raises:
      ValueError: the tile does not fit the grid or the per-host blocks.
    """
    del tile_by_host_if_needed
    if devices is not None and input_devices:
        raise MeshError("give input_devices or devices, not both")
    chosen = list(devices if devices is not None else input_devices or jax.devices(backend))
    grid = _device_grid(_sorted_devices(chosen))
    submesh = tuple(int(s) for s in model_parallel_submesh)
    if len(submesh) != grid.ndim:
        raise MeshError(
            f"model_parallel_submesh {submesh} must have {grid.ndim} entries, one per dimension of the "
            f"hardware grid of shape {grid.shape}"
        )
    if any(s < 1 or g % s for g, s in zip(grid.shape, submesh)):
        raise MeshError(
            f"each dimension of model_parallel_submesh {submesh} must divide the corresponding "
            f"dimension of the hardware grid {grid.shape}"
        )
    owner = input_local_devices[0].process_index if input_local_devices else grid.flat[0].process_index
    local = _local_block(grid, owner)
    if any(g % size for g, size in zip(grid.shape, local)):
        raise MeshError(f"per-process device block {local} does not tile the hardware grid {grid.shape}")
    split: list[int] = []
    for g, m, block in zip(grid.shape, submesh, local):
        # Split each grid dimension into data-hosts, data-devices, model-hosts, model-devices.
        if m >= block:
            if m % block:
                raise MeshError(
                    f"model_parallel_submesh {submesh} must be a factor or a multiple of the per-process "
                    f"block {local} in every dimension"
                )
            split += [g // m, 1, m // block, block]
        else:
            if block % m:
                raise MeshError(
                    f"model_parallel_submesh {submesh} must be a factor or a multiple of the per-process "
                    f"block {local} in every dimension"
                )
            split += [g // block, block // m, 1, m]
    ndim = grid.ndim
    tiled = grid.reshape(split).transpose(*(4 * i + k for k in range(4) for i in range(ndim)))
    return make_mesh(tiled.reshape(-1, math.prod(submesh)), ("data", "model"))


def _default_tpu_submesh(
    device_kind: str, bounds: tuple[int, ...], num_partitions: int
) -> tuple[int, ...] | None:
    if device_kind in ("TPU v2", "TPU v3"):
        return _TPU_V3_SUBMESH.get(num_partitions)
    if device_kind in ("TPU v4", "TPU v4 lite") and bounds[3] == 1:
        x, _, z, _ = bounds
        table = {
            1: (1, 1, 1, 1),
            2: (1, 2, 1, 1),
            4: (4, 1, 1, 1) if x >= 4 else (2, 2, 1, 1),
            8: (1, 1, 8, 1) if z >= 8 else (4, 2, 1, 1),
            16: (1, 1, 16, 1)
            if z >= 16
            else (8, 2, 1, 1)
            if x >= 8
            else (4, 4, 1, 1)
            if x >= 4
            else (2, 2, 4, 1),
        }
        return table.get(num_partitions)
    return None


def default_mesh(
    num_partitions: int | None = None,
    model_parallel_submesh: Sequence[int] | None = None,
    *,
    devices: Sequence[Any] | None = None,
    ici_mesh_shape: Sequence[int] | None = None,
    dcn_mesh_shape: Sequence[int] | None = None,
) -> Mesh:
    """Picks a mesh for the available devices, as upstream t5x does.

    Multi-slice (``ici_mesh_shape`` and ``dcn_mesh_shape``, three entries each)
    gives a ``('replica', 'data', 'model')`` mesh; otherwise the mesh is
    ``('data', 'model')``: from ``model_parallel_submesh`` when given, else the
    process-major mesh on CPU and GPU, and a topology tile on TPU.

    Args:
      num_partitions: the size of the ``model`` axis (default 1).
      model_parallel_submesh: a hardware tile for one model replica (see
        `get_mesh`); overrides ``num_partitions``.
      devices: the devices to use; all of ``jax.devices()`` by default.
      ici_mesh_shape: ``(replica, data, model)`` sizes inside one slice.
      dcn_mesh_shape: ``(replica, data, model)`` sizes across slices.

    Returns:
      A ``jax.sharding.Mesh`` with automatic axes.

    Raises:
      ValueError: the configuration does not fit the devices.
    """
    ordered = _sorted_devices(devices)
    if (ici_mesh_shape is None) != (dcn_mesh_shape is None):
        raise MeshError("give both ici_mesh_shape and dcn_mesh_shape for a multi-slice mesh, or neither")
    if ici_mesh_shape is not None and dcn_mesh_shape is not None:
        if len(ici_mesh_shape) != 3 or len(dcn_mesh_shape) != 3:
            raise MeshError(
                f"ici_mesh_shape {tuple(ici_mesh_shape)} and dcn_mesh_shape {tuple(dcn_mesh_shape)} must "
                "have 3 entries: (replica, data, model)"
            )
        total = math.prod(ici_mesh_shape) * math.prod(dcn_mesh_shape)
        if total != len(ordered):
            raise MeshError(f"the multi-slice mesh has {total} devices but {len(ordered)} are available")
        grid = mesh_utils.create_hybrid_device_mesh(ici_mesh_shape, dcn_mesh_shape, devices=ordered)
        return make_mesh(grid, ("replica", "data", "model"))
    if model_parallel_submesh:
        return get_mesh(model_parallel_submesh, ordered)
    num_partitions = 1 if num_partitions is None else num_partitions
    _check_partitions(num_partitions, len(ordered))
    platform = ordered[0].platform
    if platform != "tpu":
        return _process_major_mesh(num_partitions, ordered)
    grid = _device_grid(ordered)
    submesh = _default_tpu_submesh(ordered[0].device_kind, grid.shape, num_partitions)
    if submesh is not None:
        return get_mesh(submesh, ordered)
    # Newer TPU generations: JAX's own topology-aware placement.
    placed = mesh_utils.create_device_mesh((len(ordered) // num_partitions, num_partitions), devices=ordered)
    return make_mesh(placed, ("data", "model"))
