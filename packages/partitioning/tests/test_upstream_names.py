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
    with pytest.raises(ValueError, match="one entry per dimension"):
        chunker.get_local_chunk_info((8, 6), ["data"])
    with pytest.raises(ValueError, match=r"\['replica'\] are not in the mesh axes"):
        chunker.get_local_chunk_info((8,), ["replica"])
    with pytest.raises(ValueError, match="size 7 does not split into 2 chunks"):
        chunker.get_local_chunk_info((7,), ["data"])


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
