"""Test helpers under upstream t5x's names: fake devices, small meshes, tree comparison.

Upstream's own tests (and downstream projects' tests written against them) build fake TPU
topologies with ``make_devices`` and compare train states with ``assert_same``. Provided:
``CpuDevice``, ``GpuDevice``, ``TpuDevice``, ``coords_to_idx``, ``make_devices``,
``with_mesh``, ``create_global_mesh``, ``get_fake_vocab``, ``assert_equal``,
``assert_same`` and ``create_sharded_array``. Not provided: the helpers built on
upstream's flax-optim train state and models (``get_t5_test_model``,
``get_train_state_from_variables``, ``FakePartitioner``) and the tf.data fake dataset.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import unittest
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding

from t5x.partitioning import make_mesh

MeshSpec = list[tuple[str, int]]


@dataclasses.dataclass(frozen=True)
class CpuDevice:
    """A stand-in for a CPU device (only the attributes mesh code reads)."""

    id: int
    process_index: int
    device_kind: str = "cpu"
    platform: str = "cpu"


@dataclasses.dataclass(frozen=True)
class GpuDevice:
    """A stand-in for a GPU device."""

    id: int
    process_index: int
    device_kind: str = "gpu"
    platform: str = "Tesla V100-SXM2-16GB"


@dataclasses.dataclass(frozen=True)
class TpuDevice:
    """A stand-in for a TPU core at ``coords`` (x, y, z) of the chip grid."""

    id: int
    process_index: int
    coords: Sequence[int]
    core_on_chip: int
    device_kind: str = "TPU v3"
    platform: str = "tpu"


def coords_to_idx(coords: Sequence[int], bounds: Sequence[int]) -> int:
    """The linear index of ``coords`` in a grid of ``bounds``, both listed minor axis first."""
    if len(coords) != len(bounds):
        raise ValueError(f"coords {tuple(coords)} and bounds {tuple(bounds)} must have the same length")
    index, stride = 0, 1
    for coord, bound in zip(coords, bounds):
        index += coord * stride
        stride *= bound
    return index


def make_devices(
    nx: int,
    ny: int,
    nz: int,
    nc: int = 2,
    host_layout: Sequence[int] = (2, 2, 1, 2),
    kind: str = "TPU v3",
) -> list[TpuDevice]:
    """Fake TPU cores on an ``nx x ny x nz`` chip grid with ``nc`` cores per chip.

    Each process (host) owns a ``host_layout`` block of (x, y, z, core) positions. Device
    ids count cores fastest, then x, y, z; process indices count host blocks in the same
    order. Devices are listed with x slowest and the core fastest.
    """
    bounds = (nx, ny, nz, nc)
    layout = tuple(host_layout)
    if len(layout) != 4 or any(b % h for b, h in zip(bounds, layout)):
        raise ValueError(f"host_layout {layout} must have 4 entries, each dividing (nx, ny, nz, nc)={bounds}")
    hosts = tuple(b // h for b, h in zip(bounds, layout))
    devices = []
    for x, y, z, c in itertools.product(*(range(b) for b in bounds)):
        hx, hy, hz, hc = (v // h for v, h in zip((x, y, z, c), layout))
        devices.append(
            TpuDevice(
                id=coords_to_idx((c, x, y, z), (nc, nx, ny, nz)),
                process_index=coords_to_idx((hc, hx, hy, hz), (hosts[3], hosts[0], hosts[1], hosts[2])),
                coords=(x, y, z),
                core_on_chip=c,
                device_kind=kind,
            )
        )
    return devices


@contextlib.contextmanager
def with_mesh(named_shape: MeshSpec) -> Iterator[None]:
    """Runs the body inside a mesh of this process's first devices, e.g. ``[("x", 2)]``.

    Raises ``unittest.SkipTest`` when there are too few local devices.
    """
    axis_names, shape = zip(*named_shape)
    size = int(np.prod(shape))
    local = list(jax.local_devices())
    if len(local) < size:
        raise unittest.SkipTest(
            f"the mesh {dict(named_shape)} needs {size} local devices, {len(local)} present"
        )
    with jax.sharding.set_mesh(make_mesh(np.array(local[:size]).reshape(shape), axis_names)):
        yield


def create_global_mesh(mesh_shape: Sequence[int], axis_names: Sequence[str]) -> Mesh:
    """A mesh of the first ``prod(mesh_shape)`` devices by id (``unittest.SkipTest`` if too few)."""
    size = int(np.prod(mesh_shape))
    devices = sorted(jax.devices(), key=lambda d: d.id)
    if len(devices) < size:
        raise unittest.SkipTest(f"the mesh {tuple(mesh_shape)} needs {size} devices, {len(devices)} present")
    return make_mesh(np.array(devices[:size]).reshape(mesh_shape), axis_names)


@dataclasses.dataclass
class _FakeVocabulary:
    vocab_size: int = 128
    eos_id: int = 1


def get_fake_vocab() -> tuple[_FakeVocabulary, _FakeVocabulary]:
    """An (input, output) pair of minimal vocabularies: 128 ids, EOS 1."""
    vocab = _FakeVocabulary()
    return vocab, vocab


def assert_equal(a: Any, b: Any) -> None:
    """Asserts two arrays are equal; ``jax.Array``s are compared shard by shard."""
    if not isinstance(a, type(b)):
        raise AssertionError(f"incompatible types: {type(a).__name__} and {type(b).__name__}")
    if isinstance(a, jax.Array):
        for left, right in zip(a.addressable_shards, b.addressable_shards):
            np.testing.assert_array_equal(left.data, right.data)
    else:
        np.testing.assert_array_equal(a, b)


def assert_same(tree_a: Any, tree_b: Any) -> None:
    """Asserts two pytrees have the same structure and equal leaves."""
    tree_a, tree_b = jax.device_get((tree_a, tree_b))
    jax.tree.map(assert_equal, tree_a, tree_b)


def create_sharded_array(arr: Any, global_shape: Sequence[int], global_mesh: Mesh, mesh_axes: Any) -> Any:
    """A global ``jax.Array`` of ``global_shape`` sharded as ``mesh_axes``, filled from ``arr``.

    Scalars are returned unchanged.
    """
    if np.isscalar(arr):
        return arr
    return jax.make_array_from_callback(
        tuple(global_shape), NamedSharding(global_mesh, mesh_axes), lambda index: arr[index]
    )
