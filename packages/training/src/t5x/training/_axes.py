"""Paths and logical axis names of parameter trees."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax

from t5x.interfaces import PyTree


def key_to_str(key: Any) -> str:
    """Turns one jax key-path entry into the name used in '/'-joined paths."""
    if isinstance(key, jax.tree_util.DictKey):
        return str(key.key)
    if isinstance(key, jax.tree_util.SequenceKey):
        return str(key.idx)
    if isinstance(key, jax.tree_util.GetAttrKey):
        return key.name
    if isinstance(key, jax.tree_util.FlattenedIndexKey):
        return str(key.key)
    return str(key)


def path_to_str(path: tuple[Any, ...]) -> str:
    """'/'-joins a jax key path (``encoder/layers_0/mlp/wi/kernel``)."""
    return "/".join(key_to_str(k) for k in path)


def flatten_with_paths(tree: PyTree) -> dict[str, Any]:
    """Returns ``{path: leaf}`` for every array leaf of ``tree``."""
    leaves, _ = jax.tree_util.tree_flatten_with_path(tree)
    return {path_to_str(path): leaf for path, leaf in leaves}


def _is_axis_names(value: Any) -> bool:
    if value is None:
        return False
    if hasattr(value, "names") and not isinstance(value, (str, bytes)):
        return True  # flax AxisMetadata
    return isinstance(value, tuple) and all(isinstance(n, (str, type(None))) for n in value)


def _names_of(value: Any) -> tuple[str | None, ...]:
    names = value.names if hasattr(value, "names") else value
    return tuple(names)


def flatten_params_axes(params_axes: PyTree) -> dict[str, tuple[str | None, ...]]:
    """Flattens a tree of logical axis names to ``{param path: names}``.

    Accepts a tree mirroring the parameters whose leaves are tuples of names
    (``("embed", "mlp")``, ``PartitionSpec`` included), or Flax's
    ``params_axes`` collection, where ``<name>_axes`` leaves hold an object with
    a ``names`` attribute; the ``_axes`` suffix is dropped from the path.

    Args:
      params_axes: the tree of names.

    Returns:
      A dict from '/'-joined parameter path to its tuple of axis names.
    """
    if params_axes is None:
        return {}
    if (
        isinstance(params_axes, Mapping)
        and all(isinstance(v, tuple) for v in params_axes.values())
        and any("/" in str(k) for k in params_axes)
    ):
        return {str(k): _names_of(v) for k, v in params_axes.items()}
    flat: dict[str, tuple[str | None, ...]] = {}
    leaves, _ = jax.tree_util.tree_flatten_with_path(params_axes, is_leaf=_is_axis_names)
    for path, leaf in leaves:
        if not _is_axis_names(leaf):
            raise TypeError(
                f"params_axes leaf at {path_to_str(path)!r} must be a tuple of logical axis names, got {leaf!r}"
            )
        name = path_to_str(path)
        if hasattr(leaf, "names") and name.endswith("_axes"):
            name = name[: -len("_axes")]
        flat[name] = _names_of(leaf)
    return flat
