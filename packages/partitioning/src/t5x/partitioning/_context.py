"""The mesh and rules in force while a partitioned function is traced or run."""

from __future__ import annotations

import contextlib
import contextvars
import sys
from collections.abc import Iterator
from typing import Any

import jax
from jax.sharding import Mesh, NamedSharding

from t5x.partitioning._rules import LogicalAxisRules, logical_to_mesh_axes

_ACTIVE: contextvars.ContextVar[tuple[Mesh, LogicalAxisRules] | None] = contextvars.ContextVar(
    "t5x_partitioning_active", default=None
)


@contextlib.contextmanager
def axis_rules(mesh: Mesh, rules: LogicalAxisRules) -> Iterator[None]:
    """Puts ``mesh`` and ``rules`` in force for the code inside the block.

    Inside, `with_sharding_constraint` resolves logical names, bare
    ``PartitionSpec``s refer to ``mesh``, and, when Flax is already imported by
    the caller, Flax's logical-constraint helpers see the same rules.
    """
    token = _ACTIVE.set((mesh, tuple(rules)))
    try:
        with contextlib.ExitStack() as stack:
            stack.enter_context(jax.set_mesh(mesh))
            # Flax is never imported here; if the model uses it, its own rules
            # context must carry ours for nn.with_logical_constraint to work.
            flax_spmd = sys.modules.get("flax.core.spmd")
            if flax_spmd is not None and hasattr(flax_spmd, "logical_axis_rules"):
                stack.enter_context(flax_spmd.logical_axis_rules(tuple(rules)))
            yield
    finally:
        _ACTIVE.reset(token)


def with_sharding_constraint(x: Any, logical_axes: Any) -> Any:
    """Constrains the sharding of ``x`` inside a partitioned function, by logical names.

    Outside a function from `PjitPartitioner.partition` (no rules in force) it
    returns ``x`` unchanged, so model code stays usable unpartitioned.

    Args:
      x: an array being traced, e.g. activations ``[batch, length, embed]``.
      logical_axes: one name (or None) per dimension of ``x``.

    Returns:
      ``x`` with the constraint applied.

    Raises:
      ValueError: an unknown logical name.
    """
    active = _ACTIVE.get()
    if active is None:
        return x
    mesh, rules = active
    spec = logical_to_mesh_axes(tuple(logical_axes), rules, mesh.axis_names)
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))
