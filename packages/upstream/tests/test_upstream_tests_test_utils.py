"""t5x.test_utils: the fake-device and comparison helpers upstream t5x's tests import."""

import collections
import unittest

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec

from t5x import partitioning
from t5x import test_utils as tu


def test_coords_to_idx_counts_the_first_coordinate_fastest():
    assert tu.coords_to_idx((0, 0, 0), (2, 3, 4)) == 0
    assert tu.coords_to_idx((1, 2, 3), (2, 3, 4)) == 1 + 2 * 2 + 3 * 6
    with pytest.raises(ValueError, match="same length"):
        tu.coords_to_idx((1, 2), (2, 3, 4))


def test_make_devices_ids_and_hosts_for_a_v3_32():
    devices = tu.make_devices(4, 4, 1, 2, kind="TPU v3")
    assert len(devices) == 32
    assert sorted(d.id for d in devices) == list(range(32))
    by_coords = {(d.coords, d.core_on_chip): d for d in devices}
    # Ids count cores fastest, then x, then y.
    assert by_coords[((0, 0, 0), 1)].id == 1
    assert by_coords[((1, 0, 0), 0)].id == 2
    assert by_coords[((0, 1, 0), 0)].id == 8
    # Each host holds a 2 x 2 block of chips (both cores): 4 hosts of 8 devices.
    assert collections.Counter(d.process_index for d in devices) == {0: 8, 1: 8, 2: 8, 3: 8}
    assert {by_coords[((x, y, 0), 0)].process_index for x in (0, 1) for y in (0, 1)} == {0}
    assert by_coords[((2, 0, 0), 0)].process_index == 1
    assert by_coords[((0, 2, 0), 0)].process_index == 2
    assert all(d.platform == "tpu" and d.device_kind == "TPU v3" for d in devices)


def test_make_devices_refuses_a_host_layout_that_does_not_divide_the_grid():
    with pytest.raises(ValueError, match="host_layout"):
        tu.make_devices(3, 4, 1, 2)


def test_fake_devices_build_upstream_meshes():
    devices = tu.make_devices(4, 4, 1, 2)
    mesh = partitioning.default_mesh(4, devices=devices)
    assert dict(mesh.shape) == {"data": 8, "model": 4}
    chunker = partitioning.LocalChunker(mesh, process_index=3)
    assert chunker.num_chunks == {"data": 4, "model": 1}


def test_create_global_mesh_and_sharded_array_round_trip():
    mesh = tu.create_global_mesh((1,), ("data",))
    assert mesh.axis_names == ("data",)
    values = np.arange(6.0).reshape(2, 3)
    array = tu.create_sharded_array(values, values.shape, mesh, PartitionSpec("data", None))
    np.testing.assert_array_equal(array, values)
    assert tu.create_sharded_array(3.0, (), mesh, PartitionSpec()) == 3.0


def test_with_mesh_sets_the_mesh_and_skips_when_devices_are_missing():
    with tu.with_mesh([("x", 1)]):
        assert dict(jax.sharding.get_abstract_mesh().shape) == {"x": 1}
    with pytest.raises(unittest.SkipTest, match="needs 4096 local devices"), tu.with_mesh([("x", 4096)]):
        pass
    with pytest.raises(unittest.SkipTest):
        tu.create_global_mesh((4096,), ("x",))


def test_assert_same_compares_structure_and_values():
    tree = {"a": jnp.arange(3), "b": [np.ones(2)]}
    tu.assert_same(tree, {"a": jnp.arange(3), "b": [np.ones(2)]})
    with pytest.raises(AssertionError):
        tu.assert_same(tree, {"a": jnp.arange(3) + 1, "b": [np.ones(2)]})
    with pytest.raises(AssertionError, match="incompatible types"):
        tu.assert_equal(np.ones(2), [1.0, 1.0])


def test_get_fake_vocab():
    inputs, targets = tu.get_fake_vocab()
    assert (inputs.vocab_size, inputs.eos_id) == (128, 1)
    assert targets is inputs
