"""The Model contract: losses, scoring and prediction over parameters."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

from t5x.interfaces._values import PyTree


@runtime_checkable
class Model(Protocol):
    """A trainable model, as the trainer, evaluator and launcher see it.

    All methods are pure functions of their arguments, so they can run under
    ``jax.jit``. ``params`` is a nested dict whose paths are the parameter names
    saved in checkpoints (``encoder/layers_0/attention/query/kernel``, without a
    ``target/`` prefix). ``batch`` is a dict of arrays named like the model
    features of ``feature_converter_cls`` (``[batch, length]`` each).

    Attributes:
      feature_converter_cls: the FeatureConverter class whose outputs this model
        consumes; the launcher builds the data pipeline with it.
    """

    feature_converter_cls: Callable[..., Any]

    def get_initial_variables(
        self,
        rng: Any,
        input_shapes: Mapping[str, tuple[int, ...]],
        input_types: Mapping[str, Any] | None = None,
    ) -> Mapping[str, PyTree]:
        """Initialises the variables for batches of the given feature shapes.

        Returns:
          Flax-style variable collections: ``"params"`` and, where the model names
          them, ``"params_axes"`` (logical axis names of each parameter).
        """
        ...

    def loss_fn(
        self, params: PyTree, batch: Mapping[str, Any], dropout_rng: Any
    ) -> tuple[Any, dict[str, Any]]:
        """Returns the scalar training loss and a dict of scalar metrics.

        ``dropout_rng`` of None means deterministic (no dropout).
        """
        ...

    def eval_fn(self, params: PyTree, batch: Mapping[str, Any]) -> tuple[Any, dict[str, Any]]:
        """Returns the scalar loss and metrics without dropout."""
        ...

    def score_batch(
        self, params: PyTree, batch: Mapping[str, Any], return_intermediates: bool = False
    ) -> Any:
        """Returns the log-likelihood of each sequence's targets, ``[batch]``."""
        ...

    def predict_batch_with_aux(
        self, params: PyTree, batch: Mapping[str, Any], rng: Any = None, **decode_kwargs: Any
    ) -> tuple[Any, dict[str, Any]]:
        """Decodes a batch.

        Returns:
          ``(predictions [batch, length], aux)``; ``aux`` holds at least
          ``"scores"`` (``[batch]`` log-probabilities of the predictions).
        """
        ...

    def flops_per_token(self, model_feature_lengths: Mapping[str, int]) -> float:
        """Training FLOPs per token (forward + backward, PaLM convention).

        A token is one position of any input or target feature, so that
        ``tokens/s * flops_per_token`` is the model FLOP rate.
        """
        ...
