"""Nested state dicts <-> flat ``{path tuple: leaf}`` maps."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from t5x import interfaces

Path = tuple[str, ...]


def flatten(tree: Any, is_leaf: Callable[[Any], bool] | None = None) -> dict[Path, Any]:
    """Flattens nested mappings (and lists, keyed by index) into path tuples.

    Empty mappings are kept as leaves so that optax's ``EmptyState`` slots
    survive a round trip. ``None`` leaves are dropped: they mark unused slots.

    Args:
      tree: nested ``Mapping``s / lists / tuples.
      is_leaf: optional predicate that stops the descent at a mapping.

    Returns:
      ``{("target", "encoder", "layers_0", ...): leaf}`` in insertion order.
    """
    flat: dict[Path, Any] = {}

    def visit(node: Any, path: Path) -> None:
        if is_leaf is not None and is_leaf(node):
            flat[path] = node
        elif isinstance(node, Mapping):
            if not node and path:
                flat[path] = {}
            for key, value in node.items():
                visit(value, (*path, str(key)))
        elif isinstance(node, list | tuple) and not hasattr(node, "_fields"):
            for index, value in enumerate(node):
                visit(value, (*path, str(index)))
        elif node is not None:
            flat[path] = node

    visit(tree, ())
    return flat


def unflatten(flat: Mapping[Path, Any]) -> dict[str, Any]:
    """Inverse of :func:`flatten` (lists come back as dicts keyed ``"0"``, ``"1"``...)."""
    return interfaces.unflatten(flat, sep=None)


def slash_name(path: Path) -> str:
    """``("target", "encoder", "kernel")`` -> ``"target/encoder/kernel"``."""
    return "/".join(path)


def dotted_name(path: Path) -> str:
    """The per-leaf directory name upstream T5X uses: keys joined with dots."""
    return ".".join(path)


def map_leaves(fn: Callable[[Path, Any], Any], tree: Any) -> dict[str, Any]:
    """Applies ``fn(path, leaf)`` to every leaf and rebuilds the nested dict."""
    return unflatten({path: fn(path, leaf) for path, leaf in flatten(tree).items()})
