"""Upstream t5x's ``t5x.state_utils`` helpers for reshaping restored state dicts.

State dicts are nested mappings; their flat form joins the keys with ``/``
(``target/encoder/kernel``), which is what assignment maps match against.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from flax import traverse_util


def flatten_state_dict(state_dict: Mapping[str, Any]) -> dict[str, Any]:
    """``{"a": {"b": x}}`` -> ``{"a/b": x}``; empty mappings disappear."""
    return traverse_util.flatten_dict(dict(state_dict), sep="/")


def unflatten_state_dict(flat: Mapping[str, Any]) -> dict[str, Any]:
    """The inverse of :func:`flatten_state_dict`."""
    return traverse_util.unflatten_dict(dict(flat), sep="/")


def apply_assignment_map(
    ckpt_optimizer_state: Mapping[str, Any],
    optimizer_state: Mapping[str, Any],
    assignment_map: Sequence[tuple[str, str | None]],
    require_all_rules_used: bool = True,
    is_resuming: bool = False,
) -> dict[str, Any]:
    """Builds the state dict the model wants from a checkpoint's state dict.

    Each rule ``(pattern, replacement)`` maps a model key (fully matched by the
    regex ``pattern``) to the checkpoint key ``replacement`` (with ``\\1``-style
    groups); a ``None`` replacement drops the key (a fallback fills it). The
    first matching rule wins; keys no rule matches keep their name.

    Args:
      ckpt_optimizer_state: the checkpoint's state dict.
      optimizer_state: the model's state dict (only its keys are used).
      assignment_map: the rules.
      require_all_rules_used: a rule that matched no model key is an error.
      is_resuming: accepted for upstream's signature; resuming applies the same rules.

    Raises:
      ValueError: a rule matched nothing (``require_all_rules_used``), or a rule
        names a checkpoint key that does not exist (lists the ones that do).
    """
    del is_resuming
    ckpt_flat = flatten_state_dict(ckpt_optimizer_state)
    model_keys = list(flatten_state_dict(optimizer_state))
    compiled = [(re.compile(pattern), pattern, replacement) for pattern, replacement in assignment_map]
    used: set[str] = set()
    result: dict[str, Any] = {}
    for key in model_keys:
        source: str | None = key
        for regex, pattern, replacement in compiled:
            if regex.fullmatch(key):
                used.add(pattern)
                source = None if replacement is None else regex.sub(replacement, key)
                break
        if source is None:
            continue
        if source not in ckpt_flat:
            if source == key:
                continue  # not renamed: a fallback may fill it in
            raise ValueError(
                f"Parameter '{source}' does not exist in restore checkpoint. Must be one of: {sorted(ckpt_flat)}"
            )
        result[key] = ckpt_flat[source]
    unused = {pattern for _, pattern, _ in compiled} - used
    if require_all_rules_used and unused:
        raise ValueError(f"Unused patterns in `assignment_map`: {unused}")
    return unflatten_state_dict(result)


__all__ = ["apply_assignment_map", "flatten_state_dict", "unflatten_state_dict"]
