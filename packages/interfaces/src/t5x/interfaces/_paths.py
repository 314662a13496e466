"""Nesting flat parameter paths, the one helper every package shares."""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import Any


def unflatten(flat: Mapping[Any, Any], sep: str | None = "/") -> dict[Any, Any]:
    """Nests a flat mapping of paths: ``{"a/b": x, "a/c": y}`` -> ``{"a": {"b": x, "c": y}}``.

    Args:
      flat: keys are paths, either strings split at ``sep`` or sequences of keys
        (tuples such as ``("target", "encoder", "kernel")``).
      sep: the separator of string keys; None takes every key as a sequence.

    Raises:
      ValueError: one path is a prefix of another (a value would be a folder too).
    """
    nested: dict[Any, Any] = {}
    for key, value in flat.items():
        parts: Sequence[Hashable] = key.split(sep) if sep is not None and isinstance(key, str) else key
        *parents, last = parts
        node = nested
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ValueError(f"unflatten: {key!r} lies under {part!r}, which already holds a value")
        if isinstance(node.get(last), dict) and not isinstance(value, dict):
            raise ValueError(f"unflatten: {key!r} holds a value and is also the parent of other paths")
        node[last] = value
    return nested
