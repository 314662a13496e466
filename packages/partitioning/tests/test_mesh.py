import dataclasses
import itertools

import numpy as np
import pytest
from jax.sharding import AxisType

import t5x.partitioning as tp


@dataclasses.dataclass(frozen=True)
class FakeTpu:
    """A device with TPU topology attributes (the mesh code reads nothing else)."""

    id: int
    process_index: int
    coords: tuple[int, int, int]
    core_on_chip: int = 0
    platform: str = "tpu"
    device_kind: str = "TPU v4"


@dataclasses.dataclass(frozen=True)
class FakeGpu:
    id: int
    process_index: int
    platform: str = "gpu"
    device_kind: str = "fake"


def tpu_pod(bounds, host_block):
    """Devices on an (x, y, z) torus; each host owns a block of shape host_block."""
    devices = []
    hosts_per_dim = [b // h for b, h in zip(bounds, host_block)]
    for i, (x, y, z) in enumerate(itertools.product(*(range(b) for b in bounds))):
        host = np.ravel_multi_index(
            (x // host_block[0], y // host_block[1], z // host_block[2]), hosts_per_dim
        )
        devices.append(FakeTpu(id=i, process_index=int(host), coords=(x, y, z)))
    return devices


def test_cpu_mesh_shapes_and_axis_types(devices):
    for partitions, shape in [(1, (8, 1)), (2, (4, 2)), (4, (2, 4)), (8, (1, 8))]:
        mesh = tp.get_cpu_mesh(partitions, devices)
        assert dict(mesh.shape) == {"data": shape[0], "model": shape[1]}
        assert mesh.axis_types == (AxisType.Auto, AxisType.Auto)
        assert sorted(d.id for d in mesh.devices.flat) == sorted(d.id for d in devices)


def test_single_device_mesh(devices):
    mesh = tp.default_mesh(1, devices=devices[:1])
    assert dict(mesh.shape) == {"data": 1, "model": 1}


def test_num_partitions_must_divide_device_count(devices):
    with pytest.raises(
        ValueError, match=r"num_partitions=3 does not divide the device count 8.*\[1, 2, 4, 8\]"
    ):
        tp.default_mesh(3, devices=devices)
    with pytest.raises(ValueError, match="positive int"):
        tp.get_cpu_mesh(0, devices)


def test_gpu_mesh_keeps_model_inside_a_process():
    # 4 processes x 4 GPUs.
    gpus = [FakeGpu(id=p * 4 + i, process_index=p) for p in range(4) for i in range(4)]
    mesh = tp.get_gpu_mesh(2, gpus)
    assert dict(mesh.shape) == {"data": 8, "model": 2}
    for row in mesh.devices:
        assert len({d.process_index for d in row}) == 1
    # Each process holds a contiguous block of the data axis.
    for p in range(4):
        rows = [i for i, row in enumerate(mesh.devices) if row[0].process_index == p]
        assert rows == list(range(2 * p, 2 * p + 2))


def test_gpu_mesh_model_spanning_processes():
    gpus = [FakeGpu(id=p * 4 + i, process_index=p) for p in range(4) for i in range(4)]
    mesh = tp.get_gpu_mesh(8, gpus)
    assert dict(mesh.shape) == {"data": 2, "model": 8}
    # Fast links first: the model axis covers all 4 GPUs of one process, then a second process.
    for row in mesh.devices:
        procs = [d.process_index for d in row]
        assert procs[:4] == [procs[0]] * 4 and procs[4:] == [procs[4]] * 4 and procs[0] != procs[4]
    with pytest.raises(ValueError, match="factor or a multiple"):
        tp.get_gpu_mesh(6, [FakeGpu(id=i, process_index=i // 4) for i in range(12)])


def test_tpu_submesh_tiles_the_torus():
    # A 4x4x1 v4 slice, 4 hosts of 2x2 chips each.
    pod = tpu_pod((4, 4, 1), (2, 2, 1))
    mesh = tp.get_mesh((2, 1, 1, 1), pod)
    assert dict(mesh.shape) == {"data": 8, "model": 2}
    for row in mesh.devices:
        # One model replica = 2 chips adjacent in x, on one host.
        (x0, y0, z0), (x1, y1, z1) = row[0].coords, row[1].coords
        assert (abs(x1 - x0), y1 - y0, z1 - z0) == (1, 0, 0)
        assert row[0].process_index == row[1].process_index
    # Tiled by host: each host holds a contiguous, aligned block of the data axis.
    chunks = tp.process_chunks(mesh, ("data",))
    assert chunks.num_chunks == 4
    assert sorted(chunks.chunk_of_process.values()) == [0, 1, 2, 3]


def test_tpu_submesh_larger_than_a_host():
    pod = tpu_pod((4, 4, 1), (2, 2, 1))
    mesh = tp.get_mesh((4, 2, 1, 1), pod)
    assert dict(mesh.shape) == {"data": 2, "model": 8}
    for row in mesh.devices:
        xs = sorted({d.coords[0] for d in row})
        ys = sorted({d.coords[1] for d in row})
        assert xs == [0, 1, 2, 3] and len(ys) == 2 and ys[1] - ys[0] == 1


def test_tpu_default_mesh_uses_upstream_table():
    pod = tpu_pod((4, 4, 1), (2, 2, 1))
    # v4 with x >= 4: 4 partitions -> a (4, 1, 1, 1) tile along x.
    mesh = tp.default_mesh(4, devices=pod)
    for row in mesh.devices:
        assert sorted(d.coords[0] for d in row) == [0, 1, 2, 3]
        assert len({d.coords[1] for d in row}) == 1


def test_bad_submesh_is_rejected():
    pod = tpu_pod((4, 4, 1), (2, 2, 1))
    with pytest.raises(ValueError, match="must divide"):
        tp.get_mesh((3, 1, 1, 1), pod)
    with pytest.raises(ValueError, match="4 entries"):
        tp.get_mesh((2, 2), pod)


def test_model_parallel_submesh_on_cpu(devices):
    # Non-TPU hardware grid is (processes, devices per process).
    mesh = tp.default_mesh(model_parallel_submesh=(1, 4), devices=devices)
    assert dict(mesh.shape) == {"data": 2, "model": 4}


def test_multi_slice_mesh_has_a_replica_axis(devices):
    mesh = tp.default_mesh(ici_mesh_shape=(1, 2, 2), dcn_mesh_shape=(2, 1, 1), devices=_with_slices(devices))
    assert mesh.axis_names == ("replica", "data", "model")
    assert dict(mesh.shape) == {"replica": 2, "data": 2, "model": 2}
    for replica in range(2):
        assert {d.slice_index for d in mesh.devices[replica].flat} == {replica}
    with pytest.raises(ValueError, match="3 entries"):
        tp.default_mesh(ici_mesh_shape=(4, 2), dcn_mesh_shape=(1, 1))


@dataclasses.dataclass(frozen=True)
class _SliceDevice:
    id: int
    process_index: int
    slice_index: int
    platform: str = "cpu"
    device_kind: str = "cpu"


def _with_slices(devices):
    return [_SliceDevice(id=d.id, process_index=0, slice_index=i // 4) for i, d in enumerate(devices)]
