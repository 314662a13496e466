"""Initialising a partitioned TrainState from shapes, never materialised on one host."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import optax
from jax.sharding import NamedSharding, PartitionSpec

from t5x.interfaces import Model, Partitioner, PyTree
from t5x.training._axes import flatten_params_axes, flatten_with_paths, path_to_str
from t5x.training._optimizers import bind_param_axes, opt_state_axes
from t5x.training._train_state import TrainState


def sharding_for(partitioner: Partitioner, names: tuple | None) -> jax.sharding.Sharding:
    """The sharding of one array with these logical axis names (``()``: replicated).

    Raises:
      TypeError: the partitioner returned something that is not a Sharding.
    """
    if not names or all(n is None for n in names):
        return NamedSharding(partitioner.mesh, PartitionSpec())
    sharding = partitioner.get_sharding(tuple(names))
    if not isinstance(sharding, jax.sharding.Sharding):
        raise TypeError(
            f"{type(partitioner).__name__}.get_sharding({tuple(names)!r}) returned {sharding!r}, "
            "expected one jax.sharding.Sharding"
        )
    return sharding


def batch_shardings(partitioner: Partitioner, batch: Mapping[str, Any]) -> dict[str, jax.sharding.Sharding]:
    """Shardings of a batch: the leading dimension over the ``batch`` logical axis."""
    return {k: sharding_for(partitioner, ("batch",) + (None,) * (len(v.shape) - 1)) for k, v in batch.items()}


def batch_logical_axes(batch: Mapping[str, Any]) -> dict[str, tuple]:
    """``("batch", None, ...)`` for every feature of ``batch``."""
    return {k: ("batch",) + (None,) * (len(v.shape) - 1) for k, v in batch.items()}


def train_state_shardings(partitioner: Partitioner, state: TrainState, params_axes: PyTree) -> TrainState:
    """Shardings for every leaf of ``state`` (arrays or ShapeDtypeStructs).

    Parameters take their logical axes; optimizer slots shaped like a
    parameter take the parameter's; everything else is replicated.

    Args:
      partitioner: maps logical names to shardings.
      state: the train state or its shapes.
      params_axes: logical axes of the params (tree or ``{path: names}``).

    Returns:
      A TrainState whose leaves are ``jax.sharding.Sharding``s.
    """
    flat_axes = flatten_params_axes(params_axes)
    slot_axes = opt_state_axes(state.opt_state, state.params, flat_axes)
    missing = sorted(set(flatten_with_paths(state.params)) - set(flat_axes)) if flat_axes else []
    if missing:
        raise ValueError(f"params_axes names no logical axes for parameters {missing[:5]}")

    def param_sharding(path: tuple[Any, ...], _: Any) -> jax.sharding.Sharding:
        return sharding_for(partitioner, flat_axes.get(path_to_str(path), ()))

    def slot_sharding(path: tuple[Any, ...], _: Any) -> jax.sharding.Sharding:
        return sharding_for(partitioner, slot_axes.get(path_to_str(path), ()))

    replicated = sharding_for(partitioner, ())
    return dataclasses.replace(
        state,
        step=replicated,
        params=jax.tree_util.tree_map_with_path(param_sharding, state.params),
        opt_state=jax.tree_util.tree_map_with_path(slot_sharding, state.opt_state),
        collections=jax.tree.map(lambda _: replicated, state.collections),
    )


@dataclasses.dataclass(frozen=True)
class InitializedState:
    """What :func:`init_train_state` returns.

    Attributes:
      state: the TrainState, placed on the mesh.
      shardings: a TrainState of the shardings of ``state``'s leaves.
      shapes: a TrainState of ``jax.ShapeDtypeStruct``s (global shapes).
      params_axes: ``{param path: logical axis names}``.
    """

    state: TrainState
    shardings: TrainState
    shapes: TrainState
    params_axes: dict[str, tuple]


def init_train_state(
    model: Model,
    optimizer: optax.GradientTransformation,
    partitioner: Partitioner,
    input_shapes: Mapping[str, tuple[int, ...]],
    input_types: Mapping[str, Any] | None = None,
    seed: int = 0,
    materialize: bool = True,
) -> InitializedState:
    """Initialises a TrainState directly in its sharded layout.

    Shapes come from ``jax.eval_shape``, so a model larger than one host's
    memory is only ever created shard by shard, by one partitioned program.

    Args:
      model: provides ``get_initial_variables``.
      optimizer: any Optax transformation (Adafactor gets the params axes).
      partitioner: places the state.
      input_shapes: global batch shapes of the model features.
      input_types: their dtypes (default float32, as upstream).
      seed: the initialisation seed.
      materialize: False to compute only shapes and shardings (e.g. before
        restoring a checkpoint); ``state`` is then None.

    Returns:
      An InitializedState.
    """
    captured: dict[str, Any] = {}

    def variables_fn(rng: Any) -> dict[str, PyTree]:
        variables = dict(model.get_initial_variables(rng, input_shapes, input_types))
        captured["params_axes"] = variables.get("params_axes")
        return {k: v for k, v in variables.items() if not k.endswith("_axes")}

    rng = jax.random.PRNGKey(seed)
    jax.eval_shape(variables_fn, rng)
    params_axes = captured.get("params_axes")
    optimizer = bind_param_axes(optimizer, params_axes)

    def init_fn(rng: Any) -> TrainState:
        return TrainState.create(optimizer, variables_fn(rng), params_axes=None)

    shapes = jax.eval_shape(init_fn, rng)
    shardings = train_state_shardings(partitioner, shapes, params_axes)
    state = None
    if materialize:
        replicated = sharding_for(partitioner, ())
        state = partitioner.partition(init_fn, in_shardings=(replicated,), out_shardings=shardings)(rng)
    return InitializedState(
        state=state,  # type: ignore[arg-type]
        shardings=shardings,
        shapes=shapes,
        params_axes=flatten_params_axes(params_axes),
    )
