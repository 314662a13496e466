"""Upstream t5x names that t5x-upstream does not provide, and what to use instead.

Consulted when gin cannot resolve a name, so that the error says what to do
rather than only that nothing matched.
"""

from __future__ import annotations

import re

# Upstream name (as gin files write it, or its last part) -> what to use instead.
UNSUPPORTED: dict[str, str] = {
    "t5x.contrib": (
        "nothing: upstream's contrib packages (GPU recipes, ...) are not supported; for contrib/moe, t5x-moe "
        "(t5x.moe) with t5x-launch's models/moe/ gin files (upstream's flaxformer MoE gin files do not run)"
    ),
    "t5x.interactive_model": "t5x-launch infer / t5x.training.infer",
    "t5x.precompile": "nothing: compilation happens at the first step",
}

_NAME = re.compile(
    r"No configurable matching '([^']+)'"
    r"|Couldn't resolve selector ([\w.]+);"
    r"|Configurable '([^']+)' doesn't have a parameter named '([^']+)'"
    r"|No module named '([^']+)'"
)


def _lookup(name: str) -> tuple[str, str] | None:
    """The table entry for ``name`` or for a dotted suffix or prefix of it."""
    parts = name.split(".")
    for i in range(len(parts)):
        key = ".".join(parts[i:])
        if key in UNSUPPORTED:
            return key, UNSUPPORTED[key]
    for i in range(len(parts), 0, -1):
        key = ".".join(parts[:i])
        if key in UNSUPPORTED:
            return key, UNSUPPORTED[key]
    return None


def explain_unsupported(message: str) -> str | None:
    """A hint for a gin error naming an upstream name t5x-upstream lacks (None when it is not one)."""
    match = _NAME.search(message)
    if match is None:
        return None
    if match.group(3):
        configurable, parameter = match.group(3), match.group(4)
        name = f"{configurable.split('.')[-1]}.{parameter}"
        candidates = [f"{'.'.join(configurable.split('.')[-2:])}.{parameter}", name]
    else:
        candidates = [next(g for g in match.groups() if g)]
    for candidate in candidates:
        found = _lookup(candidate)
        if found is not None:
            key, instead = found
            return f"upstream t5x's {key} is not supported by t5x-upstream; use {instead}."
    return None
