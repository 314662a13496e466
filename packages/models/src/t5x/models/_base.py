"""``BaseModel``: upstream t5x's model contract, which both model classes implement.

Upstream code type-checks against it, subclasses it for custom models, and
autospecs it in tests; ``predict_batch`` and ``eval_fn`` follow from the rest.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from typing import Any

import jax

PyTree = Any


class BaseModel(abc.ABC):
    """What a trainer, evaluator or inference job calls on a model."""

    @abc.abstractmethod
    def loss_fn(
        self, params: PyTree, batch: Mapping[str, Any], dropout_rng: Any
    ) -> tuple[jax.Array, dict[str, Any]]:
        """``(loss, metrics)`` of one batch; dropout only with ``dropout_rng``."""

    def eval_fn(self, params: PyTree, batch: Mapping[str, Any]) -> tuple[jax.Array, dict[str, Any]]:
        """``loss_fn`` without dropout."""
        return self.loss_fn(params, batch, None)

    def predict_batch(self, params: PyTree, batch: Mapping[str, Any], rng: Any = None) -> jax.Array:
        """The decoded ids of ``batch`` (``predict_batch_with_aux`` without its aux)."""
        return self.predict_batch_with_aux(params, batch, rng=rng)[0]

    @abc.abstractmethod
    def predict_batch_with_aux(
        self, params: PyTree, batch: Mapping[str, Any], rng: Any = None, decoder_params: Any = None
    ) -> tuple[jax.Array, Mapping[str, Any]]:
        """``(decoded ids, aux)`` of ``batch``."""

    @abc.abstractmethod
    def score_batch(
        self, params: PyTree, batch: Mapping[str, Any], return_intermediates: bool = False
    ) -> Any:
        """The log-likelihood of each example's targets."""

    @abc.abstractmethod
    def get_initial_variables(
        self, rng: Any, input_shapes: Mapping[str, Any], input_types: Mapping[str, Any] | None = None
    ) -> PyTree:
        """Fresh variables for batches of ``input_shapes`` (and ``input_types``)."""
