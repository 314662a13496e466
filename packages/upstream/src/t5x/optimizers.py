"""Upstream t5x's ``t5x.optimizers``: the Flax-style optimizer API over Optax.

``OptimizerDef`` describes an update rule, ``Optimizer`` carries the parameters
(``target``) with the rule's ``OptimizerState``; ``OptaxWrapper`` turns any Optax
``GradientTransformation`` into an ``OptimizerDef`` and the lower-case names
(``adam``, ``sgd``, ...) build wrapped Optax optimizers with Optax's arguments.

t5x-launch trains with Optax transformations: :func:`to_optax` gives the one an
``OptimizerDef`` stands for (the wrapped transformation, T5X Adafactor, or an
adapter that calls ``apply_gradient``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import flax
import flax.struct
import jax
import jax.numpy as jnp
import optax
from flax import traverse_util
from flax.serialization import from_state_dict, to_state_dict

freeze = flax.core.frozen_dict.freeze
unfreeze = flax.core.frozen_dict.unfreeze


@flax.struct.dataclass
class OptimizerState:
    """The step count and the per-parameter state of an optimizer."""

    step: Any
    param_states: Any


class OptimizerDef:
    """An update rule with its hyper parameters (subclasses define the rule)."""

    def __init__(self, hyper_params: Any):
        self.hyper_params = hyper_params

    def init_state(self, params: Any) -> OptimizerState:
        raise NotImplementedError(f"{type(self).__name__} does not define init_state")

    def apply_gradient(self, hyper_params: Any, params: Any, state: Any, grads: Any) -> tuple[Any, Any]:
        """Returns ``(new_params, new_state)`` after one step on ``grads``."""
        raise NotImplementedError(f"{type(self).__name__} does not define apply_gradient")

    def update_hyper_params(self, **overrides: Any) -> Any:
        """The hyper parameters with ``overrides`` applied (``hyper_params=`` replaces them all)."""
        hyper_params = overrides.pop("hyper_params", self.hyper_params)
        if overrides:
            hyper_params = hyper_params.replace(**overrides)
        return hyper_params

    def create(self, target: Any) -> Optimizer:
        """An :class:`Optimizer` holding ``target`` and a fresh state for it."""
        return Optimizer(self, self.init_state(target), target)

    def state_dict(self, target: Any, state: Any) -> dict[str, Any]:
        return to_state_dict({"target": to_state_dict(target), "state": to_state_dict(state)})

    def restore_state(self, opt_target: Any, opt_state: Any, state_dict: Any) -> tuple[Any, Any]:
        """``(target, state)`` shaped like the given ones, holding ``state_dict``'s values."""
        return (
            from_state_dict(opt_target, state_dict["target"]),
            from_state_dict(opt_state, state_dict["state"]),
        )


class Optimizer(flax.struct.PyTreeNode):
    """Parameters (``target``) with their optimizer state and definition."""

    optimizer_def: OptimizerDef = flax.struct.field(pytree_node=False)
    state: Any = flax.struct.field(pytree_node=True)
    target: Any = flax.struct.field(pytree_node=True)

    def apply_gradient(self, grads: Any, **hyper_param_overrides: Any) -> Optimizer:
        """This optimizer after one step on ``grads`` (keywords override hyper parameters)."""
        hyper_params = self.optimizer_def.update_hyper_params(**hyper_param_overrides)
        new_target, new_state = self.optimizer_def.apply_gradient(
            hyper_params, self.target, self.state, grads
        )
        return self.replace(target=new_target, state=new_state)

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer_def.state_dict(self.target, self.state)

    def restore_state(self, state: Any) -> Optimizer:
        target, new_state = self.optimizer_def.restore_state(self.target, self.state, state)
        return self.replace(target=target, state=new_state)


OptimizerType = Optimizer
OptimizerStateType = OptimizerState | dict
OptimizerDefType = OptimizerDef


# --- Optax states' logical axes ---------------------------------------------


def _is_optax_state(x: Any) -> bool:
    # Optax states are NamedTuples named ...State.
    return isinstance(x, tuple) and hasattr(x, "_fields") and type(x).__name__.endswith("State")


def _params_like_axes(value: Any, params_def: Any, param_axes: Any) -> Any:
    """``param_axes`` if ``value`` mirrors the params (masked leaves kept), else None."""
    try:
        slots = params_def.flatten_up_to(value)
    except (ValueError, TypeError):
        return None
    axes = params_def.flatten_up_to(param_axes)
    if not all(isinstance(s, optax.MaskedNode) or hasattr(s, "shape") for s in slots):
        return None
    return params_def.unflatten(
        [s if isinstance(s, optax.MaskedNode) else a for s, a in zip(slots, axes, strict=True)]
    )


def derive_optax_logical_axes(optax_state: Any, params: Any, param_axes: Any) -> Any:
    """The logical axes of an Optax state: params-shaped slots take the params' axes, others None."""
    params_def = jax.tree.structure(params)

    def derive(node: Any) -> Any:
        mirrored = _params_like_axes(node, params_def, param_axes)
        if mirrored is not None:
            return mirrored
        if _is_optax_state(node):
            return type(node)(*(derive(getattr(node, f)) for f in node._fields))
        if isinstance(node, (tuple, list)):
            return type(node)(derive(x) for x in node)
        if isinstance(node, dict | flax.core.FrozenDict):
            return type(node)({k: derive(v) for k, v in node.items()})
        return None

    return derive(optax_state)


@flax.struct.dataclass
class _OptaxWrapperHyperParams:
    """Only ``learning_rate`` (which the trainer sets; Optax schedules do the work)."""

    learning_rate: float | None = None


class OptaxWrapper(OptimizerDef):
    """An Optax ``GradientTransformation`` as an :class:`OptimizerDef`."""

    def __init__(self, optax_optimizer: optax.GradientTransformation):
        self.optax_optimizer = optax_optimizer
        super().__init__(hyper_params=_OptaxWrapperHyperParams())

    def init_state(self, params: Any) -> OptimizerState:
        return OptimizerState(step=0, param_states=self.optax_optimizer.init(params))

    def apply_gradient(self, hyper_params: Any, params: Any, state: Any, grads: Any) -> tuple[Any, Any]:
        del hyper_params  # Optax transformations schedule their own learning rate
        updates, new_optax_state = self.optax_optimizer.update(grads, state.param_states, params)
        return optax.apply_updates(params, updates), OptimizerState(
            step=state.step + 1, param_states=new_optax_state
        )

    def derive_logical_axes(self, optimizer: Optimizer, param_logical_axes: Any) -> Optimizer:
        """``optimizer`` with every array replaced by its logical axes (None: replicated)."""
        param_states = derive_optax_logical_axes(
            optimizer.state.param_states, optimizer.target, param_logical_axes
        )
        return Optimizer(
            optimizer.optimizer_def,
            OptimizerState(step=None, param_states=param_states),
            param_logical_axes,
        )

    def state_dict(self, target: Any, state: Any) -> dict[str, Any]:
        # Optax's EmptyState serialises as {}; checkpoints leave those out.
        state_dict = to_state_dict(state)
        state_dict = traverse_util.unflatten_dict(traverse_util.flatten_dict(state_dict, sep="/"), sep="/")
        return to_state_dict({"target": to_state_dict(target), "state": state_dict})

    def restore_state(self, opt_target: Any, opt_state: Any, state_dict: Any) -> tuple[Any, Any]:
        opt_target = from_state_dict(opt_target, state_dict["target"])
        wanted = traverse_util.flatten_dict(to_state_dict(opt_state), keep_empty_nodes=True, sep="/")
        given = dict(traverse_util.flatten_dict(state_dict["state"], sep="/"))
        for path, value in wanted.items():
            if path in given:
                continue
            if value is not traverse_util.empty_node:
                raise ValueError(
                    f"cannot restore the optimizer state: the state dict has no {path!r} "
                    f"(it has {sorted(given)})"
                )
            given[path] = value  # an EmptyState the state dict left out
        return opt_target, from_state_dict(opt_state, traverse_util.unflatten_dict(given, sep="/"))


def wrap_optax_optimizer(
    optax_optimizer: Callable[..., optax.GradientTransformation],
) -> Callable[..., OptaxWrapper]:
    """``optax_optimizer``'s constructor, returning an :class:`OptaxWrapper`."""

    @functools.wraps(optax_optimizer)
    def wrapped(*args: Any, **kwargs: Any) -> OptaxWrapper:
        return OptaxWrapper(optax_optimizer(*args, **kwargs))

    return wrapped


def _chain(transformations: Sequence[optax.GradientTransformation]) -> optax.GradientTransformation:
    return optax.chain(*transformations)


chain = wrap_optax_optimizer(_chain)
adabelief = wrap_optax_optimizer(optax.adabelief)
adagrad = wrap_optax_optimizer(optax.adagrad)
adam = wrap_optax_optimizer(optax.adam)
adamw = wrap_optax_optimizer(optax.adamw)
fromage = wrap_optax_optimizer(optax.fromage)
lars = wrap_optax_optimizer(optax.lars)
lamb = wrap_optax_optimizer(optax.lamb)
lion = wrap_optax_optimizer(optax.lion)
noisy_sgd = wrap_optax_optimizer(optax.noisy_sgd)
radam = wrap_optax_optimizer(optax.radam)
rmsprop = wrap_optax_optimizer(optax.rmsprop)
sgd = wrap_optax_optimizer(optax.sgd)
yogi = wrap_optax_optimizer(optax.yogi)
dpsgd = wrap_optax_optimizer(optax.contrib.dpsgd)  # optax moved it to contrib


# --- MultiOptimizer -----------------------------------------------------------


class _Unclaimed:
    """A leaf no sub-optimizer has claimed (yet); holds the claiming indices."""

    def __init__(self) -> None:
        self.claims: list[int] = []


def _path_tree(tree: Any) -> Any:
    flat = traverse_util.flatten_dict(unfreeze(tree))
    paths = traverse_util.unflatten_dict({k: "/".join(k) for k in flat})
    return freeze(paths) if isinstance(tree, flax.core.FrozenDict) else paths


def _select(traversal: Any, tree: Any) -> Any:
    """The sub-tree of ``tree`` that ``traversal`` visits."""
    picked = {
        tuple(path.split("/")): leaf
        for path, leaf in zip(traversal.iterate(_path_tree(tree)), traversal.iterate(tree), strict=True)
    }
    sub = traverse_util.unflatten_dict(picked)
    return freeze(sub) if isinstance(tree, flax.core.FrozenDict) else sub


def _merge(traversal: Any, tree: Any, update: Any) -> Any:
    """``tree`` with the leaves ``traversal`` visits in ``update`` replaced."""
    flat = {"/".join(k): v for k, v in traverse_util.flatten_dict(unfreeze(tree)).items()}
    for path, leaf in zip(traversal.iterate(_path_tree(update)), traversal.iterate(update), strict=True):
        flat[path] = leaf
    merged = traverse_util.unflatten_dict({tuple(k.split("/")): v for k, v in flat.items()})
    return freeze(merged) if isinstance(tree, flax.core.FrozenDict) else merged


def _unclaimed_to_none(tree: Any) -> Any:
    return jax.tree.map(lambda x: None if isinstance(x, _Unclaimed) else x, tree)


class MultiOptimizer(OptimizerDef):
    """Different optimizer definitions for the parameter subsets Flax traversals pick.

    Args:
      traversals_and_optimizers: ``(flax.traverse_util.Traversal, OptimizerDef)``
        pairs; no parameter may be picked twice. Parameters no traversal picks
        are not updated (their state is None).
    """

    def __init__(self, traversals_and_optimizers: Sequence[tuple[Any, OptimizerDef]]):
        traversals, sub_optimizers = zip(*traversals_and_optimizers, strict=True)
        super().__init__([opt.hyper_params for opt in sub_optimizers])
        self.traversals = traversals
        self.sub_optimizers = sub_optimizers

    def init_state(self, params: Any) -> OptimizerState:
        claims = jax.tree.map(lambda _: _Unclaimed(), params)
        for index, traversal in enumerate(self.traversals):
            for marker in traversal.iterate(claims):
                marker.claims.append(index)
        twice = {
            "/".join(str(getattr(k, "key", k)) for k in path): marker.claims
            for path, marker in jax.tree_util.tree_leaves_with_path(claims)
            if len(marker.claims) > 1
        }
        if twice:
            raise ValueError(f"MultiOptimizer: parameters picked by more than one optimizer: {twice}")
        states = jax.tree.map(lambda _: _Unclaimed(), params)
        for traversal, opt_def in zip(self.traversals, self.sub_optimizers, strict=True):
            sub_state = opt_def.init_state(_select(traversal, params))
            states = _merge(traversal, states, sub_state.param_states)
        return OptimizerState(jnp.asarray(0, dtype=jnp.int32), _unclaimed_to_none(states))

    def apply_gradient(self, hyper_params: Any, params: Any, state: Any, grads: Any) -> tuple[Any, Any]:
        new_params = params
        new_states = jax.tree.map(lambda _: _Unclaimed(), params)
        for traversal, opt_def, hp in zip(self.traversals, self.sub_optimizers, hyper_params, strict=True):
            sub_state = OptimizerState(state.step, _select(traversal, state.param_states))
            sub_params, sub_state = opt_def.apply_gradient(
                hp, _select(traversal, params), sub_state, _select(traversal, grads)
            )
            new_params = _merge(traversal, new_params, sub_params)
            new_states = _merge(traversal, new_states, sub_state.param_states)
        return new_params, OptimizerState(state.step + 1, _unclaimed_to_none(new_states))

    def update_hyper_params(self, **overrides: Any) -> Any:
        """Each sub-optimizer's hyper parameters with ``overrides`` applied."""
        hyper_params = overrides.pop("hyper_params", self.hyper_params)
        if overrides:
            hyper_params = [hp.replace(**overrides) for hp in hyper_params]
        return hyper_params

    def set_param_axes(self, param_logical_axes: Any) -> None:
        for traversal, opt_def in zip(self.traversals, self.sub_optimizers, strict=True):
            if hasattr(opt_def, "set_param_axes"):
                opt_def.set_param_axes(_select(traversal, param_logical_axes))

    def derive_logical_axes(self, optimizer: Optimizer, param_logical_axes: Any) -> Optimizer:
        states = jax.tree.map(lambda _: _Unclaimed(), optimizer.state.param_states)
        for traversal, opt_def in zip(self.traversals, self.sub_optimizers, strict=True):
            if not hasattr(opt_def, "derive_logical_axes"):
                continue
            sub_axes = _select(traversal, param_logical_axes)
            sub = Optimizer(
                opt_def,
                OptimizerState(None, _select(traversal, optimizer.state.param_states)),
                _select(traversal, optimizer.target),
            )
            derived = opt_def.derive_logical_axes(sub, sub_axes)
            states = _merge(traversal, states, derived.state.param_states)
        return Optimizer(
            optimizer.optimizer_def, OptimizerState(None, _unclaimed_to_none(states)), param_logical_axes
        )


# --- to Optax, for t5x-launch ------------------------------------------------


class _OptimizerDefTransformation(optax.GradientTransformationExtraArgs):
    """An OptimizerDef run as an Optax transformation (state: its OptimizerState)."""


def _as_transformation(opt_def: OptimizerDef) -> optax.GradientTransformationExtraArgs:
    def init_fn(params: Any) -> OptimizerState:
        state = opt_def.init_state(params)
        return OptimizerState(jnp.asarray(state.step, jnp.int32), state.param_states)

    def update_fn(grads: Any, state: Any, params: Any = None, **extra: Any) -> tuple[Any, Any]:
        if params is None:
            raise ValueError(f"{type(opt_def).__name__} needs params in update(grads, state, params)")
        overrides = {}
        if extra.get("learning_rate") is not None:
            overrides["learning_rate"] = extra["learning_rate"]
        hyper_params = opt_def.update_hyper_params(**overrides)
        new_params, new_state = opt_def.apply_gradient(hyper_params, params, state, grads)
        updates = jax.tree.map(lambda new, old: new - old, new_params, params)
        return updates, new_state

    return _OptimizerDefTransformation(init_fn, update_fn)


def to_optax(optimizer: Any) -> Any:
    """The Optax transformation t5x-launch trains with for ``optimizer``.

    ``OptaxWrapper`` gives its transformation, an OptimizerDef with an
    ``as_optax`` method (T5X Adafactor) gives that, any other OptimizerDef an
    adapter calling its ``apply_gradient``; anything else (None, an Optax
    transformation) is returned as it is.
    """
    if isinstance(optimizer, OptaxWrapper):
        return optimizer.optax_optimizer
    if hasattr(optimizer, "as_optax"):
        return optimizer.as_optax()
    if isinstance(optimizer, OptimizerDef):
        return _as_transformation(optimizer)
    return optimizer


__all__ = [
    "MultiOptimizer",
    "OptaxWrapper",
    "Optimizer",
    "OptimizerDef",
    "OptimizerDefType",
    "OptimizerState",
    "OptimizerStateType",
    "OptimizerType",
    "adabelief",
    "adagrad",
    "adam",
    "adamw",
    "chain",
    "derive_optax_logical_axes",
    "dpsgd",
    "fromage",
    "lamb",
    "lars",
    "lion",
    "noisy_sgd",
    "radam",
    "rmsprop",
    "sgd",
    "to_optax",
    "wrap_optax_optimizer",
    "yogi",
]
