"""Upstream t5x's ``t5x.adafactor``: Adafactor as a ``t5x.optimizers.OptimizerDef``.

The update rule is ``t5x.training.adafactor``'s (one implementation, shared with
t5x-launch): this class keeps upstream's hyper parameters, ``OptimizerState``
layout (``step`` and per-parameter ``v_row`` / ``v_col`` / ``v`` / ``m`` slots),
``set_param_axes`` and ``derive_logical_axes``, and runs each step through that
Optax transformation. ``as_optax()`` hands t5x-launch the same transformation,
so ``optimizer_def = @adafactor.Adafactor()`` in an upstream gin file trains
with the numbers this class computes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import flax.core
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from t5x import optimizers, training
from t5x.training import FactorDim, HParamMap, factor_name_to_factordim

HEURISTIC_RULE = training.HEURISTIC_RULE
OptimizerState = optimizers.OptimizerState
AdafactorParamState = training.AdafactorParamState
_AdafactorParamState = AdafactorParamState  # upstream's name; same slots, same order


@flax.struct.dataclass
class AdafactorHyperParams:
    """Adafactor's hyper parameters, in upstream's order (see :class:`Adafactor`)."""

    learning_rate: float | None
    factored: bool
    multiply_by_parameter_scale: bool | HParamMap
    beta1: float | None
    decay_rate: float
    step_offset: int
    clipping_threshold: float | None
    weight_decay_rate: float | None
    min_dim_size_to_factor: int
    epsilon1: float
    epsilon2: float
    factor_map: Any = None
    logical_factor_rules: Any = None
    weight_decay_rate_lr_exponent: float | None = None
    global_norm_clip_threshold: float | None = None
    max_parameter_scale: float | None = None
    skip_nan_updates: bool | None = False


_AdafactorHyperParams = AdafactorHyperParams  # upstream's name


def _flat(tree: Any) -> dict[str, Any]:
    return traverse_util.flatten_dict(flax.core.unfreeze(tree), sep="/")


def _like(reference: Any, flat: dict[str, Any]) -> Any:
    """``flat`` ({'a/b': leaf}) nested again, frozen if ``reference`` is."""
    nested = traverse_util.unflatten_dict(flat, sep="/")
    return flax.core.freeze(nested) if isinstance(reference, flax.core.FrozenDict) else nested


class Adafactor(optimizers.OptimizerDef):
    """T5X's Adafactor (https://arxiv.org/abs/1804.04235) with upstream's keywords.

    The arguments are ``t5x.training.adafactor``'s (see there); ``factor_map``
    must be an :class:`HParamMap` or None, and ``logical_factor_rules`` take
    effect through :meth:`set_param_axes` (``FlaxOptimTrainState.create`` and
    t5x-launch call it with the model's logical axes).
    """

    def __init__(
        self,
        learning_rate: float | None = None,
        factored: bool = True,
        multiply_by_parameter_scale: bool | HParamMap = True,
        beta1: float | None = None,
        decay_rate: float = 0.8,
        step_offset: int = 0,
        clipping_threshold: float | None = 1.0,
        weight_decay_rate: float | None = None,
        min_dim_size_to_factor: int = 128,
        epsilon1: float = 1e-30,
        epsilon2: float = 1e-3,
        dtype_momentum: Any = jnp.float32,
        factor_map: HParamMap | None = None,
        logical_factor_rules: Mapping[str, Any] | None = None,
        weight_decay_rate_lr_exponent: float | None = None,
        global_norm_clip_threshold: float | None = None,
        max_parameter_scale: float | None = None,
        skip_nan_updates: bool | None = False,
    ):
        if not factored and factor_map is not None:
            raise ValueError("Adafactor: factored=False but factor_map rules were given")
        if not isinstance(multiply_by_parameter_scale, (bool, HParamMap)):
            raise TypeError(
                "Adafactor: multiply_by_parameter_scale must be a bool or HParamMap, "
                f"got {type(multiply_by_parameter_scale).__name__}"
            )
        if not isinstance(factor_map, (type(None), HParamMap)):
            raise TypeError(
                f"Adafactor: factor_map must be None or an HParamMap, got {type(factor_map).__name__}"
            )
        super().__init__(
            AdafactorHyperParams(
                learning_rate,
                factored,
                multiply_by_parameter_scale,
                beta1,
                decay_rate,
                step_offset,
                clipping_threshold,
                weight_decay_rate,
                min_dim_size_to_factor,
                epsilon1,
                epsilon2,
                factor_map,
                logical_factor_rules,
                weight_decay_rate_lr_exponent,
                global_norm_clip_threshold,
                max_parameter_scale,
                skip_nan_updates,
            )
        )
        self.dtype_momentum = jax.dtypes.canonicalize_dtype(dtype_momentum)

    # --- the shared Optax transformation ---

    def _transformation(self, hyper_params: AdafactorHyperParams, **changes: Any) -> training.Adafactor:
        options = {
            name: getattr(hyper_params, name)
            for name in AdafactorHyperParams.__dataclass_fields__
            if name != "logical_factor_rules"
        }
        # Factoring depends on the definition's rules, not per-step overrides (as upstream).
        options["factored"] = self.hyper_params.factored
        factored = self.hyper_params.factored
        options["factor_map"] = (self.hyper_params.factor_map or None) if factored else None
        options.update(changes)
        return training.adafactor(dtype_momentum=self.dtype_momentum, **options)

    def as_optax(self) -> training.Adafactor:
        """This optimizer as the Optax transformation t5x-launch trains with."""
        hp = self.hyper_params
        transformation = self._transformation(hp)
        if hp.logical_factor_rules is not None:
            # Keep the rules, so t5x-launch can bind the model's axes itself.
            options = dict(transformation.options)  # type: ignore[attr-defined]
            options["logical_factor_rules"] = hp.logical_factor_rules
            transformation = training.adafactor(**options)
        return transformation

    # --- upstream's helpers ---

    @staticmethod
    def _decay_rate_pow(i: Any, exponent: float = 0.8) -> Any:
        """The second-moment decay at step ``i``: ``1 - (i + 1) ** -exponent``."""
        return 1.0 - (jnp.asarray(i, jnp.float32) + 1.0) ** (-exponent)

    @staticmethod
    def _parse_rule(
        rule: Any, shape: Sequence[int], path: str, fallback_to_heuristics: bool = True
    ) -> tuple[tuple[int, ...], Any]:
        """``(dims averaged over, (row dims, column dims) | None | HEURISTIC_RULE)`` for one parameter.

        Explicit rules for parameters of rank <= 2 without batch dims give way to
        the shape heuristic (as ``t5x.training.adafactor`` does).
        """
        every_dim = tuple(range(len(shape)))
        if rule is None:
            return every_dim, None
        if rule is HEURISTIC_RULE:
            if len(shape) > 2:
                raise ValueError(
                    f"parameter {path!r} of shape {tuple(shape)} needs an explicit factorization rule"
                )
            return every_dim, HEURISTIC_RULE
        rule = tuple(factor_name_to_factordim(r) for r in rule)
        if len(rule) != len(shape):
            raise ValueError(
                f"factorization rule {rule} has rank {len(rule)}; {path!r} has shape {tuple(shape)}"
            )
        batch = tuple(i for i, d in enumerate(rule) if d == FactorDim.BATCH)
        if fallback_to_heuristics and len(shape) <= 2 and not batch:
            return every_dim, HEURISTIC_RULE
        rows = tuple(i for i, d in enumerate(rule) if d == FactorDim.ROW)
        cols = tuple(i for i, d in enumerate(rule) if d == FactorDim.COLUMN)
        averaging = tuple(i for i in every_dim if i not in batch)
        return averaging, ((rows, cols) if rows or cols else None)

    def _factored_dims(self, shape: Sequence[int]) -> Any:
        """The shape heuristic's ``((row dim,), (column dim,))``, or None (not factored)."""
        hp = self.hyper_params
        if not hp.factored or len(shape) < 2:
            return None
        order = np.argsort(shape, kind="stable")
        if shape[order[-2]] < hp.min_dim_size_to_factor:
            return None
        return (int(order[-2]),), (int(order[-1]),)

    # --- OptimizerDef ---

    def init_param_state(self, param: Any, path: str) -> AdafactorParamState:
        state = self._transformation(self.hyper_params).init({path: param})
        return state.param_states[path]

    def init_state(self, params: Any) -> optimizers.OptimizerState:
        state = self._transformation(self.hyper_params).init(_flat(params))
        return OptimizerState(jnp.asarray(0, dtype=jnp.int32), _like(params, state.param_states))

    def _step(
        self,
        hyper_params: AdafactorHyperParams,
        step: Any,
        params: dict,
        states: dict,
        grads: dict,
        **changes: Any,
    ) -> tuple[dict, dict]:
        if hyper_params.learning_rate is None:
            raise ValueError(
                "Adafactor: no learning rate (give learning_rate= to Adafactor or apply_gradient)"
            )
        transformation = self._transformation(hyper_params, **changes)
        updates, new_state = transformation.update(
            grads, training.AdafactorState(count=step, param_states=states), params
        )
        new_params = {
            k: (jnp.asarray(params[k]) + updates[k]).astype(jnp.asarray(params[k]).dtype) for k in params
        }
        return new_params, new_state.param_states

    def apply_param_gradient(
        self, step: Any, hyper_params: AdafactorHyperParams, param: Any, state: Any, grad: Any, path: str
    ) -> tuple[Any, AdafactorParamState]:
        """One parameter's step (no global norm clipping, which needs every gradient)."""
        new_params, new_states = self._step(
            hyper_params, step, {path: param}, {path: state}, {path: grad}, global_norm_clip_threshold=None
        )
        return new_params[path], new_states[path]

    def apply_gradient(
        self, hyper_params: AdafactorHyperParams, params: Any, state: Any, grads: Any
    ) -> tuple[Any, optimizers.OptimizerState]:
        flat_params = _flat(params)
        flat_states = _flat(state.param_states)
        flat_grads = _flat(grads)
        new_params, new_states = self._step(
            hyper_params,
            state.step,
            flat_params,
            {k: flat_states[k] for k in flat_params},
            {k: flat_grads[k] for k in flat_params},
        )
        return _like(params, new_params), OptimizerState(state.step + 1, _like(params, new_states))

    def set_param_axes(self, param_logical_axes: Any) -> None:
        """Derives ``factor_map`` from the parameters' logical axis names and ``logical_factor_rules``."""
        rules = self.hyper_params.logical_factor_rules
        if rules is None:
            return
        none, row, col = FactorDim.NONE, FactorDim.ROW, FactorDim.COLUMN
        factor_map = {}
        for path, axes in _flat(param_logical_axes).items():
            unknown = [name for name in tuple(axes) if name not in rules]
            if unknown:
                raise ValueError(
                    f"Adafactor: parameter {path!r} has logical axes {unknown} that logical_factor_rules "
                    f"does not name (it names {sorted(map(str, rules))})"
                )
            dims = tuple(factor_name_to_factordim(rules[name]) for name in tuple(axes))
            if row in dims and col in dims and none in dims:
                raise ValueError(
                    f"Adafactor: incomplete factor spec {dims} for {path!r} (axes {tuple(axes)})"
                )
            if row not in dims or col not in dims:
                # Half-factored: unfactored, keeping only the batch dims.
                dims = tuple(none if d in (row, col) else d for d in dims)
            factor_map[path] = dims
        self.hyper_params = self.hyper_params.replace(factor_map=factor_map)

    def derive_logical_axes(
        self, optimizer: optimizers.Optimizer, param_logical_axes: Any
    ) -> optimizers.Optimizer:
        """``optimizer`` with its arrays replaced by logical axes: ``v`` and ``m`` follow the parameter."""
        flat_axes = _flat(param_logical_axes)
        flat_states = _flat(optimizer.state.param_states)
        with_momentum = bool(self.hyper_params.beta1)
        slots: Any = AdafactorParamState  # holding axes here, not arrays
        slot_axes = {
            path: slots(
                v_row=None,
                v_col=None,
                v=axes if tuple(flat_states[path].v.shape) != (1,) else None,
                m=axes if with_momentum else None,
            )
            for path, axes in flat_axes.items()
        }
        return optimizers.Optimizer(
            optimizer.optimizer_def,
            OptimizerState(None, _like(param_logical_axes, slot_axes)),
            param_logical_axes,
        )


def standard_logical_factor_rules() -> dict[str, FactorDim]:
    """Upstream's logical axis name -> factoring role table (a function of its own for gin)."""
    return training.standard_logical_factor_rules()


__all__ = [
    "HEURISTIC_RULE",
    "Adafactor",
    "AdafactorHyperParams",
    "AdafactorParamState",
    "FactorDim",
    "HParamMap",
    "factor_name_to_factordim",
    "standard_logical_factor_rules",
]
