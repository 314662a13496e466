"""Dicts of tensors <-> ``tf.train.Example`` in seqio's encoding, and nested-key flattening.

seqio's encoding (which its caches use): each feature stores its flattened
values; a ragged tensor adds one int64 feature of row lengths per ragged
dimension under ``_rl:<dim>:<key>``; a sparse tensor stores its indices per
dimension under ``_sp:<dim>:<key>``; with ``store_shapes``, dense tensors of
rank >= 2 and sparse tensors store their shape under ``_sh:<key>``.
Integers and booleans are stored as int64, floats as float32.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping
from typing import Any

import numpy as np
import tensorflow as tf

from t5x import interfaces

SHAPE_PREFIX = "_sh:"
RAGGED_PREFIX = "_rl:"
SPARSE_PREFIX = "_sp:"
NESTED_DELIMITER = "/"


def tfexample_ragged_length_key(key: str, dim: int) -> str:
    """The feature holding the ``dim``-th row lengths of ragged feature ``key``."""
    return f"{RAGGED_PREFIX}{dim}:{key}"


def tfexample_sparse_indices_key(key: str, dim: int) -> str:
    """The feature holding the ``dim``-th indices of sparse feature ``key``."""
    return f"{SPARSE_PREFIX}{dim}:{key}"


def _feature(values: Any, key: str) -> tf.train.Feature:
    tensor = tf.convert_to_tensor(values)
    flat = tf.reshape(tensor, [-1]).numpy().tolist()
    if tensor.dtype.is_bool or tensor.dtype.is_integer:
        return tf.train.Feature(int64_list=tf.train.Int64List(value=[int(v) for v in flat]))
    if tensor.dtype.is_floating:
        return tf.train.Feature(float_list=tf.train.FloatList(value=flat))
    if tensor.dtype == tf.string:
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[tf.compat.as_bytes(v) for v in flat]))
    raise ValueError(f"dict_to_tfexample: feature {key!r} has unsupported dtype {tensor.dtype.name}")


def dict_to_tfexample(dct: Mapping[str, Any], store_shapes: bool = False) -> tf.train.Example:
    """Encodes a dict of tensors (dense, ragged or sparse; numpy or Python values) as an Example.

    Args:
      dct: feature name -> value.
      store_shapes: also store the shape of dense features of rank >= 2 and of
        sparse features (``tfexample_to_dict`` needs it to rebuild them).

    Raises:
      ValueError: a feature's dtype cannot be stored (names the feature).
    """
    features: dict[str, tf.train.Feature] = {}
    for key, value in dct.items():
        if isinstance(value, tf.RaggedTensor):
            features[key] = _feature(value.flat_values, key)
            for dim, lengths in enumerate(value.nested_row_lengths()):
                features[tfexample_ragged_length_key(key, dim)] = _feature(lengths, key)
        elif isinstance(value, tf.SparseTensor):
            features[key] = _feature(value.values, key)
            for dim, indices in enumerate(tf.transpose(value.indices)):
                features[tfexample_sparse_indices_key(key, dim)] = _feature(indices, key)
            if store_shapes:
                features[SHAPE_PREFIX + key] = _feature(value.dense_shape, key)
        else:
            tensor = tf.constant(value) if not isinstance(value, tf.Tensor) else value
            if store_shapes and tensor.shape.rank > 1:
                features[SHAPE_PREFIX + key] = _feature(tf.shape(tensor), key)
            features[key] = _feature(tensor, key)
    return tf.train.Example(features=tf.train.Features(feature=features))


def _values(feature: tf.train.Feature) -> tf.Tensor:
    if feature.int64_list.value:
        return tf.constant(list(feature.int64_list.value), dtype=tf.int64)
    if feature.float_list.value:
        return tf.constant(list(feature.float_list.value), dtype=tf.float32)
    # bytes, or an empty list whose type the proto does not say: strings, as seqio assumes
    return tf.constant(list(feature.bytes_list.value), dtype=tf.string)


def tfexample_to_dict(example: tf.train.Example | bytes) -> dict[str, Any]:
    """Decodes an Example written by ``dict_to_tfexample`` (ragged, sparse and shaped features rebuilt).

    Raises:
      ValueError: a ragged or sparse feature misses a dimension's lengths or indices,
        or a sparse feature has no stored shape.
    """
    if isinstance(example, bytes):
        example = tf.train.Example.FromString(example)
    plain: dict[str, Any] = {}
    shapes: dict[str, tf.Tensor] = {}
    ragged: dict[str, dict[int, tf.Tensor]] = collections.defaultdict(dict)
    sparse: dict[str, dict[int, tf.Tensor]] = collections.defaultdict(dict)
    for key, feature in example.features.feature.items():
        value = _values(feature)
        if key.startswith(RAGGED_PREFIX):
            _, dim, name = key.split(":", 2)
            ragged[name][int(dim)] = value
        elif key.startswith(SPARSE_PREFIX):
            _, dim, name = key.split(":", 2)
            sparse[name][int(dim)] = value
        elif key.startswith(SHAPE_PREFIX):
            shapes[key[len(SHAPE_PREFIX) :]] = value
        else:
            plain[key] = value
    for name, by_dim in ragged.items():
        missing = [d for d in range(len(by_dim)) if d not in by_dim]
        if missing:
            raise ValueError(f"tfexample_to_dict: ragged feature {name!r} lacks row lengths {missing[0]}")
        plain[name] = tf.RaggedTensor.from_nested_row_lengths(
            plain[name], [by_dim[d] for d in range(len(by_dim))]
        )
    for name, by_dim in sparse.items():
        if name not in shapes:
            raise ValueError(f"tfexample_to_dict: sparse feature {name!r} has no stored shape")
        missing = [d for d in range(len(by_dim)) if d not in by_dim]
        if missing:
            raise ValueError(f"tfexample_to_dict: sparse feature {name!r} lacks indices {missing[0]}")
        indices = tf.transpose(tf.stack([by_dim[d] for d in range(len(by_dim))]))
        plain[name] = tf.SparseTensor(indices, plain[name], shapes.pop(name))
    for name, shape in shapes.items():
        plain[name] = tf.reshape(plain[name], shape)
    return plain


def unflatten_dict(dct: Mapping[str, Any], delimiter: str = NESTED_DELIMITER) -> dict[str, Any]:
    """``{"a/b": x, "a/c": y}`` -> ``{"a": {"b": x, "c": y}}``."""
    return interfaces.unflatten(dct, sep=delimiter)


def flatten_dict(nested: Mapping[str, Any], delimiter: str = NESTED_DELIMITER) -> dict[str, Any]:
    """``{"a": {"b": x, "c": y}}`` -> ``{"a/b": x, "a/c": y}`` (the inverse of ``unflatten_dict``)."""
    flat: dict[str, Any] = {}

    def walk(node: Mapping[str, Any], prefix: str) -> None:
        for key, value in node.items():
            if isinstance(value, dict):
                walk(value, f"{prefix}{key}{delimiter}")
            else:
                flat[prefix + key] = value

    walk(nested, "")
    return flat


def as_numpy(value: Any) -> Any:
    """A tensor as numpy (strings as bytes); other values unchanged."""
    if isinstance(value, tf.RaggedTensor):
        return value.to_list()
    if isinstance(value, tf.Tensor):
        return value.numpy()
    return np.asarray(value) if isinstance(value, list) else value
