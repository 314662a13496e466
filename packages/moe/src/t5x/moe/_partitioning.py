"""Expert parallelism: an ``('expert', 'data', 'model')`` mesh and the rules that use it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from t5x.partitioning import (
    LogicalAxisRules,
    MeshAxes,
    PjitPartitioner,
    default_mesh,
    make_mesh,
    standard_logical_axis_rules,
)


def moe_logical_axis_rules(
    activation_partitioning_dims: int = 1,
    parameter_partitioning_dims: int = 1,
    additional_rules: LogicalAxisRules | None = None,
) -> list[tuple[str, MeshAxes]]:
    """The standard rules with the batch over ``('expert', 'data')`` and experts over ``expert``.

    ``expert`` (the experts dimension of expert weights and dispatched activations)
    goes to the ``expert`` mesh axis, ``expert_group`` (the token groups once they
    sit with their expert) to ``data``, and ``unmodeled`` stays replicated. Parameters
    without an ``expert`` dimension are replicated over the ``expert`` axis; their
    gradients are summed over it by the compiler like over ``data``.
    """
    rules = standard_logical_axis_rules(activation_partitioning_dims, parameter_partitioning_dims)
    moe = [(n, (("expert", "data") if n == "batch" else a)) for n, a in rules]
    moe += [("expert", "expert"), ("expert_group", "data"), ("unmodeled", None)]
    if additional_rules:
        moe += [(str(n), a) for n, a in additional_rules]
    return moe


class MoePjitPartitioner(PjitPartitioner):
    """``PjitPartitioner`` on an ``('expert', 'data', 'model')`` mesh.

    The data-parallel devices of the usual ``('data', 'model')`` mesh are split
    into ``num_expert_partitions`` expert shards times the rest; the batch is split
    over both. Each expert shard holds ``num_experts / num_expert_partitions`` experts.

    Args:
      num_expert_partitions: size of the ``expert`` axis; must divide the data-parallel size.
      num_partitions: size of the ``model`` axis, as for ``PjitPartitioner``.
      model_parallel_submesh: as for ``PjitPartitioner``.
      logical_axis_rules: default `moe_logical_axis_rules()`.
      devices: build the mesh over these devices.
      num_experts: when given, checked against ``num_expert_partitions`` now.

    Raises:
      ValueError: an expert axis that does not divide the data-parallel devices, or
        ``num_experts`` not divisible by it.
    """

    def __init__(
        self,
        num_expert_partitions: int = 1,
        num_partitions: int | None = None,
        model_parallel_submesh: Sequence[int] | None = None,
        logical_axis_rules: LogicalAxisRules | None = None,
        *,
        devices: Sequence[Any] | None = None,
        num_experts: int | None = None,
    ) -> None:
        if not isinstance(num_expert_partitions, int) or num_expert_partitions < 1:
            raise ValueError(f"num_expert_partitions must be a positive int, got {num_expert_partitions!r}")
        if num_experts is not None and num_experts % num_expert_partitions:
            raise ValueError(
                f"num_experts={num_experts} is not divisible by num_expert_partitions={num_expert_partitions}"
            )
        base = default_mesh(num_partitions, model_parallel_submesh, devices=devices)
        if tuple(base.axis_names) != ("data", "model"):
            raise ValueError(
                f"expert parallelism needs a ('data', 'model') mesh to split, got {base.axis_names}"
            )
        data, model = base.devices.shape
        if data % num_expert_partitions:
            raise ValueError(
                f"num_expert_partitions={num_expert_partitions} does not divide the {data} data-parallel "
                f"devices (mesh {dict(base.shape)})"
            )
        grid = base.devices.reshape(num_expert_partitions, data // num_expert_partitions, model)
        mesh = make_mesh(grid, ("expert", "data", "model"))
        rules = moe_logical_axis_rules() if logical_axis_rules is None else logical_axis_rules
        super().__init__(logical_axis_rules=rules, mesh=mesh)
        self.num_expert_partitions = num_expert_partitions
