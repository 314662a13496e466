"""Logical axis rules: from names such as ``("batch", "embed")`` to mesh axes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeAlias

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

MeshAxes: TypeAlias = str | tuple[str, ...] | None
"""What one logical name maps to: one mesh axis, several, or None (replicated)."""

LogicalAxisRules: TypeAlias = Sequence[tuple[str, MeshAxes]]
"""Priority-ordered ``(logical name, mesh axes)`` pairs, as Flax and upstream t5x use."""


class AxisNames(tuple):
    """The logical axis names of one array, one per dimension (``AxisNames("batch", None)``).

    A tuple, so it is a leaf of axis trees only where a caller treats it as one; the
    named type tells these apart from a tree's own tuples (upstream t5x's name).
    """

    def __new__(cls, *names: str | None) -> AxisNames:
        return tuple.__new__(cls, names)

    def __repr__(self) -> str:
        return f"AxisNames{tuple.__repr__(self)}"


# Names every standard rule set keeps replicated.
_REPLICATED_NAMES = ("relpos_buckets", "abspos_buckets", "length", "layers", "stack", "mlp_activations")


def standard_logical_axis_rules(
    activation_partitioning_dims: int = 1,
    parameter_partitioning_dims: int = 1,
    additional_rules: LogicalAxisRules | None = None,
) -> list[tuple[str, MeshAxes]]:
    """The default rules for T5-style models, with upstream t5x's semantics.

    ``batch`` goes to ``data``; ``vocab``, ``mlp``, ``heads`` and ``joined_kv`` go
    to ``model``. With 2-D activation partitioning ``embed`` also goes to
    ``model``; with 2-D parameter partitioning ``embed`` goes to ``data`` (when
    ``model`` is already taken by another dimension of the same array, which is
    what happens for every 2-D parameter). Rules are tried in order, so a rule
    for a name only applies if its mesh axes are still free in that array.

    Args:
      activation_partitioning_dims: 1 or 2.
      parameter_partitioning_dims: 1 or 2.
      additional_rules: rules appended after the standard ones (they only take
        effect for names the standard rules do not place first).

    Returns:
      A new list of ``(logical name, mesh axes)`` pairs.

    Raises:
      ValueError: a partitioning dimension other than 1 or 2.
    """
    for name, value in (
        ("activation_partitioning_dims", activation_partitioning_dims),
        ("parameter_partitioning_dims", parameter_partitioning_dims),
    ):
        if value not in (1, 2):
            raise ValueError(f"{name} must be 1 or 2, got {value!r}")
    rules: list[tuple[str, MeshAxes]] = [
        ("batch", "data"),
        ("vocab", "model"),
        ("mlp", "model"),
        ("heads", "model"),
        ("kv", None),
        ("joined_kv", "model"),
    ]
    if activation_partitioning_dims == 2:
        rules.append(("embed", "model"))
    if parameter_partitioning_dims == 2:
        rules.append(("embed", "data"))
    if activation_partitioning_dims == 1 and parameter_partitioning_dims == 1:
        rules.append(("embed", None))
    rules.extend((name, None) for name in _REPLICATED_NAMES)
    if additional_rules:
        rules.extend((str(name), _normalise_mesh_axes(axes)) for name, axes in additional_rules)
    return rules


def update_logical_axis_rules(
    rules: LogicalAxisRules, overrides: LogicalAxisRules | None
) -> tuple[tuple[str, MeshAxes], ...]:
    """``rules`` with ``overrides`` applied, as upstream t5x's helper of that name.

    A rule whose name appears in ``overrides`` takes the override's mesh axes and keeps
    its place (so its priority); override names not in ``rules`` are appended in order.
    """
    overrides = tuple(overrides or ())
    replaced = dict(overrides)
    names = {name for name, _ in rules}
    updated = [(name, replaced.get(name, axes)) for name, axes in rules]
    updated.extend((name, axes) for name, axes in overrides if name not in names)
    return tuple(updated)


def _normalise_mesh_axes(axes: Any) -> MeshAxes:
    if axes is None or isinstance(axes, str):
        return axes
    if isinstance(axes, (tuple, list)) and all(isinstance(a, str) for a in axes):
        return tuple(axes)
    raise ValueError(f"mesh axes of a rule must be None, a name or a tuple of names, got {axes!r}")


def _axes_list(axes: MeshAxes) -> tuple[str, ...]:
    if axes is None:
        return ()
    return (axes,) if isinstance(axes, str) else tuple(axes)


def _format_rules(rules: LogicalAxisRules) -> str:
    return "[" + ", ".join(f"{name!r} -> {axes!r}" for name, axes in rules) + "]"


def logical_to_mesh_axes(
    names: Sequence[Any],
    rules: LogicalAxisRules,
    mesh_axis_names: Sequence[str] | None = None,
) -> PartitionSpec:
    """Maps the logical names of one array's dimensions to a ``PartitionSpec``.

    Rules are tried in order (Flax's semantics): a rule ``(name, axes)`` places
    the dimension called ``name`` on ``axes`` if that dimension is still
    unplaced and none of ``axes`` is used by another dimension. A named
    dimension that no applicable rule places is replicated. A name that no rule
    mentions but that is itself one of ``mesh_axis_names`` stands for that mesh
    axis, so specs already written in mesh axes (``("data", None)``) pass through.

    Args:
      names: one entry per dimension: a logical name, None (replicated), or a
        tuple of mesh axis names.
      rules: the logical axis rules.
      mesh_axis_names: the axes of the mesh in use; when given, rules and names
        are checked against it.

    Returns:
      A ``PartitionSpec`` with one entry per dimension.

    Raises:
      ValueError: a name appears twice, a name is unknown (neither in the rules
        nor a mesh axis), or a rule points to a mesh axis the mesh lacks.
    """
    names = tuple(names)
    mesh_names = None if mesh_axis_names is None else tuple(mesh_axis_names)
    seen = [n for n in names if isinstance(n, str)]
    duplicates = sorted({n for n in seen if seen.count(n) > 1})
    if duplicates:
        raise ValueError(f"logical axis names {duplicates} occur more than once in {names}")
    unassigned = object()
    result: list[Any] = [unassigned if isinstance(n, str) else n for n in names]
    for index, entry in enumerate(result):
        if entry is unassigned or entry is None:
            continue
        if not (isinstance(entry, tuple) and all(isinstance(a, str) for a in entry)):
            raise ValueError(
                f"dimension {index} of {names} must be a name, None or a tuple of mesh axes, got {entry!r}"
            )
        if mesh_names is not None and not set(entry) <= set(mesh_names):
            raise ValueError(
                f"dimension {index} of {names} names mesh axes {sorted(set(entry) - set(mesh_names))} "
                f"that the mesh {mesh_names} does not have"
            )
    known = {name for name, _ in rules}

    def used_axes() -> set[str]:
        return {a for r in result if r is not unassigned for a in _axes_list(r)}

    for rule_name, rule_axes in rules:
        if rule_name not in names:
            continue
        position = names.index(rule_name)
        if result[position] is not unassigned:
            continue
        wanted = _axes_list(rule_axes)
        if mesh_names is not None:
            missing = [a for a in wanted if a not in mesh_names]
            if missing:
                raise ValueError(
                    f"logical axis rule {rule_name!r} -> {rule_axes!r} names mesh axes {missing} "
                    f"that the mesh {mesh_names} does not have"
                )
        if not used_axes().intersection(wanted):
            result[position] = rule_axes
    for position, entry in enumerate(result):
        if entry is not unassigned:
            continue
        name = names[position]
        if name in known:
            result[position] = None
        elif mesh_names is not None and name in mesh_names and name not in used_axes():
            result[position] = name
        else:
            where = f" or a mesh axis of {mesh_names}" if mesh_names is not None else ""
            raise ValueError(
                f"unknown logical axis name {name!r} in {names}: it is not in the logical axis rules"
                f"{where}. Rules in force: {_format_rules(rules)}. Add a rule for it "
                f"(e.g. additional_rules=[({name!r}, None)])."
            )
    return PartitionSpec(*result)


def _is_boxed(x: Any) -> bool:
    # Flax's Partitioned / LogicallyPartitioned boxes: a value plus `.names`.
    return hasattr(x, "unbox") and isinstance(getattr(x, "names", None), tuple)


def _is_names_tuple(x: Any) -> bool:
    return type(x) is tuple and all(e is None or isinstance(e, str) for e in x)


def is_axes_leaf(x: Any) -> bool:
    """Whether ``x`` is one leaf of a logical-axes tree.

    Leaves are None (replicated), a plain tuple of names/None, a
    ``PartitionSpec``, a ``jax.sharding.Sharding``, or a Flax-style box with
    ``.names``.
    """
    return (
        x is None
        or _is_names_tuple(x)
        or isinstance(x, (PartitionSpec, jax.sharding.Sharding))
        or _is_boxed(x)
    )


def get_logical_axes(tree: Any) -> Any:
    """Extracts the axis names from a tree of Flax-style boxed values.

    Args:
      tree: e.g. ``jax.eval_shape(model.init, ...)``, whose leaves may be boxes
        carrying ``.names`` (Flax ``LogicallyPartitioned``).

    Returns:
      The same structure with a tuple of names where a box was and None
      (replicated) for every other leaf.
    """
    return jax.tree.map(lambda x: tuple(x.names) if _is_boxed(x) else None, tree, is_leaf=_is_boxed)


def _leaf_to_spec(leaf: Any, rules: LogicalAxisRules, mesh_axis_names: Sequence[str] | None) -> Any:
    if isinstance(leaf, jax.sharding.Sharding):
        return leaf
    if leaf is None:
        return PartitionSpec()
    names = leaf.names if _is_boxed(leaf) else tuple(leaf)
    return logical_to_mesh_axes(names, rules, mesh_axis_names)


def logical_to_partition_specs(
    tree: Any, rules: LogicalAxisRules, mesh_axis_names: Sequence[str] | None = None
) -> Any:
    """Maps every leaf of a logical-axes tree (see `is_axes_leaf`) to a ``PartitionSpec``.

    ``jax.sharding.Sharding`` leaves are kept as they are.
    """
    return jax.tree.map(lambda x: _leaf_to_spec(x, rules, mesh_axis_names), tree, is_leaf=is_axes_leaf)


def logical_to_shardings(tree: Any, mesh: Mesh, rules: LogicalAxisRules) -> Any:
    """Maps every leaf of a logical-axes tree to a ``NamedSharding`` on ``mesh``.

    Args:
      tree: logical axes (see `is_axes_leaf`); None leaves mean replicated.
      mesh: the device mesh.
      rules: the logical axis rules.

    Returns:
      The same structure with ``jax.sharding.Sharding`` leaves.

    Raises:
      ValueError: an unknown logical name (see `logical_to_mesh_axes`).
    """

    def convert(leaf: Any) -> Any:
        spec = _leaf_to_spec(leaf, rules, mesh.axis_names)
        return spec if isinstance(spec, jax.sharding.Sharding) else NamedSharding(mesh, spec)

    return jax.tree.map(convert, tree, is_leaf=is_axes_leaf)
