"""TrainState: parameters, optimizer state, step and extra model collections."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import optax

from t5x.interfaces import PyTree
from t5x.training._axes import flatten_params_axes
from t5x.training._optimizers import (
    bind_param_axes,
    opt_state_from_param_states,
    opt_state_to_param_states,
)

_AXES_COLLECTION_SUFFIX = "_axes"


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TrainState:
    """Everything a training step reads and writes, as one pytree.

    Attributes:
      step: int32 scalar, the number of gradient steps applied.
      params: the parameters (nested dict, upstream's names).
      opt_state: the Optax optimizer state.
      collections: extra mutable model collections (upstream's
        ``flax_mutables``), a possibly empty dict.
      optimizer: the Optax transformation (static; not part of the pytree).
    """

    step: Any
    params: PyTree
    opt_state: PyTree
    collections: dict[str, PyTree]
    optimizer: optax.GradientTransformation = dataclasses.field(metadata={"static": True})

    @classmethod
    def create(
        cls,
        optimizer: optax.GradientTransformation,
        variables: Mapping[str, PyTree],
        params_axes: PyTree = None,
    ) -> TrainState:
        """Builds a step-0 state from model variables.

        Args:
          optimizer: any Optax transformation.
          variables: ``{"params": ..., "params_axes": ..., <other collections>}``
            as ``Model.get_initial_variables`` returns them; ``*_axes``
            collections are metadata and are dropped.
          params_axes: logical axes of the params (default: ``variables
            ["params_axes"]``); Adafactor derives its factor rules from them.

        Returns:
          The new TrainState.

        Raises:
          KeyError: ``variables`` has no ``"params"``.
        """
        if "params" not in variables:
            raise KeyError(f"model variables must contain 'params'; got collections {sorted(variables)}")
        if params_axes is None:
            params_axes = variables.get("params_axes")
        optimizer = bind_param_axes(optimizer, params_axes)
        params = variables["params"]
        collections = {
            k: v for k, v in variables.items() if k != "params" and not k.endswith(_AXES_COLLECTION_SUFFIX)
        }
        return cls(
            step=jnp.zeros([], jnp.int32),
            params=params,
            opt_state=optimizer.init(params),
            collections=collections,
            optimizer=optimizer,
        )

    def apply_gradient(self, grads: PyTree, learning_rate: Any = None, **collections: PyTree) -> TrainState:
        """Returns the state after one optimizer step with ``grads``.

        Args:
          grads: gradients shaped like ``params``.
          learning_rate: the rate for this step, passed to the optimizer as the
            ``learning_rate`` extra argument (T5X Adafactor and the optimizers of
            this package use it; plain Optax ones keep their own).
          **collections: new values of extra model collections.
        """
        extra = {} if learning_rate is None else {"learning_rate": learning_rate}
        optimizer = optax.with_extra_args_support(self.optimizer)
        updates, opt_state = optimizer.update(grads, self.opt_state, self.params, **extra)
        params = optax.apply_updates(self.params, updates)
        new_collections = {**self.collections, **collections}
        return dataclasses.replace(
            self, step=self.step + 1, params=params, opt_state=opt_state, collections=new_collections
        )

    def replace_params(self, params: PyTree) -> TrainState:
        """Returns a copy with other parameter values (same structure)."""
        return dataclasses.replace(self, params=params)

    def state_dict(self) -> dict[str, Any]:
        """The state in T5X checkpoint layout.

        Returns:
          ``{"target": params, "state": {"step": step, "param_states": slots}}``,
          plus ``"flax_mutables"`` when there are extra collections.
        """
        state_dict: dict[str, Any] = {
            "target": self.params,
            "state": {"step": self.step, "param_states": opt_state_to_param_states(self.opt_state)},
        }
        if self.collections:
            state_dict["flax_mutables"] = dict(self.collections)
        return state_dict

    def restore_state(self, state_dict: Mapping[str, Any]) -> TrainState:
        """Returns a state like this one holding the values of ``state_dict``.

        Raises:
          ValueError: a parameter or optimizer slot is missing or misshapen
            (the message names it).
        """
        params = _restore_tree(self.params, state_dict["target"], "target")
        step = jnp.asarray(state_dict["state"]["step"], jnp.int32)
        opt_state = opt_state_from_param_states(
            self.opt_state, state_dict["state"].get("param_states", {}), step
        )
        collections = self.collections
        if self.collections:
            collections = _restore_tree(
                self.collections, state_dict.get("flax_mutables", {}), "flax_mutables"
            )
        return dataclasses.replace(
            self, step=step, params=params, opt_state=opt_state, collections=collections
        )

    @classmethod
    def from_state_dict(
        cls,
        state_dict: Mapping[str, Any],
        optimizer: optax.GradientTransformation,
        params_axes: PyTree = None,
    ) -> TrainState:
        """Builds a TrainState from a T5X state dict (the inverse of ``state_dict``).

        Args:
          state_dict: ``{"target", "state": {"step", "param_states"}}`` with array leaves.
          optimizer: the optimizer whose state ``param_states`` holds.
          params_axes: the params' logical axes (Adafactor's factor rules).

        Returns:
          The TrainState.

        Raises:
          ValueError: the slots do not fit ``optimizer`` (names the slot).
        """
        optimizer = bind_param_axes(optimizer, params_axes)
        params = state_dict["target"]
        template = jax.eval_shape(optimizer.init, params)
        step = jnp.asarray(state_dict["state"]["step"], jnp.int32)
        opt_state = opt_state_from_param_states(template, state_dict["state"].get("param_states", {}), step)
        return cls(
            step=step,
            params=params,
            opt_state=opt_state,
            collections=dict(state_dict.get("flax_mutables", {})),
            optimizer=optimizer,
        )


def _restore_tree(template: PyTree, values: Any, what: str) -> PyTree:
    leaves, treedef = jax.tree_util.tree_flatten_with_path(template)
    out = []
    for path, leaf in leaves:
        node = values
        for key in path:
            name = getattr(key, "key", getattr(key, "name", getattr(key, "idx", None)))
            try:
                node = node[name]
            except (KeyError, IndexError, TypeError):
                raise ValueError(
                    f"{what}: {jax.tree_util.keystr(path)} is missing from the state dict"
                ) from None
        if tuple(jnp.shape(node)) != tuple(leaf.shape):
            raise ValueError(
                f"{what}: {jax.tree_util.keystr(path)} has shape {tuple(jnp.shape(node))}, expected {tuple(leaf.shape)}"
            )
        out.append(node)
    return jax.tree_util.tree_unflatten(treedef, out)


def split_params_axes(variables: Mapping[str, PyTree]) -> dict[str, tuple]:
    """``{param path: logical names}`` from a variables dict's ``params_axes``."""
    return flatten_params_axes(variables.get("params_axes"))
