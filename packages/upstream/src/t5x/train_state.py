"""Upstream t5x's ``t5x.train_state``: train states over ``t5x.optimizers``.

``FlaxOptimTrainState`` wraps an :class:`t5x.optimizers.Optimizer` with the
model's other variable collections (``flax_mutables``) and the logical axis
metadata Flax modules emit (``params_axes``, ``<collection>_axes``);
``InferenceState`` is the same without optimizer state. Checkpoint state dicts
use upstream's layout: ``target``, ``state/step``, ``state/param_states``,
``flax_mutables``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import flax.core
import flax.struct
import jax.numpy as jnp
from flax import traverse_util
from flax.core import scope as flax_scope
from flax.linen import partitioning as flax_partitioning

from t5x import optimizers

EMPTY_DICT = flax.core.freeze({})
FrozenDict = flax_scope.FrozenDict
FrozenVariableDict = flax_scope.FrozenVariableDict
MutableVariableDict = flax_scope.MutableVariableDict
VariableDict = flax_scope.VariableDict


@runtime_checkable
class TrainState(Protocol):
    """What the trainer needs from a train state."""

    @property
    def step(self) -> jnp.ndarray: ...

    @property
    def params(self) -> FrozenVariableDict: ...

    @property
    def param_states(self) -> FrozenVariableDict: ...

    @property
    def flax_mutables(self) -> FrozenVariableDict: ...

    def state_dict(self) -> MutableVariableDict: ...

    def restore_state(self, state_dict: Mapping[str, Any]) -> TrainState: ...

    def replace_params(self, params: VariableDict) -> TrainState: ...

    def replace_flax_mutables(self, flax_mutables: FrozenDict) -> TrainState: ...

    def replace_step(self, step: jnp.ndarray) -> TrainState: ...

    def apply_gradient(
        self, grads: Any, learning_rate: Any, flax_mutables: Any = EMPTY_DICT
    ) -> TrainState: ...

    def as_logical_axes(self) -> TrainState: ...


def _validate_params_axes(params_axes: Any, params: Any) -> None:
    named = set(traverse_util.flatten_dict(flax_partitioning.get_axis_names(params_axes), sep="/"))
    missing = set(traverse_util.flatten_dict(params, sep="/")) - named
    if missing:
        raise ValueError(f"Missing axis names for parameters: {missing}")


def _split_variables(model_variables: Any) -> tuple[Any, Any, Any, Any]:
    """``(params, params_axes, flax_mutables, flax_mutables_axes)`` of a variables dict."""
    others, params = flax.core.frozen_dict.pop(model_variables, "params")
    params_axes = None
    if "params_axes" in others:
        others, params_axes = flax.core.frozen_dict.pop(others, "params_axes")
        _validate_params_axes(params_axes, params)
    mutables, mutables_axes = {}, {}
    for name, value in others.items():
        if name.endswith("_axes"):
            collection = name[: -len("_axes")]
            _validate_params_axes(value, others[collection])
            mutables_axes[collection] = value
        else:
            mutables[name] = value
    return params, params_axes, flax.core.freeze(mutables), flax.core.freeze(mutables_axes) or None


class FlaxOptimTrainState(flax.struct.PyTreeNode):
    """The step, parameters and optimizer state (one ``Optimizer``) plus the other collections."""

    _optimizer: optimizers.OptimizerType
    params_axes: FrozenVariableDict | None = None
    flax_mutables: FrozenDict = EMPTY_DICT
    flax_mutables_axes: FrozenVariableDict | None = None

    @classmethod
    def create(
        cls, optimizer_def: optimizers.OptimizerDefType, model_variables: FrozenVariableDict
    ) -> FlaxOptimTrainState:
        """A fresh state for ``model_variables`` (as ``Module.init`` returns them).

        An optimizer with ``set_param_axes`` (Adafactor) gets the parameters'
        logical axis names, so the model must emit ``params_axes``.
        """
        params, params_axes, mutables, mutables_axes = _split_variables(model_variables)
        if hasattr(optimizer_def, "set_param_axes"):
            if params_axes is None:
                raise ValueError(
                    "The optimizer supports params_axes for model-based partitioning, but the model "
                    "is not emitting them."
                )
            optimizer_def.set_param_axes(flax_partitioning.get_axis_names(params_axes))
        return FlaxOptimTrainState(
            optimizer_def.create(params),
            params_axes=params_axes,
            flax_mutables=mutables,
            flax_mutables_axes=mutables_axes,
        )

    @property
    def step(self) -> jnp.ndarray:
        return self._optimizer.state.step

    @property
    def params(self) -> FrozenVariableDict:
        return self._optimizer.target

    @property
    def param_states(self) -> FrozenVariableDict:
        return self._optimizer.state.param_states

    def state_dict(self) -> MutableVariableDict:
        state_dict = self._optimizer.state_dict()
        if self.flax_mutables:
            state_dict["flax_mutables"] = flax.core.unfreeze(self.flax_mutables)
        return state_dict

    def apply_gradient(
        self, grads: Any, learning_rate: Any, flax_mutables: Any = EMPTY_DICT
    ) -> FlaxOptimTrainState:
        new_optimizer = self._optimizer.apply_gradient(grads, learning_rate=learning_rate)
        return self.replace(_optimizer=new_optimizer, flax_mutables=flax_mutables)

    def replace_params(self, params: VariableDict) -> FlaxOptimTrainState:
        return self.replace(_optimizer=self._optimizer.replace(target=params))

    def replace_flax_mutables(self, flax_mutables: FrozenDict) -> FlaxOptimTrainState:
        return self.replace(flax_mutables=flax_mutables)

    def replace_step(self, step: jnp.ndarray) -> FlaxOptimTrainState:
        state_dict = self.state_dict()
        state_dict["state"]["step"] = step
        return self.restore_state(state_dict)

    def restore_state(self, state_dict: Mapping[str, Any]) -> FlaxOptimTrainState:
        mutables = state_dict.get("flax_mutables")
        return self.replace(
            _optimizer=self._optimizer.restore_state(state_dict),
            flax_mutables=flax.core.freeze(mutables) if mutables is not None else EMPTY_DICT,
        )

    def as_logical_axes(self) -> FlaxOptimTrainState:
        """This state with every array replaced by its logical axis names (None: replicated)."""
        opt_def = self._optimizer.optimizer_def
        if not hasattr(opt_def, "derive_logical_axes"):
            raise ValueError(
                f"Optimizer '{type(opt_def).__name__}' requires a `derive_logical_axes` method to be "
                "used with named axis partitioning."
            )
        return FlaxOptimTrainState(
            _optimizer=opt_def.derive_logical_axes(
                self._optimizer, flax_partitioning.get_axis_names(self.params_axes)
            ),
            flax_mutables=flax_partitioning.get_axis_names(self.flax_mutables_axes or EMPTY_DICT),
            flax_mutables_axes=self.flax_mutables_axes,
        )


class InferenceState(flax.struct.PyTreeNode):
    """Parameters and collections without optimizer state, for evaluation and inference."""

    step: jnp.ndarray | None
    params: FrozenVariableDict
    params_axes: FrozenVariableDict | None = None
    flax_mutables: FrozenDict = EMPTY_DICT
    flax_mutables_axes: FrozenVariableDict | None = None

    @classmethod
    def create(cls, model_variables: FrozenVariableDict) -> InferenceState:
        params, params_axes, mutables, mutables_axes = _split_variables(model_variables)
        return InferenceState(
            step=jnp.array(0),
            params=params,
            params_axes=params_axes,
            flax_mutables=mutables,
            flax_mutables_axes=mutables_axes,
        )

    @property
    def param_states(self) -> FrozenVariableDict:
        raise NotImplementedError("InferenceState has no optimizer states.")

    def apply_gradient(self, *args: Any, **kwargs: Any) -> InferenceState:
        raise NotImplementedError("InferenceState does not support `apply_gradient`.")

    def state_dict(self) -> MutableVariableDict:
        state_dict: dict[str, Any] = {
            "target": flax.core.unfreeze(self.params),
            "state": {"step": self.step},
        }
        if self.flax_mutables:
            state_dict["flax_mutables"] = flax.core.unfreeze(self.flax_mutables)
        return state_dict

    def replace_step(self, step: jnp.ndarray) -> InferenceState:
        return self.replace(step=step)

    def replace_params(self, params: FrozenVariableDict) -> InferenceState:
        return self.replace(params=params)

    def replace_flax_mutables(self, flax_mutables: FrozenDict) -> InferenceState:
        return self.replace(flax_mutables=flax_mutables)

    def restore_state(self, state_dict: Mapping[str, Any]) -> InferenceState:
        mutables = state_dict.get("flax_mutables")
        return self.replace(
            params=flax.core.freeze(state_dict["target"]),
            step=state_dict["state"]["step"],
            flax_mutables=flax.core.freeze(mutables) if mutables is not None else EMPTY_DICT,
        )

    def as_logical_axes(self) -> InferenceState:
        # step None: partitioners skip it (tree maps never reach a None leaf).
        return InferenceState(
            step=None,
            params=flax_partitioning.get_axis_names(self.params_axes),
            flax_mutables=flax_partitioning.get_axis_names(self.flax_mutables_axes or EMPTY_DICT),
        )


__all__ = [
    "EMPTY_DICT",
    "FlaxOptimTrainState",
    "FrozenDict",
    "FrozenVariableDict",
    "InferenceState",
    "MutableVariableDict",
    "TrainState",
    "VariableDict",
]
