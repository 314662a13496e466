"""Optax optimizers that take the step's learning rate, and their state as T5X slots."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import optax

from t5x.interfaces import PyTree, unflatten
from t5x.training._adafactor import Adafactor, AdafactorState
from t5x.training._axes import flatten_with_paths, path_to_str


def scale_by_learning_rate(
    learning_rate: float | Callable[[Any], Any] | None = None,
) -> optax.GradientTransformationExtraArgs:
    """Multiplies updates by ``-learning_rate``.

    The rate is the ``learning_rate=`` keyword given to ``update`` (what
    ``TrainState.apply_gradient`` passes), else ``learning_rate`` here (a float
    or a schedule of this transformation's own step count).

    Raises:
      ValueError: at update time, when neither gives a rate.
    """

    def init_fn(params: PyTree) -> optax.ScaleByScheduleState:
        del params
        return optax.ScaleByScheduleState(count=jnp.zeros([], jnp.int32))

    def update_fn(
        updates: PyTree, state: Any, params: PyTree = None, **extra_args: Any
    ) -> tuple[PyTree, Any]:
        del params
        lr = extra_args.get("learning_rate")
        if lr is None:
            lr = learning_rate(state.count) if callable(learning_rate) else learning_rate
        if lr is None:
            raise ValueError("no learning rate: pass learning_rate= to the optimizer or to apply_gradient")
        updates = jax.tree.map(lambda u: (-lr * u).astype(u.dtype), updates)
        return updates, optax.ScaleByScheduleState(count=optax.safe_increment(state.count))

    return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def adamw(
    learning_rate: float | Callable[[Any], Any] | None = None,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    weight_decay: float = 1e-4,
    mask: Any = None,
) -> optax.GradientTransformationExtraArgs:
    """Optax's AdamW whose learning rate may come from the trainer's schedule."""
    return optax.chain(
        optax.scale_by_adam(b1=b1, b2=b2, eps=eps),
        optax.add_decayed_weights(weight_decay, mask),
        scale_by_learning_rate(learning_rate),
    )


def lion(
    learning_rate: float | Callable[[Any], Any] | None = None,
    b1: float = 0.9,
    b2: float = 0.99,
    weight_decay: float = 1e-3,
    mask: Any = None,
) -> optax.GradientTransformationExtraArgs:
    """Optax's Lion whose learning rate may come from the trainer's schedule."""
    return optax.chain(
        optax.scale_by_lion(b1=b1, b2=b2),
        optax.add_decayed_weights(weight_decay, mask),
        scale_by_learning_rate(learning_rate),
    )


def sgd(
    learning_rate: float | Callable[[Any], Any] | None = None,
    momentum: float | None = None,
    nesterov: bool = False,
) -> optax.GradientTransformationExtraArgs:
    """SGD (optionally with momentum) whose learning rate may come from the trainer."""
    parts = [] if momentum is None else [optax.trace(decay=momentum, nesterov=nesterov)]
    return optax.chain(*parts, scale_by_learning_rate(learning_rate))


class MultiOptimizer(optax.GradientTransformationExtraArgs):
    """``optax.multi_transform`` that passes params axes on to its members."""

    def with_param_axes(self, params_axes: PyTree) -> MultiOptimizer:
        transforms, labels = self.parts  # type: ignore[attr-defined]
        return multi_transform({k: bind_param_axes(t, params_axes) for k, t in transforms.items()}, labels)


def multi_transform(
    transforms: Mapping[Hashable, optax.GradientTransformation], param_labels: Any
) -> MultiOptimizer:
    """Different optimizers for different parameter subsets.

    Args:
      transforms: label -> optimizer.
      param_labels: a tree of labels like the params, or a function of the
        params returning one.

    Returns:
      The combined optimizer (``optax.multi_transform``); the learning rate
      given to ``update`` reaches every member.
    """
    inner = optax.multi_transform(dict(transforms), param_labels)
    combined = MultiOptimizer(inner.init, inner.update)
    combined.parts = (dict(transforms), param_labels)  # type: ignore[attr-defined]
    return combined


def bind_param_axes(
    optimizer: optax.GradientTransformation, params_axes: PyTree
) -> optax.GradientTransformation:
    """Gives ``optimizer`` the params' logical axes where it uses them (Adafactor)."""
    if params_axes is not None and hasattr(optimizer, "with_param_axes"):
        return optimizer.with_param_axes(params_axes)
    return optimizer


def _flatten_dict(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(_flatten_dict(value, path + "/"))
        else:
            flat[path] = value
    return flat


def opt_state_to_param_states(opt_state: Any) -> dict[str, Any]:
    """The ``state/param_states`` part of a T5X state dict for ``opt_state``.

    Adafactor's state becomes upstream's tree of ``{v_row, v_col, v, m}`` per
    parameter. Any other Optax state becomes nested dicts named by its fields
    and positions (``{"0": {"mu": ..., "nu": ...}}``), without empty entries,
    as upstream's Optax wrapper saves it.
    """
    if isinstance(opt_state, AdafactorState):
        opt_state = opt_state.param_states
    return unflatten(flatten_with_paths(opt_state))


def opt_state_from_param_states(template: Any, param_states: Mapping[str, Any], step: Any) -> Any:
    """Inverse of :func:`opt_state_to_param_states`.

    Args:
      template: an optimizer state (arrays or ShapeDtypeStructs) of the wanted
        structure, e.g. ``optimizer.init(params)`` under ``jax.eval_shape``.
      param_states: the ``state/param_states`` dict.
      step: the train step (Adafactor's count).

    Returns:
      An optimizer state like ``template`` holding the values of ``param_states``.

    Raises:
      ValueError: a slot of ``template`` is missing or has another shape.
    """
    is_adafactor = isinstance(template, AdafactorState)
    inner = template.param_states if is_adafactor else template
    flat = _flatten_dict(param_states)
    leaves, treedef = jax.tree_util.tree_flatten_with_path(inner)
    values = []
    for path, leaf in leaves:
        name = path_to_str(path)
        if name not in flat:
            raise ValueError(f"optimizer slot {name!r} is missing from the state dict's param_states")
        value = flat[name]
        if tuple(jax.numpy.shape(value)) != tuple(leaf.shape):
            raise ValueError(
                f"optimizer slot {name!r} has shape {tuple(jnp.shape(value))} in the state dict, "
                f"expected {tuple(leaf.shape)}"
            )
        values.append(value)
    restored = jax.tree_util.tree_unflatten(treedef, values)
    if is_adafactor:
        # A copy: the count must not share a buffer with the step (both get donated).
        return AdafactorState(count=jnp.array(step, jnp.int32, copy=True), param_states=restored)
    return restored


def opt_state_axes(
    opt_state: Any, params: PyTree, params_axes: Mapping[str, tuple[Any, ...]]
) -> dict[str, tuple]:
    """Logical axis names of each optimizer-state leaf, ``{leaf path: names}``.

    A leaf whose path ends with a parameter's path (optionally followed by
    Adafactor's ``v`` or ``m`` slot) and has that parameter's shape gets the
    parameter's names; everything else (counts, factored moments,
    placeholders) gets ``()``, i.e. replicated.
    """
    param_shapes = {path: tuple(leaf.shape) for path, leaf in flatten_with_paths(params).items()}
    axes: dict[str, tuple] = {}
    for path, leaf in flatten_with_paths(opt_state).items():
        parts = path.split("/")
        candidates = [parts]
        if parts[-1] in ("v", "m"):
            candidates.append(parts[:-1])
        found: tuple = ()
        for candidate in candidates:
            for start in range(len(candidate)):
                suffix = "/".join(candidate[start:])
                if param_shapes.get(suffix) == tuple(leaf.shape) and suffix in params_axes:
                    found = tuple(params_axes[suffix])
                    break
            if found:
                break
        axes[path] = found
    return axes


__all__ = [
    "Adafactor",
    "MultiOptimizer",
    "adamw",
    "bind_param_axes",
    "lion",
    "multi_transform",
    "opt_state_axes",
    "opt_state_from_param_states",
    "opt_state_to_param_states",
    "scale_by_learning_rate",
    "sgd",
]
