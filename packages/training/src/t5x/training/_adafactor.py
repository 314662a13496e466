"""T5X's Adafactor as an Optax gradient transformation.

Follows the update rule, argument names and defaults of upstream
``t5x.adafactor.Adafactor``: second moments factored over a (row, column) pair
of dimension sets chosen by explicit rules (per parameter path, or derived from
logical axis names) or, for parameters of rank <= 2 without batch dimensions,
by upstream's shape heuristic (the two largest dims, when the smaller of them is
at least ``min_dim_size_to_factor``). Dimensions marked ``BATCH`` (stacked or
scanned layers) are never averaged over, so scales and clipping stay per layer.

The state keeps upstream's per-parameter slots ``v_row``, ``v_col``, ``v`` and
``m``, with ``(1,)``-shaped placeholders for unused slots, so it maps one to one
onto T5X checkpoints.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from t5x.interfaces import PyTree
from t5x.training._axes import flatten_params_axes, path_to_str


class FactorDim(enum.Enum):
    """How Adafactor treats one dimension of a parameter."""

    NONE = None  # averaged over, not factored
    BATCH = 1  # independent slices (stacked layers): never averaged over
    ROW = 2
    COLUMN = 3


class _Heuristic(enum.Enum):
    RULE = 1


HEURISTIC_RULE = _Heuristic.RULE
"""Marks a parameter whose factored dims come from its shape."""


def standard_logical_factor_rules() -> dict[str, FactorDim]:
    """Upstream's mapping from logical axis names to factorisation roles."""
    return {
        "vocab": FactorDim.COLUMN,
        "embed": FactorDim.ROW,
        "mlp": FactorDim.COLUMN,
        "heads": FactorDim.COLUMN,
        "kv": FactorDim.COLUMN,
        "joined_kv": FactorDim.COLUMN,
        "relpos_buckets": FactorDim.NONE,
        "layers": FactorDim.BATCH,
        "stack": FactorDim.BATCH,
        "q_wi_fused": FactorDim.COLUMN,
        "o_wo_fused": FactorDim.COLUMN,
        "multiquery_heads": FactorDim.COLUMN,
        "kv_fused": FactorDim.COLUMN,
        "layer_norm_scale": FactorDim.NONE,
    }


_FACTOR_NAMES = {
    "row": FactorDim.ROW,
    "col": FactorDim.COLUMN,
    "column": FactorDim.COLUMN,
    "batch": FactorDim.BATCH,
    "none": FactorDim.NONE,
    "unfactorized": FactorDim.NONE,
}


def factor_name_to_factordim(name: Any) -> Any:
    """Maps ``'row'``, ``'col'``, ``'batch'``, ``'none'`` ... to a FactorDim.

    Values that are not strings pass through unchanged.

    Raises:
      ValueError: an unknown name.
    """
    if not isinstance(name, str):
        return name
    try:
        return _FACTOR_NAMES[name.lower()]
    except KeyError:
        raise ValueError(
            f"unknown Adafactor factor name {name!r}; expected one of {sorted(_FACTOR_NAMES)}"
        ) from None


class HParamMap:
    """Maps parameter paths to values by the first matching regular expression.

    Args:
      rules: ``(regex, value)`` pairs, tried in order with ``re.search`` against
        the '/'-joined parameter path.
    """

    def __init__(self, rules: Sequence[tuple[str, Any]]):
        self._rules = [(re.compile(pattern), value) for pattern, value in rules]

    def __getitem__(self, path: str) -> Any:
        for pattern, value in self._rules:
            if pattern.search(path):
                return value
        raise KeyError(
            f"no rule matches parameter {path!r} (patterns: {[p.pattern for p, _ in self._rules]})"
        )

    def __call__(self, params: PyTree) -> PyTree:
        """Returns a tree like ``params`` holding each parameter's value."""
        return jax.tree_util.tree_map_with_path(lambda path, _: self[path_to_str(path)], params)


class AdafactorParamState(NamedTuple):
    """Per-parameter slots, named as in T5X checkpoints.

    Attributes:
      v_row: factored second moment over the row dims (``(1,)`` if unused).
      v_col: factored second moment over the column dims (``(1,)`` if unused).
      v: full second moment of unfactored parameters (``(1,)`` if unused).
      m: first moment when ``beta1`` is set (``(1,)`` if unused).
    """

    v_row: jax.Array
    v_col: jax.Array
    v: jax.Array
    m: jax.Array


class AdafactorState(NamedTuple):
    """Adafactor's state: the step count and a tree of AdafactorParamState."""

    count: jax.Array  # type: ignore[assignment]  # optax's name for step counters
    param_states: PyTree


_Plan = tuple[tuple[int, ...], tuple[tuple[int, ...], tuple[int, ...]] | None]


class Adafactor(optax.GradientTransformationExtraArgs):
    """An Optax transformation built by :func:`adafactor`.

    ``update`` takes the learning rate of the step as the extra keyword
    argument ``learning_rate`` (as T5X's trainer passes it); without one, the
    ``learning_rate`` given to :func:`adafactor` is used (a float, or a schedule
    of the step count).
    """

    def with_param_axes(self, params_axes: PyTree) -> Adafactor:
        """Returns this optimizer with factor rules derived from logical axes.

        Like upstream's ``set_param_axes``: a no-op unless
        ``logical_factor_rules`` was given.

        Args:
          params_axes: a tree of logical axis-name tuples mirroring the params
            (or Flax's ``params_axes`` collection).
        """
        options = dict(self.options)  # type: ignore[attr-defined]
        if options["logical_factor_rules"] is None or params_axes is None:
            return self
        options["params_axes"] = params_axes
        return adafactor(**options)


def _factor_map_from_axes(
    params_axes: PyTree, logical_factor_rules: Mapping[str, Any]
) -> dict[str, tuple[FactorDim, ...]]:
    rules: dict[str, tuple[FactorDim, ...]] = {}
    for path, names in flatten_params_axes(params_axes).items():
        dims = []
        for name in names:
            if name is None or name not in logical_factor_rules:
                raise ValueError(
                    f"parameter {path!r} has logical axis {name!r}, which logical_factor_rules does not name "
                    f"(known: {sorted(k for k in logical_factor_rules if k is not None)})"
                )
            dims.append(factor_name_to_factordim(logical_factor_rules[name]))
        row, col, none = FactorDim.ROW in dims, FactorDim.COLUMN in dims, FactorDim.NONE in dims
        if row and col and none:
            raise ValueError(f"incomplete Adafactor factor spec {tuple(dims)} for {path!r} with axes {names}")
        if not (row and col):
            # Half-factored specs fall back to unfactored, keeping batch dims.
            dims = [FactorDim.NONE if d in (FactorDim.ROW, FactorDim.COLUMN) else d for d in dims]
        rules[path] = tuple(dims)
    return rules


def _parse_rule(rule: Any, shape: tuple[int, ...], path: str) -> tuple[tuple[int, ...], Any]:
    ndim = len(shape)
    every_dim = tuple(range(ndim))
    if rule is None:
        return every_dim, None
    if rule is HEURISTIC_RULE:
        if ndim > 2:
            raise ValueError(
                f"parameter {path!r} of shape {shape} has rank > 2 and needs an explicit factorization rule "
                "(pass logical_factor_rules with params axes, or factor_map)"
            )
        return every_dim, HEURISTIC_RULE
    rule = tuple(factor_name_to_factordim(r) for r in rule)
    if len(rule) != ndim:
        raise ValueError(
            f"factorization rule {rule} has rank {len(rule)}, parameter {path!r} has shape {shape}"
        )
    rows = tuple(i for i, d in enumerate(rule) if d == FactorDim.ROW)
    cols = tuple(i for i, d in enumerate(rule) if d == FactorDim.COLUMN)
    batch = tuple(i for i, d in enumerate(rule) if d == FactorDim.BATCH)
    averaging = tuple(i for i in every_dim if i not in batch)
    if ndim <= 2 and not batch:
        # Upstream ignores explicit rules for plain matrices and vectors.
        return every_dim, HEURISTIC_RULE
    return averaging, ((rows, cols) if rows or cols else None)


def _heuristic_dims(shape: tuple[int, ...], factored: bool, min_dim_size_to_factor: int) -> Any:
    if not factored or len(shape) < 2:
        return None
    order = np.argsort(shape, kind="stable")
    if shape[order[-2]] < min_dim_size_to_factor:
        return None
    return (int(order[-2]),), (int(order[-1]),)


def adafactor(
    learning_rate: float | Callable[[Any], Any] | None = None,
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
    factor_map: HParamMap | Mapping[str, Any] | None = None,
    logical_factor_rules: Mapping[str, Any] | None = None,
    weight_decay_rate_lr_exponent: float | None = None,
    global_norm_clip_threshold: float | None = None,
    max_parameter_scale: float | None = None,
    skip_nan_updates: bool = False,
    params_axes: PyTree = None,
) -> Adafactor:
    """T5X's Adafactor (https://arxiv.org/abs/1804.04235) as an Optax transformation.

    Args:
      learning_rate: the step size (a float or a schedule of the step count);
        a ``learning_rate=`` keyword passed to ``update`` takes precedence.
      factored: whether to factor second moments of matrices.
      multiply_by_parameter_scale: scale the step by each parameter's RMS
        (at least ``epsilon2``); an HParamMap chooses per parameter path.
      beta1: momentum coefficient, or None for no momentum (no ``m`` slot).
      decay_rate: exponent of the second-moment decay ``1 - (t + 1)^-decay_rate``
        with ``t = step - step_offset``.
      step_offset: the step at which the decay schedule restarts (fine-tuning).
      clipping_threshold: RMS threshold of the update clipping (None: off).
      weight_decay_rate: decoupled weight decay per step (not scaled by the
        learning rate unless ``weight_decay_rate_lr_exponent`` is set).
      min_dim_size_to_factor: the shape heuristic factors only when the second
        largest dimension is at least this large.
      epsilon1: added to squared gradients.
      epsilon2: lower bound of the parameter scale.
      dtype_momentum: dtype of the ``m`` slot.
      factor_map: explicit rules per parameter path (HParamMap or dict) giving a
        tuple of FactorDim (or names) per dimension, or None for unfactored.
      logical_factor_rules: logical axis name -> FactorDim; with ``params_axes``
        (here or through :meth:`Adafactor.with_param_axes`) it supersedes
        ``factor_map``, as upstream's ``set_param_axes`` does.
      weight_decay_rate_lr_exponent: weight decay becomes
        ``(weight_decay_rate or 1) * learning_rate ** exponent``.
      global_norm_clip_threshold: clip gradients to this global norm first.
      max_parameter_scale: upper bound of the parameter scale.
      skip_nan_updates: keep the previous parameter and slot values wherever
        the update would be NaN.
      params_axes: the parameters' logical axis names (see ``logical_factor_rules``).

    Returns:
      An :class:`Adafactor` transformation; its state is an AdafactorState.

    Raises:
      ValueError: ``factor_map`` with ``factored=False``, or bad rules.
      TypeError: a wrongly typed ``multiply_by_parameter_scale``.
    """
    options = dict(locals())
    if not factored and factor_map is not None:
        raise ValueError("adafactor: factored=False but factor_map rules were given")
    if not isinstance(multiply_by_parameter_scale, (bool, HParamMap)):
        raise TypeError(
            f"adafactor: multiply_by_parameter_scale must be a bool or HParamMap, got {type(multiply_by_parameter_scale)}"
        )
    if logical_factor_rules is not None and params_axes is not None:
        factor_map = _factor_map_from_axes(params_axes, logical_factor_rules)
    momentum_dtype = jax.dtypes.canonicalize_dtype(dtype_momentum)

    def rule_for(path: str) -> Any:
        if not factored:
            return None
        if factor_map is None:
            return HEURISTIC_RULE
        try:
            return factor_map[path]
        except KeyError:
            raise KeyError(f"adafactor: no factorization rule for parameter {path!r}") from None

    def plan(path: str, shape: tuple[int, ...]) -> _Plan:
        averaging, dims = _parse_rule(rule_for(path), shape, path)
        if dims is HEURISTIC_RULE:
            dims = _heuristic_dims(shape, factored, min_dim_size_to_factor)
        return averaging, dims

    def placeholder() -> jax.Array:
        return jnp.zeros((1,), jnp.float32)

    def init_param(path: tuple[Any, ...], param: Any) -> AdafactorParamState:
        shape = tuple(param.shape)
        _, dims = plan(path_to_str(path), shape)
        v_row = v_col = v = m = placeholder()
        if dims is not None:
            rows, cols = dims
            v_row = jnp.zeros(tuple(np.delete(shape, cols)), jnp.float32)
            v_col = jnp.zeros(tuple(np.delete(shape, rows)), jnp.float32)
        else:
            v = jnp.zeros(shape, jnp.float32)
        if beta1 is not None:
            m = jnp.zeros(shape, momentum_dtype)
        return AdafactorParamState(v_row=v_row, v_col=v_col, v=v, m=m)

    def init_fn(params: PyTree) -> AdafactorState:
        states = jax.tree_util.tree_map_with_path(init_param, params)
        return AdafactorState(count=jnp.zeros([], jnp.int32), param_states=states)

    def update_param(
        path: str, grad: Any, param: Any, state: AdafactorParamState, lr: Any, decay: Any, wd: Any
    ) -> tuple[Any, AdafactorParamState]:
        averaging, dims = plan(path, tuple(param.shape))
        grad = grad.astype(jnp.float32)
        update_scale = lr
        scale_this = multiply_by_parameter_scale
        if isinstance(scale_this, HParamMap):
            scale_this = scale_this[path]
        if scale_this:
            param_scale = jnp.sqrt(jnp.mean(param * param, axis=averaging, keepdims=True))
            param_scale = jnp.maximum(param_scale, epsilon2)
            if max_parameter_scale is not None:
                param_scale = jnp.minimum(param_scale, max_parameter_scale)
            update_scale = update_scale * param_scale
        mixing = 1.0 - decay
        grad_sqr = grad * grad + epsilon1
        new = {"v_row": placeholder(), "v_col": placeholder(), "v": placeholder(), "m": placeholder()}
        if dims is not None:
            rows, cols = dims
            new_v_row = decay * state.v_row + mixing * jnp.mean(grad_sqr, axis=cols)
            new_v_col = decay * state.v_col + mixing * jnp.mean(grad_sqr, axis=rows)
            new["v_row"], new["v_col"] = new_v_row, new_v_col
            rows_in_v_row = tuple(d - sum(c < d for c in cols) for d in rows)
            row_mean = jnp.mean(new_v_row, axis=rows_in_v_row, keepdims=True)
            row_factor = (new_v_row / row_mean) ** -0.5
            col_factor = new_v_col**-0.5
            y = grad * jnp.expand_dims(row_factor, axis=cols) * jnp.expand_dims(col_factor, axis=rows)
        else:
            new_v = decay * state.v + mixing * grad_sqr
            new["v"] = new_v
            y = grad * new_v**-0.5
        if clipping_threshold is not None:
            rms = jnp.sqrt(jnp.mean(y * y, axis=averaging, keepdims=True))
            y = y / jnp.maximum(1.0, rms / clipping_threshold)
        subtrahend = update_scale * y
        if beta1 is not None:
            new_m = beta1 * state.m + (1.0 - beta1) * subtrahend
            subtrahend = new_m
            new["m"] = new_m.astype(momentum_dtype)
        update = -subtrahend
        if wd is not None:
            update = update - wd * param
        if skip_nan_updates:
            for slot in new:
                new[slot] = jnp.where(jnp.isnan(new[slot]), getattr(state, slot), new[slot])
            update = jnp.where(jnp.isnan(param + update), jnp.zeros_like(update), update)
        return update, AdafactorParamState(**new)

    def update_fn(
        updates: PyTree, state: AdafactorState, params: PyTree = None, **extra_args: Any
    ) -> tuple[PyTree, AdafactorState]:
        if params is None:
            raise ValueError("adafactor needs params in update(grads, state, params)")
        lr = extra_args.get("learning_rate")
        if lr is None:
            lr = learning_rate(state.count) if callable(learning_rate) else learning_rate
        if lr is None:
            raise ValueError(
                "adafactor: no learning rate (give learning_rate= to adafactor() or to update())"
            )
        wd = weight_decay_rate
        if weight_decay_rate_lr_exponent:
            wd = (weight_decay_rate or 1.0) * lr**weight_decay_rate_lr_exponent
        grads = updates
        if global_norm_clip_threshold:
            norm = optax.tree.norm(grads)
            scale = global_norm_clip_threshold * jnp.minimum(1.0 / global_norm_clip_threshold, 1.0 / norm)
            grads = jax.tree.map(lambda g: g * scale, grads)
        decay = 1.0 - (jnp.asarray(state.count - step_offset, jnp.float32) + 1.0) ** (-decay_rate)

        flat_params, treedef = jax.tree_util.tree_flatten_with_path(params)
        flat_grads = treedef.flatten_up_to(grads)  # type: ignore[attr-defined]
        flat_states = treedef.flatten_up_to(state.param_states)  # type: ignore[attr-defined]
        new_updates, new_states = [], []
        for (path, param), grad, param_state in zip(flat_params, flat_grads, flat_states, strict=True):
            update, new_state = update_param(path_to_str(path), grad, param, param_state, lr, decay, wd)
            new_updates.append(update)
            new_states.append(new_state)
        return (
            jax.tree_util.tree_unflatten(treedef, new_updates),
            AdafactorState(
                count=state.count + 1, param_states=jax.tree_util.tree_unflatten(treedef, new_states)
            ),
        )

    transformation = Adafactor(init_fn, update_fn)
    transformation.options = options  # type: ignore[attr-defined]
    return transformation
