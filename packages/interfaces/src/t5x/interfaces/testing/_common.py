"""Shared pieces of the conformance checks."""

from __future__ import annotations

from typing import Any

from t5x.interfaces._contracts import missing_members


class ConformanceError(AssertionError):
    """An implementation breaks its contract; the message says how."""


def require(condition: bool, message: str) -> None:
    if not condition:
        raise ConformanceError(message)


def require_members(obj: Any, protocol: type) -> None:
    missing = missing_members(obj, protocol)
    require(not missing, f"{type(obj).__qualname__} lacks {protocol.__name__} members: {', '.join(missing)}")
