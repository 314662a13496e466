"""The Trainer: partitioned train and eval steps with gradient accumulation."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from t5x.interfaces import Model, Partitioner
from t5x.training._init import batch_logical_axes, batch_shardings, sharding_for
from t5x.training._train_state import TrainState

SUMMED_METRICS = frozenset(
    {
        "loss",
        "z_loss",
        "cross_ent_loss",
        "weight_sum",
        "num_tokens",
        "num_target_tokens",
        "num_examples",
        "nonpadding_tokens",
    }
)
"""Metrics added up over microbatches (like the loss, whose gradient is summed);
all others are averaged."""

DEFAULT_TOKEN_FEATURES = ("encoder_input_tokens", "decoder_target_tokens")


def count_tokens(batch: Mapping[str, Any], token_features: Sequence[str] = DEFAULT_TOKEN_FEATURES) -> int:
    """Token positions in a batch: the sizes of the input and target features.

    Falls back to the largest 2-D feature when none of ``token_features`` exists.
    """
    present = [k for k in token_features if k in batch]
    if present:
        return int(sum(math.prod(np.shape(batch[k])[:2]) for k in present))
    sizes = [math.prod(np.shape(v)[:2]) for v in batch.values() if np.ndim(v) == 2]
    return int(max(sizes)) if sizes else 0


class Trainer:
    """Runs partitioned train and eval steps for a Model.

    The train step is one ``jit`` program (through the Partitioner) that
    computes the gradient — summed over ``num_microbatches`` slices of the
    batch, as upstream t5x does, so a model whose loss sums over tokens gets
    the gradient of the whole batch — applies the optimizer with the step's
    learning rate and returns the new state; the input state's buffers are
    donated. Dropout randomness is ``fold_in(PRNGKey(seed), step)``, so a
    resumed run draws exactly what an uninterrupted one would.

    Args:
      model: the Model.
      partitioner: compiles the steps and places batches.
      state: the initial TrainState (placed with ``state_shardings``).
      state_shardings: a TrainState of shardings (``init_train_state`` gives it).
      learning_rate_fn: step -> learning rate, passed to the optimizer; None to
        let the optimizer use its own.
      num_microbatches: gradient accumulation; None or 1 for none.
      seed: the dropout seed.
      peak_flops: the machine's FLOP/s for MFU (None: no MFU metric).
      token_features: features whose positions count as tokens.
      summed_metrics: metric names added (not averaged) over microbatches.
    """

    def __init__(
        self,
        model: Model,
        partitioner: Partitioner,
        state: TrainState,
        state_shardings: TrainState,
        *,
        learning_rate_fn: Callable[[Any], Any] | None = None,
        num_microbatches: int | None = None,
        seed: int = 0,
        peak_flops: float | None = None,
        token_features: Sequence[str] = DEFAULT_TOKEN_FEATURES,
        summed_metrics: frozenset[str] = SUMMED_METRICS,
    ):
        if num_microbatches is not None and num_microbatches < 1:
            raise ValueError(f"num_microbatches must be >= 1 or None, got {num_microbatches}")
        self.model = model
        self.partitioner = partitioner
        self.state = state
        self.state_shardings = state_shardings
        self.learning_rate_fn = learning_rate_fn
        self.num_microbatches = num_microbatches or 1
        self.seed = seed
        self.peak_flops = peak_flops
        self.token_features = tuple(token_features)
        self.summed_metrics = frozenset(summed_metrics)
        self._train_steps: dict[Any, Callable[..., Any]] = {}
        self._eval_steps: dict[Any, Callable[..., Any]] = {}
        self._flops_per_token: float | None = None

    # ---- the programs -------------------------------------------------------------

    def _grads_and_metrics(
        self, params: Any, batch: Mapping[str, Any], rng: Any, shardings: Any
    ) -> tuple[Any, dict]:
        grad_fn = jax.value_and_grad(self.model.loss_fn, has_aux=True)

        def one(mbatch: Mapping[str, Any], sub_rng: Any) -> tuple[Any, dict]:
            (loss, metrics), grads = grad_fn(params, mbatch, sub_rng)
            metrics = dict(metrics)
            metrics.setdefault("loss", loss)
            return grads, metrics

        n = self.num_microbatches
        if n == 1:
            return one(batch, rng)
        batch_size = next(iter(batch.values())).shape[0]
        if batch_size % n:
            raise ValueError(f"batch size {batch_size} is not divisible by num_microbatches={n}")
        size = batch_size // n
        for key, value in batch.items():
            try:
                shardings[key].shard_shape((size, *value.shape[1:]))
            except ValueError:
                raise ValueError(
                    f"microbatches of {size} rows (batch {batch_size} / num_microbatches {n}) cannot be split "
                    f"over the data-parallel devices of feature {key!r} (sharding {shardings[key]}); use a "
                    "batch size that is a multiple of num_microbatches x the data-parallel size"
                ) from None

        def microbatch(i: Any) -> dict[str, Any]:
            sliced = {k: jax.lax.dynamic_slice_in_dim(v, i * size, size, axis=0) for k, v in batch.items()}
            return {k: jax.lax.with_sharding_constraint(v, shardings[k]) for k, v in sliced.items()}

        def body(i: Any, carry: tuple) -> tuple:
            loop_rng, grad_sum, metric_sum = carry
            loop_rng, sub_rng = jax.random.split(loop_rng)
            grads, metrics = one(microbatch(i), sub_rng)
            grad_sum = jax.tree.map(lambda a, g: a + g.astype(jnp.float32), grad_sum, grads)
            metric_sum = {k: metric_sum[k] + jnp.asarray(v, jnp.float32) for k, v in metrics.items()}
            return loop_rng, grad_sum, metric_sum

        metric_shapes = jax.eval_shape(lambda: one(microbatch(0), rng)[1])
        zeros_metrics = {k: jnp.zeros(v.shape, jnp.float32) for k, v in metric_shapes.items()}
        zeros_grads = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params)
        _, grads, metrics = jax.lax.fori_loop(0, n, body, (rng, zeros_grads, zeros_metrics))
        metrics = {k: v if k in self.summed_metrics else v / n for k, v in metrics.items()}
        return grads, metrics

    def _build_train_step(self, batch: Mapping[str, Any]) -> Callable[..., Any]:
        shardings = batch_shardings(self.partitioner, batch)
        base_rng = jax.random.PRNGKey(self.seed)

        def train_step(state: TrainState, batch: Mapping[str, Any]) -> tuple[TrainState, dict]:
            rng = jax.random.fold_in(base_rng, state.step)
            grads, metrics = self._grads_and_metrics(state.params, batch, rng, shardings)
            lr = (
                None
                if self.learning_rate_fn is None
                else jnp.asarray(self.learning_rate_fn(state.step), jnp.float32)
            )
            new_state = state.apply_gradient(grads, learning_rate=lr)
            metrics = {k: jnp.asarray(v, jnp.float32) for k, v in metrics.items()}
            metrics["grad_norm"] = optax.tree.norm(grads)
            if lr is not None:
                metrics["learning_rate"] = lr
            return new_state, metrics

        replicated = sharding_for(self.partitioner, ())
        return self.partitioner.partition(
            train_step,
            in_shardings=(self.state_shardings, shardings),
            out_shardings=(self.state_shardings, replicated),
            donate_argnums=(0,),
        )

    def _build_eval_step(self, batch: Mapping[str, Any]) -> Callable[..., Any]:
        shardings = batch_shardings(self.partitioner, batch)

        def eval_step(params: Any, batch: Mapping[str, Any]) -> dict:
            loss, metrics = self.model.eval_fn(params, batch)
            metrics = dict(metrics)
            metrics.setdefault("loss", loss)
            return {k: jnp.asarray(v, jnp.float32) for k, v in metrics.items()}

        return self.partitioner.partition(
            eval_step,
            in_shardings=(self.state_shardings.params, shardings),
            out_shardings=sharding_for(self.partitioner, ()),
        )

    # ---- running ------------------------------------------------------------------

    def to_global(self, batch: Mapping[str, np.ndarray]) -> dict[str, Any]:
        """This process's numpy batch as global arrays on the mesh."""
        return self.partitioner.host_local_to_global(dict(batch), batch_logical_axes(batch))

    @staticmethod
    def _key(batch: Mapping[str, Any]) -> tuple:
        return tuple(sorted((k, tuple(v.shape), str(v.dtype)) for k, v in batch.items()))

    def train_step(self, batch: Mapping[str, np.ndarray]) -> dict[str, Any]:
        """Runs one step on this process's part of a batch; updates ``self.state``.

        Returns:
          Scalar metrics as device arrays: the model's (``loss``, ...),
          ``grad_norm`` and ``learning_rate``.
        """
        global_batch = self.to_global(batch)
        key = self._key(global_batch)
        if key not in self._train_steps:
            self._train_steps[key] = self._build_train_step(global_batch)
        self.state, metrics = self._train_steps[key](self.state, global_batch)
        return metrics

    def eval_step(self, batch: Mapping[str, np.ndarray]) -> dict[str, Any]:
        """The model's eval metrics on one batch (no dropout, no update)."""
        global_batch = self.to_global(batch)
        key = self._key(global_batch)
        if key not in self._eval_steps:
            self._eval_steps[key] = self._build_eval_step(global_batch)
        return self._eval_steps[key](self.state.params, global_batch)

    def throughput_metrics(
        self, global_batch_shapes: Mapping[str, tuple[int, ...]], steps: int, seconds: float
    ) -> dict[str, float]:
        """Timing metrics for ``steps`` steps of batches of these global shapes.

        Returns:
          ``steps_per_second``, ``sequences_per_second``, ``tokens_per_second``
          and, with ``peak_flops``, ``mfu`` (model FLOPs / peak FLOPs).
        """
        if seconds <= 0 or steps <= 0:
            return {}
        shapes = {k: np.empty(s, np.int8) for k, s in global_batch_shapes.items()}
        batch_size = next(iter(global_batch_shapes.values()))[0]
        tokens = count_tokens(shapes, self.token_features) * steps / seconds
        out = {
            "timing/steps_per_second": steps / seconds,
            "timing/sequences_per_second": batch_size * steps / seconds,
            "timing/tokens_per_second": tokens,
        }
        if self.peak_flops:
            if self._flops_per_token is None:
                lengths = {k: int(s[1]) for k, s in global_batch_shapes.items() if len(s) == 2}
                self._flops_per_token = float(self.model.flops_per_token(lengths))
            out["timing/mfu"] = tokens * self._flops_per_token / self.peak_flops
        return out


def measure_peak_flops(size: int = 2048, repeats: int = 3) -> float:
    """The FLOP/s of a large float32 matmul under XLA on the default device.

    This is the "practical peak" of docs/benchmarks.md's MFU convention on CPU.
    """
    a = jnp.ones((size, size), jnp.float32)
    matmul = jax.jit(lambda x: x @ x)
    matmul(a).block_until_ready()
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        matmul(a).block_until_ready()
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best


__all__ = ["SUMMED_METRICS", "Trainer", "count_tokens", "measure_peak_flops"]
