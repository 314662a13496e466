"""Checking that an object offers every member a contract names."""

from __future__ import annotations

import inspect
from typing import Any


def contract_members(protocol: type) -> tuple[str, ...]:
    """Names of the attributes, properties and methods ``protocol`` declares."""
    names: set[str] = set()
    for klass in protocol.__mro__:
        if klass is object or klass.__name__ in {"Protocol", "Generic"}:
            continue
        names.update(name for name in vars(klass) if not name.startswith("_") or name == "__call__")
        names.update(name for name in getattr(klass, "__annotations__", {}) if not name.startswith("_"))
    for special in ("__iter__", "__next__", "__call__"):
        if special in vars(protocol):
            names.add(special)
    return tuple(sorted(names))


def missing_members(obj: Any, protocol: type) -> list[str]:
    """Returns the members of ``protocol`` that ``obj`` lacks (empty when it has all).

    Unlike ``isinstance`` with a runtime-checkable Protocol, this names what is
    missing, so an error can say so.
    """
    missing = []
    for name in contract_members(protocol):
        if not hasattr(obj, name):
            missing.append(name)
            continue
        declared = inspect.getattr_static(protocol, name, None)
        if inspect.isfunction(declared) and not callable(getattr(obj, name)):
            missing.append(name)
    return missing


def check_contract(obj: Any, protocol: type, *, component: str | None = None) -> None:
    """Raises TypeError naming the component and its missing members, if any."""
    missing = missing_members(obj, protocol)
    if missing:
        what = component or type(obj).__qualname__
        raise TypeError(
            f"{what} does not implement the {protocol.__name__} contract "
            f"(t5x-interfaces): missing {', '.join(missing)}"
        )
