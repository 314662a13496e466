"""Upstream t5x's partitioning names: device coordinates, LocalChunker, rule updates."""

import dataclasses
import itertools
from unittest import mock

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec

import t5x.partitioning as tp


@dataclasses.dataclass(frozen=True)
class FakeTpu:
    id: int
    process_index: int
    coords: tuple[int, int, int]
    core_on_chip: int = 0
    platform: str = "tpu"
    device_kind: str = "TPU v3"


@dataclasses.dataclass(frozen=True)
class FakeCpu:
    id: int
    process_index: int
    platform: str = "cpu"
    device_kind: str = "cpu"


def test_get_coords_and_bounds_on_tpu():
    device = FakeTpu(id=5, process_index=0, coords=(1, 0, 2), core_on_chip=1)
    assert tp.get_coords(device) == (1, 0, 2, 1)
    assert tp.bounds_from_last_device(device) == (2, 1, 3, 2)


def test_get_coords_and_bounds_elsewhere_use_process_and_local_counts():
    with mock.patch.object(jax, "local_device_count", return_value=4):
        assert tp.get_coords(FakeCpu(id=6, process_index=1)) == (1, 2)
        assert tp.bounds_from_last_device(FakeCpu(id=7, process_index=0)) == (jax.process_count(), 4)


def _two_process_mesh():
    """A 4 x 2 (data, model) mesh of fake CPUs: process p owns data rows 2p and 2p + 1."""
    devices = np.array([[FakeCpu(id=2 * r + c, process_index=r // 2) for c in range(2)] for r in range(4)])
    return tp.make_mesh(devices, ("data", "model"))


@pytest.mark.parametrize("process", [0, 1])
def test_local_chunker_slices_of_each_process(process):
    chunker = tp.LocalChunker(_two_process_mesh(), process_index=process)
    assert chunker.num_chunks == {"data": 2, "model": 1}
    assert chunker.chunk_ids == {"data": process, "model": 0}
    sharded = chunker.get_local_chunk_info((8, 6), ["data", "model"])
    assert sharded.slice == (slice(4 * process, 4 * process + 4), slice(0, 6))
    assert sharded.replica_id == 0
    # Not split over data: both processes hold everything, as replicas 0 and 1.
    replicated = chunker.get_local_chunk_info((8, 6), [None, "model"])
    assert replicated.slice == (slice(None), slice(0, 6))
    assert replicated.replica_id == process


def test_local_chunker_defaults_to_this_process(devices):
    mesh = tp.make_mesh(np.array(devices).reshape(4, 2), ("data", "model"))
    chunker = tp.LocalChunker(mesh)
    assert chunker.num_chunks == {"data": 1, "model": 1}
    info = chunker.get_local_chunk_info((8, 4), [("data", "model"), None])
    assert info.slice == (slice(0, 8), slice(None))
    assert info.replica_id == 0


def test_local_chunker_refuses_a_process_scattered_over_the_mesh():
    # Process 0 owns rows 0 and 2: not one block.
    devices = np.array([[FakeCpu(id=r, process_index=r % 2)] for r in range(4)])
    with pytest.raises(ValueError, match="do not form one aligned block"):
        tp.LocalChunker(tp.make_mesh(devices, ("data", "model")), process_index=0)


def test_local_chunk_info_checks_its_arguments():
    chunker = tp.LocalChunker(_two_process_mesh(), process_index=0)
    with pytest.raises(ValueError, match="more entries than shape"):
        chunker.get_local_chunk_info((8,), ["data", None])
    with pytest.raises(ValueError, match=r"\['replica'\] are not in the mesh axes"):
        chunker.get_local_chunk_info((8,), ["replica"])


def test_local_chunk_info_reads_short_axes_as_upstream():
    # As a PartitionSpec: dimensions past the axes are whole; a split rounds down.
    chunker = tp.LocalChunker(_two_process_mesh(), process_index=1)
    info = chunker.get_local_chunk_info((8, 6), ["data"])
    assert info.slice == (slice(4, 8), slice(None))
    assert chunker.get_local_chunk_info((7,), ["data"]).slice == (slice(3, 6),)


def test_update_logical_axis_rules_replaces_in_place_and_appends_new_names():
    updated = tp.update_logical_axis_rules(
        (("a", None), ("b", "model"), ("c", "data")), (("a", "model"), ("d", None), ("c", None))
    )
    assert updated == (("a", "model"), ("b", "model"), ("c", None), ("d", None))
    assert tp.update_logical_axis_rules((("a", None),), None) == (("a", None),)


def test_standard_rules_put_additional_rules_last():
    extra = (("my-axis", "data"), ("other", None))
    for act, par in itertools.product((1, 2), (1, 2)):
        base = tp.standard_logical_axis_rules(act, par)
        assert tp.standard_logical_axis_rules(act, par, additional_rules=extra) == base + list(extra)


def test_partition_spec_is_jax_s():
    assert tp.PartitionSpec is PartitionSpec


def _four_host_tpus():
    """A 4x4x1 chip grid, 2 cores per chip, each of 4 hosts owning a 2x2x1 block."""
    devices = []
    for x, y, c in itertools.product(range(4), range(4), range(2)):
        host = (x // 2) * 2 + (y // 2)
        devices.append(FakeTpu(id=len(devices), process_index=host, coords=(x, y, 0), core_on_chip=c))
    return devices


def test_get_mesh_takes_upstreams_device_keywords():
    devices = _four_host_tpus()
    local = [d for d in devices if d.process_index == 2]
    by_keywords = tp.get_mesh((1, 1, 1, 2), input_devices=devices, input_local_devices=local)
    assert by_keywords.devices.tolist() == tp.get_mesh((1, 1, 1, 2), devices=devices).devices.tolist()
    assert dict(by_keywords.shape) == {"data": 16, "model": 2}
    with pytest.raises(ValueError, match="not both"):
        tp.get_mesh((1, 1, 1, 2), input_devices=devices, devices=devices)


class _Partitioner(tp.BasePartitioner):
    def __init__(self, process, **kwargs):
        super().__init__(**kwargs)
        self._the_mesh = tp.get_mesh((1, 1, 1, 2), input_devices=_four_host_tpus())
        self._chunker = tp.LocalChunker(self._the_mesh, process_index=process)

    @property
    def _mesh(self):
        return self._the_mesh

    @property
    def _local_chunker(self):
        return self._chunker

    def get_mesh_axes(self, train_state):
        return None

    def partition(self, fn, in_axis_resources, out_axis_resources, static_argnums=(), donate_argnums=()):
        return fn

    def compile(self, partitioned_fn, *args):
        return partitioned_fn


@pytest.mark.parametrize("process", [0, 3])
def test_base_partitioner_derives_the_data_layout_from_its_mesh(process):
    partitioner = _Partitioner(process, num_partitions=2)
    assert partitioner.mesh is partitioner._mesh
    assert partitioner.data_partition_spec == PartitionSpec("data")
    assert partitioner.data_mesh_size == 16 and partitioner.data_shards == 4
    layout = partitioner.get_data_layout(32)
    assert (layout.batch_size, layout.shard_id, layout.num_shards) == (32, process, 4)
    assert layout.is_first_host_in_replica_set
    assert partitioner.get_local_chunk_info((8, 2), ["data"]).slice == (
        slice(2 * process, 2 * process + 2),
        slice(None),
    )
    with pytest.raises(ValueError, match="not divisible by the data mesh size 16"):
        partitioner.get_data_layout(24)


def test_base_partitioner_needs_a_model_parallel_size_and_its_methods():
    with pytest.raises(ValueError, match="num_partitions or model_parallel_submesh"):
        _Partitioner(0)
    with pytest.raises(ValueError, match="4 entries"):
        _Partitioner(0, model_parallel_submesh=(1, 2))
    with pytest.raises(TypeError, match="abstract"):
        tp.BasePartitioner(num_partitions=1)


def test_partition_takes_upstreams_axis_resources_names():
    partitioner = tp.PjitPartitioner(num_partitions=1)
    double = partitioner.partition(lambda x: 2 * x, in_axis_resources=(None,), out_axis_resources=None)
    np.testing.assert_array_equal(double(np.arange(4.0)), [0.0, 2.0, 4.0, 6.0])
    with pytest.raises(TypeError, match="both in_axis_resources and its new name in_shardings"):
        partitioner.partition(lambda x: x, (None,), None, in_axis_resources=(None,))
    with pytest.raises(TypeError, match="unexpected keyword arguments"):
        partitioner.partition(lambda x: x, None, None, in_axis_resoures=None)
