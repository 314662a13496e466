"""Test helpers under upstream t5x's names: fake devices, small meshes, tree comparison.

Upstream's own tests (and downstream projects' tests written against them) build fake TPU
topologies with ``make_devices`` and compare train states with ``assert_same``. Provided:
``CpuDevice``, ``GpuDevice``, ``TpuDevice``, ``coords_to_idx``, ``make_devices``,
``with_mesh``, ``create_global_mesh``, ``get_fake_vocab``, ``get_fake_tokenized_dataset``,
``get_t5_test_model``, ``get_train_state_from_variables``, ``assert_equal``,
``assert_same`` and ``create_sharded_array``. Not provided: ``FakePartitioner``.

``get_t5_test_model`` differs in one way: upstream's vocabulary is the public
C4 SentencePiece model read from Cloud Storage; here it is a stand-in of the
same size (32128 ids, EOS 1), since tests cannot download.
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


# The fake tokenized examples upstream's tests read (ids and texts are fixtures).
# Validation repeats each example 4 times in a row: inference tests rely on it.
_TRAIN_EXAMPLES = [
    ((3, 13, 7, 14, 15, 9, 4, 16), "complete: this", (3, 8, 6, 3, 5, 10), "is a test"),
    ((3, 13, 7, 14, 15, 9, 4, 16), "complete: that", (17, 5, 6, 3, 5, 10), "was a test"),
    ((3, 13, 7, 14, 15, 9, 4, 16), "complete: those", (17, 4, 23, 4, 10, 6), "were tests"),
]
_VALIDATION_EXAMPLES = [
    ((3, 13, 7, 14, 15, 9, 4, 16), "complete: this", (3, 8, 6, 3, 5, 3, 25, 5), "is a validation")
] * 4 + [
    ((3, 13, 7, 14, 15, 9, 4, 17), "complete: that", (17, 5, 6, 3, 5, 22, 7, 24), "was another validation")
] * 4


def get_fake_tokenized_dataset(*_: Any, split: str = "validation", **__: Any) -> Any:
    """A ``tf.data`` dataset of tokenized examples with their texts (``*_pretokenized``).

    ``train`` repeats forever; ``test`` is the validation split. Any other
    arguments (a task's ``get_dataset`` keywords) are ignored.
    """
    import tensorflow as tf

    if split not in ("train", "validation", "test"):
        raise ValueError(f"split must be 'train', 'validation' or 'test', got {split!r}")
    examples = _TRAIN_EXAMPLES if split == "train" else _VALIDATION_EXAMPLES

    def generate() -> Iterator[dict[str, Any]]:
        for inputs, inputs_text, targets, targets_text in examples:
            yield {
                "inputs": inputs,
                "inputs_pretokenized": inputs_text,
                "targets": targets,
                "targets_pretokenized": targets_text,
            }

    signature = {
        "inputs": tf.TensorSpec([None], tf.int32),
        "inputs_pretokenized": tf.TensorSpec([], tf.string),
        "targets": tf.TensorSpec([None], tf.int32),
        "targets_pretokenized": tf.TensorSpec([], tf.string),
    }
    ds = tf.data.Dataset.from_generator(generate, output_signature=signature)
    return ds.repeat() if split == "train" else ds


def get_t5_test_model(**config_overrides: Any) -> Any:
    """A tiny T5.1.1 ``EncoderDecoderModel`` with Adafactor, as upstream's tests build it.

    ``config_overrides`` replace fields of the ``T5Config`` (vocabulary 32128,
    bfloat16, 8-wide embeddings, 4 heads of 3, 2 + 2 layers, gated-GELU MLP of 16).
    """
    from t5x import adafactor, models
    from t5x.examples.t5 import network

    config = network.T5Config(
        vocab_size=32128,
        dtype="bfloat16",
        emb_dim=8,
        num_heads=4,
        num_encoder_layers=2,
        num_decoder_layers=2,
        head_dim=3,
        mlp_dim=16,
        mlp_activations=("gelu", "linear"),
        dropout_rate=0.0,
        logits_via_embedding=False,
    )
    config = dataclasses.replace(config, **config_overrides)
    vocabulary = _FakeVocabulary(vocab_size=32128)
    return models.EncoderDecoderModel(
        module=network.Transformer(config),
        input_vocabulary=vocabulary,
        output_vocabulary=vocabulary,
        optimizer_def=adafactor.Adafactor(
            decay_rate=0.8, step_offset=0, logical_factor_rules=adafactor.standard_logical_factor_rules()
        ),
    )


def get_train_state_from_variables(variables: Any, optimizer_def: Any = None) -> Any:
    """A ``FlaxOptimTrainState`` over ``variables["params"]`` (Adafactor with learning rate 0 by default)."""
    from t5x import adafactor
    from t5x import train_state as train_state_lib

    optimizer_def = adafactor.Adafactor(0.0) if optimizer_def is None else optimizer_def
    return train_state_lib.FlaxOptimTrainState(optimizer_def.create(variables["params"]))


def get_fake_vocab() -> tuple[_FakeVocabulary, _FakeVocabulary]:
    """An (input, output) pair of minimal vocabularies: 128 ids, EOS 1."""
    vocab = _FakeVocabulary()
    return vocab, vocab


def assert_equal(a: Any, b: Any) -> None:
    """Asserts two arrays are equal; ``jax.Array``s are compared shard by shard."""
    if not isinstance(a, type(b)):
        raise AssertionError(f"incompatible types: {type(a).__name__} and {type(b).__name__}")
    a, b = (x.get() if hasattr(x, "get") and not isinstance(x, dict) else x for x in (a, b))
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
